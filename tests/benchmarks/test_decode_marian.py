"""benchmarks/decode_marian.py: the --quick run end to end (the JSON keys, every system
decoding exactly 30 steps, the same-model check passing), the check failing on a wrong model
and on unmapped ids, and the direction of the ratios. No timing is asserted."""

from __future__ import annotations

import argparse
import json
import os
import types
from pathlib import Path

import pytest
from benchmark_testkit import load_benchmark

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing from a hub
pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
pytest.importorskip("sentencepiece")

import torch

FIGURES = ("beam4_b32", "greedy_b32", "beam4_b1_latency", "greedy_b1_latency")
KEYS = [f"opus_{figure}_vs_{other}" for other in ("hf", "ct2") for figure in FIGURES]
FIGURE_KEYS = ("greedy_b32", "beam4_b32", "greedy_b1", "beam4_b1")


def _module() -> types.ModuleType:
    """The benchmark script as a module."""
    return load_benchmark("decode_marian")


def test_quick_run_prints_the_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    dm = _module()
    out = dm.main(["--quick", "--threads", "1", "--settle", "0"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == out
    assert all(isinstance(out[k], float) and out[k] > 0 for k in KEYS)
    assert out["quick"] is True and out["size"] == dm.SIZES["quick"]
    assert max(out["check_max_abs_diff"].values()) <= dm.CHECK_TOL
    assert out["ct2_torch_imported"] is False
    assert set(out["seconds"]) == {"transduce", "hf", "ct2"}


def test_quick_int8_run_checks_and_times_both_int8_systems() -> None:
    # the OPUS-MT deployment case: our int8 against CTranslate2's int8 on the same folder
    dm = _module()
    out = dm.main(["--quick", "--int8", "--threads", "1", "--settle", "0"])
    assert set(out["seconds"]) == {"transduce", "transduce_int8", "hf", "ct2", "ct2_int8"}
    for key in (f"opus_{f}_int8_vs_{o}" for o in ("ct2_int8", "fp32") for f in FIGURES):
        assert isinstance(out[key], float) and out[key] > 0, key
    diffs = out["check_max_abs_diff"]
    # int8 is close to the model, not equal; CTranslate2's int8 within decode.py's tolerance
    assert 0 < diffs["transduce_int8"] <= dm.INT8_CHECK_TOL
    assert 0 < diffs["ct2_int8"] <= dm.ct2_int8_tol()
    # each CTranslate2 system's ISA and backends in the JSON, int8 too
    assert set(out["ct2_int8_backend"]) == set(out["ct2_backend"]) == set(FIGURE_KEYS)
    assert out["ct2_int8_isa"] == out["ct2_isa"] and out["ct2_int8_backend_seconds"]
    assert diffs["ct2"] <= dm.CHECK_TOL


def test_a_ctranslate2_backend_off_the_model_is_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dm = _module()

    class Worker:  # a started worker's first answer and close
        def __init__(self, log_probs: list[float]) -> None:
            self.info, self.closed = {"check_log_probs": log_probs}, False

        def close(self) -> None:
            self.closed = True

    ref = [-1.0, -2.0]
    off, on = Worker([-1.0, -3.0]), Worker([-1.0, -2.0])
    monkeypatch.setattr(dm.decode, "start_ct2", lambda *a: ("AVX512", {"mkl": off, "dnnl": on}))
    args = argparse.Namespace()
    isa, servers = dm.start_ct2(Path("ct2"), [["a"]], ["b"], ref, args)
    assert (isa, list(servers)) == ("AVX512", ["dnnl"]) and off.closed and not on.closed
    assert "mkl left out" in capsys.readouterr().err
    assert servers["dnnl"].info["check_max_abs_diff"] == 0.0
    off = Worker([-1.0, -3.0])
    monkeypatch.setattr(dm.decode, "start_ct2", lambda *a: ("AVX512", {"mkl": off}))
    with pytest.raises(RuntimeError, match="does not compute"):
        dm.start_ct2(Path("ct2"), [["a"]], ["b"], ref, args)
    assert off.closed


def test_the_check_fails_on_a_wrong_model_or_unmapped_ids(tmp_path: Path) -> None:
    dm = _module()
    size = dm.SIZES["quick"]
    folder = dm.make_folder(tmp_path / "opus-mt", size)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == size["vocab"] and (vocab["</s>"], vocab["<unk>"]) == (0, 1)
    assert vocab["<pad>"] == size["vocab"] - 1
    systems = dm.load_systems(folder, tmp_path / "model.pt")
    assert len(systems.our_ids) == size["vocab"] + 1  # the import adds a BOS row
    sources, target = dm.draw_pieces(systems)
    ref = dm.ours_log_probs(systems, sources[0], target)
    assert len(ref) == len(target) + 1
    assert dm.max_diff("hf", dm.hf_log_probs(systems, sources[0], target), ref) <= dm.CHECK_TOL

    ct2 = pytest.importorskip("ctranslate2")
    translator = ct2.Translator(str(dm.convert_ct2(folder, tmp_path / "ct2")), device="cpu")
    scored = translator.score_batch([[*sources[0], "</s>"]], [target])[0].log_probs
    assert dm.max_diff("ct2", list(scored), ref) <= dm.CHECK_TOL

    # transduce fed Marian's ids (no mapping): the check fails
    unmapped = dm.Systems(systems.ours, systems.hf, systems.marian_ids, systems.marian_ids)
    with pytest.raises(RuntimeError, match="does not compute"):
        dm.max_diff(
            "hf",
            dm.hf_log_probs(systems, sources[0], target),
            dm.ours_log_probs(unmapped, sources[0], target),
        )
    # one weight changed on the Hugging Face side (one feature: a shift of all of them would
    # vanish in the layer norm after it): the check fails
    with torch.no_grad():
        systems.hf.model.decoder.layers[-1].fc2.bias[0] += 0.1
    with pytest.raises(RuntimeError, match="does not compute"):
        dm.max_diff("hf", dm.hf_log_probs(systems, sources[0], target), ref)


def test_ratios_are_ours_faster_above_one_and_latency_ours_over_theirs() -> None:
    dm = _module()
    ours = {"greedy_b32": 1.0, "beam4_b32": 2.0, "greedy_b1": 0.1, "beam4_b1": 0.2}
    slower = {k: 2 * v for k, v in ours.items()}
    out = dm.ratios({"transduce": ours, "hf": slower, "ct2": ours})
    assert sorted(out) == sorted(KEYS)
    assert out["opus_beam4_b32_vs_hf"] == 2.0 and out["opus_greedy_b32_vs_hf"] == 2.0
    assert out["opus_beam4_b1_latency_vs_hf"] == 0.5 and out["opus_greedy_b1_latency_vs_hf"] == 0.5
    assert all(out[k] == 1.0 for k in KEYS if k.endswith("ct2"))
    # timed in the same rounds: the median of the rounds' ratios (2, 2, 8 -> 2), not of the
    # figures (the medians, 1 against 8 here, would say 8)
    ours |= {"beam4_b32": 1.0, "beam4_b32_times": [1.0, 1.0, 4.0]}
    them = ours | {"beam4_b32": 8.0, "beam4_b32_times": [2.0, 8.0, 8.0]}
    out = dm.ratios({"transduce": ours, "hf": them, "ct2": ours})
    assert out["opus_beam4_b32_vs_hf"] == 2.0

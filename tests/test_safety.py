"""Safe model files: every file transduce writes holds tensors and plain data only and is read
with ``torch.load(weights_only=True)``; a file carrying a pickled payload is refused by every entry
point (exit 2, one line, the payload never runs); files of the old format are refused with the
remedy named, and ``transduce convert OLD NEW --trust`` rewrites them."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from inference_testkit import save_toy_translation_model, toy_sentences

from transduce import checkpoint
from transduce.cli.main import main
from transduce.config import Config, update
from transduce.data.synthetic import make_task
from transduce.errors import UserError
from transduce.inference.translator import Translator
from transduce.model.transformer import make_model
from transduce.training.tasks.synthetic import encode_pairs
from transduce.training.trainer import Trainer

SRC = Path(__file__).resolve().parents[1] / "src" / "transduce"


class Payload:
    """Unpickling this runs a shell command that creates ``marker``: what a malicious model file
    would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _evil_copy(good: Path, evil: Path, marker: Path) -> Path:
    """``good`` (a file in the safe format) with a payload added beside its model."""
    data = torch.load(good, weights_only=True)
    data["notes"] = Payload(marker)
    torch.save(data, evil)
    return evil


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["--no-malloc-tuning", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, err: str, *names: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("transduce: error: ")
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("safety")
    good = save_toy_translation_model(d / "good.pt", {"beam": 2})
    marker = d / "MARKER"
    evil = _evil_copy(good, d / "evil.pt", marker)
    (d / "in.txt").write_text("the dog runs\na cat\n")
    (d / "ref.txt").write_text("der hund\neine katze\n")
    return {"dir": d, "good": good, "evil": evil, "marker": marker}


def test_the_payload_is_real(files, tmp_path: Path) -> None:
    """The fixture is a working exploit: the general unpickler runs it (and transduce does not)."""
    marker = tmp_path / "RAN"
    evil = _evil_copy(files["good"], tmp_path / "evil.pt", marker)
    torch.load(evil, weights_only=False)
    assert marker.exists()


ENTRY_POINTS = {
    "translate": lambda f, d: [
        "translate",
        "--model",
        str(f["evil"]),
        "--input",
        str(d / "in.txt"),
        "--output",
        str(d / "out.txt"),
    ],
    "evaluate": lambda f, d: [
        "evaluate",
        "--model",
        str(f["evil"]),
        "--src",
        str(d / "in.txt"),
        "--ref",
        str(d / "ref.txt"),
        "--output",
        str(d / "out.txt"),
    ],
    "serve": lambda f, d: ["serve", "--model", str(f["evil"]), "--port", "0"],
    "average": lambda f, d: [
        "average",
        "--checkpoints",
        str(f["good"]),
        str(f["evil"]),
        "--output",
        str(d / "out.pt"),
    ],
    "export": lambda f, d: [
        "export",
        "ctranslate2",
        "--model",
        str(f["evil"]),
        "--output",
        str(d / "out_ct2"),
    ],
    "convert": lambda f, d: ["convert", str(f["evil"]), str(d / "out.pt")],
}


@pytest.mark.parametrize("command", sorted(ENTRY_POINTS))
def test_every_command_refuses_a_file_with_a_payload(
    command: str, files, tmp_path: Path, capsys, monkeypatch
) -> None:
    if command == "export":
        pytest.importorskip("ctranslate2")
    if command == "serve":
        pytest.importorskip("fastapi")
        pytest.importorskip("uvicorn")
        import transduce.serve.server as server

        def no_server(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the server started")

        monkeypatch.setattr(server, "serve", no_server)
    for name in ("in.txt", "ref.txt"):
        (tmp_path / name).write_bytes((files["dir"] / name).read_bytes())
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _run(ENTRY_POINTS[command](files, tmp_path), capsys)
    line = _one_line_error(code, err, str(files["evil"]))
    if command == "convert":
        assert "--trust" in line
    else:
        assert f"transduce convert {files['evil']} NEW.pt --trust" in line
    assert out == ""
    assert not files["marker"].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_resume_refuses_a_checkpoint_with_a_payload(files, tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "n_layers": 1,
                    "d_model": 16,
                    "d_ff": 32,
                    "n_heads": 2,
                    "d_k": 8,
                    "d_v": 8,
                },
                "train": {"max_tokens": 128, "max_steps": 4, "save_every": 2, "tensorboard": False},
                "task": {
                    "name": "copy",
                    "train_size": 40,
                    "valid_size": 8,
                    "max_length": 4,
                    "n_symbols": 4,
                },
            }
        )
    )
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    step = run / "checkpoints" / "step_00000002.pt"
    step.write_bytes(files["evil"].read_bytes())
    code, _, err = _run(
        ["train", "--config", str(config), "--out", str(run), "--resume", "--quiet"], capsys
    )
    _one_line_error(code, err, str(step), "transduce convert")
    assert not files["marker"].exists()
    # nothing written, config.json included (the Trainer writes it once the checkpoint is read)
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoints", "step_00000002.pt"]


def test_the_python_api_refuses_a_file_with_a_payload(files) -> None:
    for load in (
        Translator.load,
        checkpoint.load_model,
        checkpoint.load,
        lambda p: checkpoint.average([files["good"], p]),
    ):
        with pytest.raises(UserError, match="transduce convert") as e:
            load(files["evil"])
        assert "\n" not in str(e.value)
    assert not files["marker"].exists()


def test_a_bare_pickle_is_never_unpickled(files, tmp_path: Path, capsys) -> None:
    bare = tmp_path / "bare.pt"
    bare.write_bytes(pickle.dumps({"model": Payload(files["marker"]), "config": {}}))
    code, _, err = _run(["translate", "--model", str(bare)], capsys)
    _one_line_error(code, err, str(bare), "not a torch.save archive")
    code, _, err = _run(["convert", str(bare), str(tmp_path / "new.pt"), "--trust"], capsys)
    _one_line_error(code, err, str(bare))
    assert not files["marker"].exists()
    assert not (tmp_path / "new.pt").exists()


def test_refused_as_a_real_process(files, tmp_path: Path) -> None:
    """What a user sees: exit 2, one line on stderr, no traceback, and no payload run."""
    env = dict(os.environ, PYTHONPATH=str(SRC.parent), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "transduce", "translate", "--model", str(files["evil"])],
        input="the dog runs\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "transduce convert" in done.stderr and "Traceback" not in done.stderr
    assert not files["marker"].exists()


def test_no_code_path_unpickles_the_general_way() -> None:
    """``torch.load`` is called in the checkpoint package alone, with weights_only=True everywhere
    but the one function behind ``convert --trust``."""
    calls = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(([^)]*)\)", text):
            calls.append((path.relative_to(SRC).as_posix(), m.group(1)))
        assert "pickle.load" not in text and "pickle.Unpickler" not in text, path
    assert {where.split("/")[0] for where, _ in calls} == {"checkpoint"}
    unsafe = [args for _, args in calls if "weights_only=True" not in args]
    assert unsafe == ['p, map_location="cpu", weights_only=False']
    text = "".join(f.read_text() for f in sorted((SRC / "checkpoint").glob("*.py")))
    assert text.count("weights_only=False") == 1
    assert len(re.findall(r"\b_unpickle_trusted\(", text)) == 2  # defined, and called in convert


# --- the format -----------------------------------------------------------------------------------


def test_save_writes_plain_data_with_the_format(tmp_path: Path) -> None:
    state = {
        "config": {},
        "vocab": {},
        "model": {"w": torch.ones(2)},
        "stats": {"n": np.int64(3), "x": np.float32(0.5), "a": np.arange(3)},
        "pair": (1, 2.0),
    }
    checkpoint.save(state, tmp_path / "x.pt")
    data = torch.load(tmp_path / "x.pt", weights_only=True)
    assert data["format"] == checkpoint.FORMAT == 2
    assert data["stats"] == {"n": 3, "x": 0.5, "a": [0, 1, 2]}
    assert type(data["stats"]["n"]) is int and data["pair"] == (1, 2.0)
    with pytest.raises(TypeError, match=r"stats\.bad: .*Path"):
        checkpoint.save({**state, "stats": {"bad": Path("x")}}, tmp_path / "y.pt")
    assert not (tmp_path / "y.pt").exists()


def test_newer_and_missing_format_are_named(files, tmp_path: Path) -> None:
    data = torch.load(files["good"], weights_only=True)
    torch.save({**data, "format": 99}, tmp_path / "new.pt")
    with pytest.raises(UserError, match="format 99"):
        checkpoint.load(tmp_path / "new.pt")
    del data["format"]
    torch.save(data, tmp_path / "old.pt")
    with pytest.raises(
        UserError, match=r"no format key.*transduce convert .*old\.pt NEW\.pt --trust"
    ):
        checkpoint.load(tmp_path / "old.pt")
    (tmp_path / "cut.pt").write_bytes(files["good"].read_bytes()[:3000])
    with pytest.raises(UserError, match="cut.pt: not a transduce checkpoint"):
        checkpoint.load(tmp_path / "cut.pt")


# --- old files and convert ------------------------------------------------------------------------


def _old_rng(state: dict[str, Any]) -> dict[str, Any]:
    """A random state as the pickles before format 2 held it: the tuples and the NumPy array of
    ``random.getstate()`` and ``numpy.random.get_state()``."""
    version, internal, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    return {
        **state,
        "python": (version, tuple(internal), gauss),
        "numpy": (name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
    }


def test_old_model_file_converts_and_translates_identically(files, tmp_path: Path, capsys) -> None:
    data = torch.load(files["good"], weights_only=True)
    del data["format"]
    # as the old trainer wrote it: a general pickle, with a NumPy value for good measure
    old = tmp_path / "old.pt"
    torch.save({**data, "elapsed": np.float64(12.5)}, old)
    sentences = toy_sentences(12, seed=3)
    want = _beam_2(files["good"], sentences)

    code, _, err = _run(["translate", "--model", str(old)], capsys)
    _one_line_error(code, err, f"transduce convert {old} NEW.pt --trust")
    code, _, err = _run(["convert", str(old), str(tmp_path / "new.pt")], capsys)
    _one_line_error(code, err, "--trust")
    assert not (tmp_path / "new.pt").exists()

    code, out, err = _run(["convert", str(old), str(tmp_path / "new.pt"), "--trust"], capsys)
    assert code == 0, err
    info = json.loads(out)
    assert info["format"] == 2 and info["kind"] == "model" and info["unpickled"] is True
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    assert new["elapsed"] == 12.5 and new["format"] == 2
    assert _beam_2(tmp_path / "new.pt", sentences) == want
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    code, out, _ = _run(
        [
            "translate",
            "--model",
            str(tmp_path / "new.pt"),
            "--input",
            str(tmp_path / "in.txt"),
            "--beam",
            "2",
            "--quiet",
        ],
        capsys,
    )
    assert code == 0 and out.splitlines() == want

    # an old file with nothing but tensors and plain data converts without --trust
    torch.save(data, tmp_path / "plain_old.pt")
    code, out, err = _run(
        ["convert", str(tmp_path / "plain_old.pt"), str(tmp_path / "p.pt")], capsys
    )
    assert code == 0, err
    assert json.loads(out)["unpickled"] is False
    assert _beam_2(tmp_path / "p.pt", sentences) == want


def _beam_2(model: Path, sentences: list[str]) -> list[str]:
    translator = Translator.load(model)
    return translator.translate(sentences, translator.decode_config(beam=2))


TINY: dict[str, Any] = {
    "n_layers": 1,
    "d_model": 32,
    "d_ff": 64,
    "n_heads": 2,
    "d_k": 16,
    "d_v": 16,
    "dropout": 0.1,
    "max_tokens": 256,
    "warmup": 50,
    "save_every": 4,
    "log_every": 1,
    "eval_every": 0,
    "keep_last": 5,
    "tensorboard": False,
    "name": "copy",
    "train_size": 300,
    "valid_size": 30,
    "max_length": 6,
    "n_symbols": 6,
    "beam": 1,
}


TINY_SEED = update(Config(), TINY).train.seed


def _trainer(run_dir: Path, resume: bool = False, callbacks: Any = (), **values: Any) -> Trainer:
    cfg = update(Config(), {**TINY, **values})
    task = make_task(cfg.task)
    torch.manual_seed(cfg.train.seed)
    model = make_model(cfg.model, src_vocab_size=len(task.vocab))
    return Trainer(
        cfg,
        model,
        task.vocab,
        encode_pairs(task.vocab, task.train),
        run_dir=run_dir,
        valid_pairs=encode_pairs(task.vocab, task.valid),
        resume=resume,
        show_progress=False,
        callbacks=callbacks,
    )


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "split" not in r]


def test_resume_from_a_converted_old_checkpoint_is_exact(tmp_path: Path, capsys) -> None:
    """An old step checkpoint (RNG states as tuples and a NumPy array), converted with --trust,
    resumes to the same losses as a run never stopped: the random states come back exactly.
    Every file of the runs loads with weights_only=True and holds the format key."""
    _trainer(tmp_path / "a", max_steps=10).train()
    # checkpoints at steps 4 and 6, with Python's and NumPy's generators drawn from, so that
    # their saved states are not the seeded ones a resume starts from anyway
    draws = [lambda p: (random.random(), np.random.standard_normal())]
    _trainer(tmp_path / "b", max_steps=6, callbacks=draws).train()
    step6 = checkpoint.step_path(tmp_path / "b" / "checkpoints", 6)
    new = torch.load(step6, weights_only=True)
    for path in [*(tmp_path / "a").rglob("*.pt"), *(tmp_path / "b").rglob("*.pt")]:
        assert torch.load(path, weights_only=True)["format"] == 2, path
    old = {k: v for k, v in new.items() if k != "format"}
    old["rng"] = _old_rng(old["rng"])
    old["rng_ranks"] = [_old_rng(r) for r in old["rng_ranks"]]
    torch.save(old, step6)
    with pytest.raises(UserError, match="transduce convert"):
        _trainer(tmp_path / "b", resume=True, max_steps=10)
    code, _, err = _run(["convert", str(step6), str(step6), "--trust"], capsys)
    assert code == 0, err
    converted = torch.load(step6, weights_only=True)
    assert converted["rng"]["numpy"][1] == new["rng"]["numpy"][1]
    random.seed(TINY_SEED)
    np.random.seed(TINY_SEED)
    assert np.random.get_state()[1].tolist() != new["rng"]["numpy"][1]  # (drawn from)
    second = _trainer(tmp_path / "b", resume=True, max_steps=10)
    assert second.progress.step == 6
    assert random.getstate()[1] == tuple(new["rng"]["python"][1])
    numpy_state = np.random.get_state()
    assert numpy_state[1].tolist() == new["rng"]["numpy"][1]
    assert list(numpy_state[2:]) == new["rng"]["numpy"][2:]
    second.train()
    assert _losses(tmp_path / "b") == pytest.approx(_losses(tmp_path / "a"), abs=1e-6)


# --- safetensors beside the model -----------------------------------------------------------------


def test_safetensors_beside_model_pt_loads_the_same_model(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors import safe_open

    _trainer(tmp_path, max_steps=3, dropout=0.0).train()
    st = tmp_path / "model.safetensors"
    assert st.is_file()
    a, vocab_a, cfg_a = checkpoint.load_model(tmp_path / "model.pt")
    b, vocab_b, cfg_b = checkpoint.load_model(st)
    assert cfg_a == cfg_b and vocab_a.to_dict() == vocab_b.to_dict()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # the three-way tie is one tensor in the file, and still one matrix once loaded
    with safe_open(str(st), framework="pt") as f:
        names = set(f.keys())
        meta = f.metadata()
    assert "encoder.embed.weight" in names
    assert not names & {"decoder.embed.weight", "generator.weight"}
    assert json.loads(meta["transduce.tied"]) == {
        "decoder.embed.weight": "encoder.embed.weight",
        "generator.weight": "encoder.embed.weight",
    }
    assert json.loads(meta["transduce.config"]) == cfg_a.to_dict()
    assert b.generator.weight is b.encoder.embed.weight
    src = torch.tensor([[4, 5, 6, 2]])
    tgt = torch.tensor([[1, 4, 5]])
    with torch.no_grad():
        assert torch.equal(a(src, tgt), b(src, tgt))


def test_convert_to_safetensors(files, tmp_path: Path, capsys) -> None:
    pytest.importorskip("safetensors")
    code, out, err = _run(["convert", str(files["good"]), str(tmp_path / "m.safetensors")], capsys)
    assert code == 0, err
    sentences = toy_sentences(8, seed=5)
    assert Translator.load(tmp_path / "m.safetensors").translate(sentences) == Translator.load(
        files["good"]
    ).translate(sentences)
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(UserError, match="bad.safetensors"):
        checkpoint.load_model(tmp_path / "bad.safetensors")


def test_convert_refuses_a_file_that_holds_no_usable_model(files, tmp_path: Path, capsys) -> None:
    # a broken vocabulary, weights of another shape, or NaN weights: one line, nothing written
    data = torch.load(files["good"], weights_only=True)
    del data["format"]
    key = next(k for k, v in data["model"].items() if v.is_floating_point())
    broken = {
        "vocab": {**data, "vocab": None},
        "shape": {**data, "model": {**data["model"], key: torch.zeros(3)}},
        "nan": {**data, "model": {**data["model"], key: data["model"][key] * float("nan")}},
    }
    for name, bad in broken.items():
        old = tmp_path / f"{name}.pt"
        torch.save(bad, old)
        code, _, err = _run(["convert", str(old), str(tmp_path / f"{name}_new.pt")], capsys)
        assert code == 2 and str(old) in err and err.count("\n") == 1, (name, err)
        assert not (tmp_path / f"{name}_new.pt").exists()


def test_a_hugging_face_folder_given_as_a_model_says_how_to_import_it(
    tmp_path: Path, capsys
) -> None:
    folder = tmp_path / "opus-mt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "source.spm").write_bytes(b"")
    with pytest.raises(UserError, match="transduce import huggingface"):
        checkpoint.load_model(folder)
    assert main(["--no-malloc-tuning", "translate", "--model", str(folder)]) == 2
    assert "not a transduce model" in capsys.readouterr().err
    with pytest.raises(UserError, match="not found: .* a folder without a model.pt; name"):
        checkpoint.load_model(tmp_path)  # a folder of nothing
    run = tmp_path / "run"  # a run still training: its config.json, no model.pt yet
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    with pytest.raises(UserError, match="not found: .* a folder without a model.pt; name"):
        checkpoint.load_model(run)
    (run / "checkpoints" / "step_00000002.pt").write_bytes(b"")
    newest = f"(its newest step checkpoint: {run / 'checkpoints' / 'step_00000002.pt'})"
    for folder in (run, run / "checkpoints"):
        with pytest.raises(UserError, match=re.escape(newest)):
            checkpoint.load_model(folder)

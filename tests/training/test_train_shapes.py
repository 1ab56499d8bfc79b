"""train.pad_multiple (auto included) and train.compile: their config values, padding that leaves
the loss and the gradients as they were, and a compiled run that saves, resumes and leaves
checkpoints with the plain model's keys."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from transduce.config import Config, coerce, update
from transduce.data.batching import collate
from transduce.data.synthetic import make_task
from transduce.data.vocab import PAD
from transduce.errors import UserError
from transduce.model.transformer import make_model
from transduce.training import compiling
from transduce.training.feed import AUTO_PAD_MULTIPLE, pad_multiple_for
from transduce.training.loss import label_smoothed_nll
from transduce.training.tasks.synthetic import encode_pairs
from transduce.training.trainer import Trainer

TINY: dict[str, Any] = {
    "n_layers": 1,
    "d_model": 16,
    "d_ff": 32,
    "n_heads": 2,
    "d_k": 8,
    "d_v": 8,
    "dropout": 0.0,
    "max_tokens": 128,
    "warmup": 20,
    "max_steps": 4,
    "save_every": 2,
    "log_every": 1,
    "eval_every": 0,
    "tensorboard": False,
    "precision": "fp32",
    "name": "copy",
    "train_size": 200,
    "valid_size": 20,
    "max_length": 6,
    "n_symbols": 6,
    "beam": 1,
}


def _cfg(**values: Any) -> Config:
    return update(Config(), {**TINY, **values})


def _trainer(run_dir: Path, cfg: Config, **kwargs: Any) -> Trainer:
    task = make_task(cfg.task)
    torch.manual_seed(cfg.train.seed)
    model = make_model(cfg.model, src_vocab_size=len(task.vocab))
    train, valid = encode_pairs(task.vocab, task.train), encode_pairs(task.vocab, task.valid)
    return Trainer(
        cfg,
        model,
        task.vocab,
        train,
        run_dir=run_dir,
        valid_pairs=valid,
        show_progress=False,
        **kwargs,
    )


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- the config values ------------------------------------------------------------------------


def test_pad_multiple_takes_a_positive_integer_or_auto() -> None:
    assert Config().train.pad_multiple == 1  # the default: no padding, as before
    assert update(Config(), {"pad_multiple": "auto"}).train.pad_multiple == "auto"
    assert coerce("train", "pad_multiple", "auto") == "auto"
    assert coerce("train", "pad_multiple", "8") == 8  # from the command line: a number
    for bad in (0, -8, "eight", True, 2.5):
        with pytest.raises(UserError, match="pad_multiple"):
            update(Config(), {"pad_multiple": bad})


def test_compile_takes_false_or_a_mode_and_refuses_true() -> None:
    assert Config().train.compile is False
    for mode in ("default", "reduce-overhead", "max-autotune"):
        assert update(Config(), {"compile": mode}).train.compile == mode
    assert coerce("train", "compile", "false") is False
    assert coerce("train", "compile", "max-autotune") == "max-autotune"
    for bad in ("fast", 1, "true", True):
        with pytest.raises(UserError, match="compile"):
            update(Config(), {"compile": bad})


def test_auto_pads_to_8_on_cuda_or_with_compile_and_not_on_a_plain_cpu() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # (a device named, none needed)
    auto = _cfg(pad_multiple="auto").train
    assert pad_multiple_for(auto, cpu) == 1
    assert pad_multiple_for(auto, cuda) == AUTO_PAD_MULTIPLE == 8
    assert pad_multiple_for(_cfg(pad_multiple="auto", compile="default").train, cpu) == 8
    assert pad_multiple_for(_cfg(pad_multiple=3).train, cuda) == 3  # a number is kept


def test_auto_on_a_cpu_cuts_the_batches_of_pad_multiple_1(tmp_path: Path) -> None:
    one = _trainer(tmp_path / "one", _cfg())
    auto = _trainer(tmp_path / "auto", _cfg(pad_multiple="auto"))
    with one.feed.epoch(0, one.device) as a, auto.feed.epoch(0, auto.device) as b:
        assert [x.tolist() for x in a.batches] == [x.tolist() for x in b.batches]
        for x, y in zip(a.read(0), b.read(0), strict=True):
            assert all(torch.equal(u, v) for u, v in zip(x[:3], y[:3], strict=True))


def test_padding_leaves_the_loss_and_the_gradients() -> None:
    """The same pairs at their own lengths and padded to a multiple of 8: the loss sums and every
    gradient agree up to float rounding (the padding is masked in attention and in the loss)."""
    cfg = _cfg()
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=9)
    pairs = [([3, 4, 5], [5, 4]), ([6, 7, 3, 4, 5, 6], [8, 3, 4]), ([5], [6, 7, 8, 3, 4])]
    results = []
    for multiple in (1, 8):
        batch = collate(pairs, pad_multiple=multiple)
        model.zero_grad()
        sums = label_smoothed_nll(
            model(batch.src, batch.tgt_in), batch.tgt_out, epsilon=0.1, ignore_index=PAD
        )
        sums.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((batch, sums.loss.item(), sums.nll.item(), grads))
    (plain, loss_a, nll_a, grads_a), (padded, loss_b, nll_b, grads_b) = results
    assert plain.src.shape == (3, 7) and padded.src.shape == (3, 8)  # padding was added
    assert plain.tgt_in.shape == (3, 6) and padded.tgt_in.shape == (3, 8)
    assert loss_a == pytest.approx(loss_b, rel=1e-6) and nll_a == pytest.approx(nll_b, rel=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:  # (atol: AVX2's rounding parted one entry by 1.3e-7)
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-6)


# --- compile ----------------------------------------------------------------------------------


def test_reduce_overhead_is_refused_on_a_cpu(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="reduce-overhead captures CUDA graphs"):
        _trainer(tmp_path, _cfg(compile="reduce-overhead"))


def test_under_compile_the_kernels_leave_their_cpu_library_for_f_linear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor cannot lower oneDNN's linear operator (a LoweringException on the first update,
    seen on this AMD CPU in float32): under torch.compile the kernels take F.linear, and their
    data-dependent mask checks (which would break the graph) answer False; a float32 compile is
    accepted."""
    import importlib

    attention = importlib.import_module("transduce.kernels.attention")  # (not the function)
    matmul = importlib.import_module("transduce.kernels.matmul")

    weight = torch.zeros(4, 4)
    assert not matmul.use_onednn("mkl", weight)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not matmul.use_onednn("auto", weight) and not matmul.use_onednn("onednn", weight)
    with torch.enable_grad():
        assert not attention.all_attendable(torch.ones(2, 3, dtype=torch.bool))
        assert not attention._every_row_attends(torch.ones(2, 3, dtype=torch.bool))
    monkeypatch.undo()
    assert attention.all_attendable(torch.ones(2, 3, dtype=torch.bool))
    _trainer(tmp_path, _cfg(compile="default"))  # float32: accepted


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_training_forward_is_one_graph(precision: str) -> None:
    """Dynamo captures the model's training forward (dropout on, the fast CPU dropout's
    in-place random_ left for F.dropout under compile) in one graph: a break would cut it into
    pieces compiled and recompiled apart (it did: 24 graphs for this one-layer model, and
    Dynamo's recompile limit hit in layers.residual for SMALL)."""
    import torch._dynamo

    model = make_model(_cfg(dropout=0.1).model, src_vocab_size=20).train()
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 20, (4, 6), generator=g), torch.randint(4, 20, (4, 5), generator=g)

    def forward(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            return model(s, t)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(forward)(src, tgt)
    reasons = [b.reason.splitlines()[0] for b in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons


def test_a_compiled_run_saves_resumes_and_learns_as_a_plain_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dynamo's own capture (backend eager: the same in-place wrap, no kernel compile, a second
    or two a graph) trains the steps of the plain model, with the plain model's checkpoint keys,
    and a compiled run resumes from its checkpoint. Lengths padded to 8 (auto with compile on):
    few shapes, few recompiles. Both take F.linear, as a compiled run does (on this AMD CPU the
    plain run would take oneDNN, whose rounding Adam's first steps magnify)."""
    monkeypatch.setattr(compiling, "BACKEND", "eager")
    monkeypatch.setattr("transduce.kernels.matmul._cpu_vendor", lambda: "GenuineIntel")
    # F.layer_norm in both, as a compiled run takes (not the native kernel: other rounding)
    monkeypatch.setattr("transduce.kernels.norm._native_takes", lambda *args: False)
    plain = _trainer(tmp_path / "plain", _cfg(max_steps=2, pad_multiple=8))
    plain.train()
    compiled = {"compile": "default", "pad_multiple": "auto"}
    first = _trainer(tmp_path / "compiled", _cfg(max_steps=1, save_every=1, **compiled))
    summary = first.train()
    assert summary["compile_mode"] == "default" and summary["compiled_graphs"] >= 1
    assert first.model._compiled_call_impl is None  # the plain forward after training
    saved = torch.load(tmp_path / "compiled" / "model.pt", weights_only=False)["model"]
    assert saved.keys() == plain.model.state_dict().keys()  # no "_orig_mod." prefix
    second = _trainer(tmp_path / "compiled", _cfg(max_steps=2, **compiled), resume=True)
    assert second.progress.step == 1
    second.train()
    compiled_records = [r for r in _records(tmp_path / "compiled") if r.get("split") == "compile"]
    assert [r["step"] for r in compiled_records] == [1, 2]  # each process's first update
    assert all(r["first_update_s"] >= r["compile_s"] >= 0 for r in compiled_records)

    def losses(run: str) -> list[float]:
        return [r["loss"] for r in _records(tmp_path / run) if "loss" in r and "split" not in r]

    assert losses("compiled") == pytest.approx(losses("plain"), rel=1e-5)
    for name, value in plain.model.state_dict().items():
        torch.testing.assert_close(second.model.state_dict()[name], value, rtol=1e-4, atol=1e-6)


def test_bf16_weights_compile_their_bfloat16_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """precision bf16-weights with compile: what is compiled is the working copy that runs
    forward and backward (training/working_weights.py), and it trains the plain run's steps."""
    monkeypatch.setattr(compiling, "BACKEND", "eager")
    monkeypatch.setattr("transduce.kernels.matmul._cpu_vendor", lambda: "GenuineIntel")
    # F.layer_norm in both, as a compiled run takes (not the native kernel: other rounding)
    monkeypatch.setattr("transduce.kernels.norm._native_takes", lambda *args: False)
    runs = {}
    for name, extra in (("plain", {}), ("compiled", {"compile": "default"})):
        cfg = _cfg(max_steps=2, pad_multiple=8, precision="bf16-weights", **extra)
        runs[name] = _trainer(tmp_path / name, cfg)
        runs[name].train()
    compiled = runs["compiled"]
    assert compiled.working is not None and compiled.compiled.net is compiled.working.module
    assert compiled.model._compiled_call_impl is None  # the float32 model is never compiled

    def losses(run: str) -> list[float]:
        return [r["loss"] for r in _records(tmp_path / run) if "loss" in r and "split" not in r]

    assert len(losses("compiled")) == 2
    assert losses("compiled") == pytest.approx(losses("plain"), rel=1e-5)


@pytest.mark.skipif(
    not os.environ.get("TRANSDUCE_INDUCTOR_TESTS"),
    reason="inductor compiles C++ kernels with the system compiler: 25-80 s for a tiny "
    "model's forward and backward on a 2-core CPU, too long for the suite; set "
    "TRANSDUCE_INDUCTOR_TESTS=1 to run it (the wrap itself is tested with backend eager)",
)
def test_inductor_compiles_a_run_on_the_cpu(tmp_path: Path) -> None:
    started = time.monotonic()
    for precision in ("fp32", "bf16"):
        cfg = _cfg(max_steps=2, compile="default", pad_multiple="auto", precision=precision)
        summary = _trainer(tmp_path / precision, cfg).train()
        assert summary["step"] == 2 and summary["compile_s"] > 0
    print(f"inductor: {time.monotonic() - started:.1f} s, {summary}")

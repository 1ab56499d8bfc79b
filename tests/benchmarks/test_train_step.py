"""benchmarks/train_step.py's arithmetic: the FLOPs formula against PyTorch's own FLOP counter on a
real training step, and the summary (the JSON keys the issue names, ratios as medians of
per-round ratios)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from benchmark_testkit import load_benchmark
from torch.utils.flop_counter import FlopCounterMode

from transduce.config import ModelConfig
from transduce.kernels import KernelOptions
from transduce.model import make_model

ROOT = Path(__file__).resolve().parents[2]


def _train_step() -> types.ModuleType:
    """The benchmark script as a module."""
    return load_benchmark("train_step")


@pytest.mark.parametrize("d_k,d_v", [(16, 16), (16, 8)])
def test_flops_formula_counts_every_matrix_product_of_a_step(d_k: int, d_v: int) -> None:
    ts = _train_step()
    size = {
        "n_layers": 2,
        "d_model": 32,
        "n_heads": 2,
        "d_k": d_k,
        "d_v": d_v,
        "d_ff": 64,
        "vocab": 50,
    }
    batch, s, t = 3, 5, 7
    cfg = ModelConfig(n_layers=2, d_model=32, d_ff=64, n_heads=2, d_k=d_k, d_v=d_v, dropout=0.0)
    # oneDNN's operator is invisible to the FLOP counter
    options = KernelOptions(matmul="mkl")
    model = make_model(cfg, src_vocab_size=50, pad_id=0, options=options).train()
    g = torch.Generator().manual_seed(0)
    src, tgt = (
        torch.randint(4, 50, (batch, s), generator=g),
        torch.randint(4, 50, (batch, t), generator=g),
    )
    with FlopCounterMode(display=False) as counter:
        model(src, tgt).float().square().sum().backward()
    # forward and backward of every product, attention's full T x T scores included
    assert ts.flops_per_step(size, batch, s, t) == counter.get_total_flops()


def test_the_issue_sizes_cost_what_the_docstring_says() -> None:
    ts = _train_step()
    tokens = ts.BATCH * ts.TGT_LEN
    assert ts.flops_per_step(ts.SIZES["small"]) / tokens == pytest.approx(46.0e6, rel=1e-3)
    assert ts.flops_per_step(ts.SIZES["base"]) / tokens == pytest.approx(380.6e6, rel=1e-3)


def test_summary_keys_and_median_ratios() -> None:
    ts = _train_step()
    times = {
        "transduce/fp32": [1.0, 1.0, 4.0],
        "torch/fp32": [2.0, 3.0, 4.0],
        "hf/fp32": [1.0, 2.0, 2.0],
        "transduce/bf16": [0.5, 0.5, 0.5],
        "torch/bf16": [1.0, 1.0, 1.0],
        "hf/bf16": [0.75, 0.75, 0.75],
    }
    sizes = {
        name: {"seconds_per_step": times, "flops_per_step": 1e12} for name in ("small", "base")
    }
    rows, out = ts.summarise({"sizes": sizes, "peak_flops": {"fp32": 4e12, "bf16": 8e12}})
    required = [
        "small_fp32_vs_hf",
        "small_fp32_vs_torch",
        "small_bf16_vs_hf",
        "base_fp32_vs_hf",
        "base_bf16_vs_hf",
        "small_fp32_mfu",
    ]
    assert all(key in out for key in required)
    # per-round ratios 2, 3, 1 -> 2 and 1, 2, 0.5 -> 1; the ratios of the medians would be 3 and 2
    assert out["small_fp32_vs_torch"] == 2.0 and out["small_fp32_vs_hf"] == 1.0
    assert out["small_bf16_vs_hf"] == 1.5 and out["base_bf16_vs_torch"] == 2.0
    assert out["small_fp32_mfu"] == pytest.approx(1e12 / 1.0 / 4e12, rel=1e-3)
    assert out["small_bf16_over_fp32"] == 2.0  # per-round 2, 2, 8
    assert len(rows) == 12


def test_shape_flags_and_the_paper_batch() -> None:
    ts = _train_step()
    args = ts.parse_args([])
    assert (args.batch, args.src_len, args.tgt_len) == (64, 24, 24)
    args = ts.parse_args(["--batch", "8", "--src-len", "5", "--tgt-len", "7"])
    assert (args.batch, args.src_len, args.tgt_len) == (8, 5, 7)
    args = ts.parse_args(["--paper-batch"])
    assert (args.batch, args.src_len, args.tgt_len) == (1024, 24, 24)
    assert args.batch * args.tgt_len == 24_576  # about the paper's 25k target tokens
    for bad in (["--paper-batch", "--batch", "8"], ["--batch", "0"]):
        with pytest.raises(SystemExit):
            ts.parse_args(bad)


def test_summary_counts_the_tokens_of_the_shape_and_reports_memory() -> None:
    ts = _train_step()
    times = {"transduce/fp32": [2.0, 2.0], "torch/fp32": [4.0, 4.0]}
    sizes = {
        "small": {
            "seconds_per_step": times,
            "flops_per_step": 1e12,
            "peak_mib": {"transduce/fp32": 100.0, "torch/fp32": None},
        }
    }
    res = {"sizes": sizes, "peak_flops": {"fp32": 1e12}, "shape": [8, 5, 10]}
    rows, out = ts.summarise(res)
    assert out["small_fp32_transduce_tokens_per_s"] == 8 * 10 / 2.0
    assert out["small_flops_per_target_token"] == 1e12 / 80
    assert out["small_fp32_transduce_peak_mib"] == 100.0
    assert out["small_fp32_torch_peak_mib"] is None  # not measured: said, not made up
    assert out["small_fp32_mfu"] == out["small_fp32_transduce_mfu"] == 0.5
    assert out["small_fp32_torch_mfu"] == 0.25 and out["small_fp32_vs_torch"] == 2.0


def test_peak_memory_of_a_step_sees_what_it_allocates() -> None:
    """In a process of its own: one whose malloc has been tuned (as the suite's has, by earlier
    tests) keeps freed memory resident, and a new block then raises no peak."""
    path = str(ROOT / "benchmarks" / "train_step.py")
    script = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('train_step', {path!r})\n"
        "ts = importlib.util.module_from_spec(spec); sys.modules['train_step'] = ts\n"
        "spec.loader.exec_module(ts)\n"
        "cpu = torch.device('cpu'); measure = ts.memory_measure(cpu)\n"
        "def step():\n"
        "    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, then freed\n"
        "    assert block.sum() > 0\n"
        "print(measure, ts.step_peak_mib(step, cpu, measure) if measure != 'none' else 0,\n"
        "      ts.step_peak_mib(lambda: None, cpu, measure) if measure != 'none' else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    measure, block, nothing = done.stdout.split()
    if measure == "none":
        pytest.skip("this system cannot reset its peak resident set (/proc/self/clear_refs)")
    assert measure == "rss_peak_rise"
    assert float(block) >= 60 and float(nothing) < 30


def test_a_quick_run_with_the_shape_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark end to end on a tiny shape, one round of transduce alone: the worker's
    command line as the parent writes it, run in this process (malloc tuning, which a process
    cannot undo, and the seconds of the peak FLOP/s product loop left out), then the JSON line
    with the shape, MFU and peak memory."""
    import transduce.runtime

    ts = _train_step()
    monkeypatch.setattr(transduce.runtime, "tune_malloc", lambda: False)
    monkeypatch.setattr(ts, "measure_peak", lambda dtype, device=None: 1e12)
    commands: list[list[str]] = []

    def worker(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        commands.append(cmd)
        result = ts.run_worker(ts.parse_args(cmd[2:]))
        return subprocess.CompletedProcess(cmd, 0, "RESULT " + json.dumps(result) + "\n")

    # the script's own view of the module (platform, which the worker asks, needs the real one)
    monkeypatch.setattr(ts, "subprocess", types.SimpleNamespace(run=worker, PIPE=subprocess.PIPE))
    flags = ["--quick", "--malloc", "on", "--rounds", "1", "--systems", "transduce"]
    flags += ["--precisions", "fp32", "--threads", str(torch.get_num_threads())]
    ts.main([*flags, "--batch", "2", "--src-len", "3", "--tgt-len", "4"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "--batch 2 --src-len 3 --tgt-len 4" in " ".join(commands[0])
    assert (summary["batch"], summary["src_len"], summary["tgt_len"]) == (2, 3, 4)
    flops = ts.flops_per_step(ts.SIZES["small"], 2, 3, 4)
    assert summary["small_flops_per_target_token"] == flops / (2 * 4)
    assert summary["small_fp32_mfu"] > 0 and summary["memory"] in ("rss_peak_rise", "none")
    assert "small_fp32_transduce_peak_mib" in summary


def test_summary_of_bf16_alone() -> None:
    """--precisions bf16 (what --paper-batch runs on a GPU): no fp32 peak is measured."""
    ts = _train_step()
    sizes = {"small": {"seconds_per_step": {"transduce/bf16": [1.0]}, "flops_per_step": 2e12}}
    rows, out = ts.summarise({"sizes": sizes, "peak_flops": {"bf16": 4e12}})
    assert out["small_bf16_mfu"] == 0.5 and out["peak_bf16_gflops"] == 4000.0
    assert "peak_fp32_gflops" not in out and len(rows) == 1


def test_summary_of_bf16_weights_against_autocast() -> None:
    """--precisions bf16 bf16-weights: the working-weights step's MFU (on the bf16 peak) and its
    speed over autocast's, per round."""
    ts = _train_step()
    times = {"transduce/bf16": [1.2, 1.5, 1.0], "transduce/bf16-weights": [1.0, 1.0, 1.0]}
    sizes = {"small": {"seconds_per_step": times, "flops_per_step": 2e12}}
    rows, out = ts.summarise({"sizes": sizes, "peak_flops": {"bf16": 4e12, "bf16-weights": 4e12}})
    assert out["small_bf16_weights_over_bf16"] == 1.2  # the median of 1.2, 1.5, 1.0
    assert out["small_bf16_weights_mfu"] == 0.5 and out["small_bf16_mfu"] == 0.4167  # 2/1.2/4
    assert [r[1] for r in rows] == ["bf16", "bf16-weights"]
    assert "peak_bf16-weights_gflops" not in out


@pytest.mark.parametrize(
    "system,mode", [("transduce_compiled", None), ("transduce_cudagraphs", "reduce-overhead")]
)
def test_the_compiled_systems_compile_the_module_that_runs(
    system: str, mode: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled systems compile, in their mode, the module that runs the step: the model in
    fp32, the bfloat16 working copy in bf16-weights (a copy of a compiled module is not compiled:
    it is compiled in turn), as the Trainer compiles what it runs.
    Compiling is recorded, not done."""
    ts = _train_step()
    compiled: list[tuple[torch.nn.Module, str | None]] = []

    def record(self: torch.nn.Module, *args: object, mode: str | None = None) -> None:
        compiled.append((self, mode))
        self._compiled_call_impl = self._call_impl  # "compiled": the plain call, marked

    monkeypatch.setattr(torch.nn.Module, "compile", record)
    size = {**ts.SIZES["small"], "n_layers": 1, "d_model": 16, "d_ff": 32, "vocab": 40}
    size.update(n_heads=2, d_k=8, d_v=8)
    if mode == "reduce-overhead":  # CUDA graphs on a CPU are refused, as train.compile does
        from transduce.errors import UserError

        with pytest.raises(UserError, match="reduce-overhead captures CUDA graphs"):
            ts.make_runner(system, size, torch.device("cpu"))
        import transduce.training.compiling

        monkeypatch.setattr(transduce.training.compiling, "check_mode", lambda *a: None)
    runner = ts.make_runner(system, size, torch.device("cpu"))
    src = torch.randint(4, 40, (2, 5))
    tgt = torch.randint(4, 40, (2, 6))
    runner.step(src, tgt[:, :-1], tgt[:, 1:], "fp32")
    runner.step(src, tgt[:, :-1], tgt[:, 1:], "bf16-weights")
    runner.step(src, tgt[:, :-1], tgt[:, 1:], "bf16-weights")
    assert [(m, md) for m, md in compiled] == [(runner.model, mode), (runner.working.module, mode)]
    assert next(runner.working.module.parameters()).dtype == torch.bfloat16
    # the reference systems compile nothing
    plain = ts.make_runner("transduce", size, torch.device("cpu"))
    plain.step(src, tgt[:, :-1], tgt[:, 1:], "bf16-weights")
    assert len(compiled) == 2


def test_the_read_late_systems_read_late_and_the_others_as_the_trainer() -> None:
    """``transduce_read_late`` leaves each update unread until the next (on any device: fused
    Adam skips on the CPU too), ``transduce`` reads as the Trainer does (at once: late_read.pays
    is False everywhere, as measured); the same three updates either way."""
    from transduce.training import late_read

    ts = _train_step()
    assert not late_read.pays(torch.device("cpu")) and not late_read.pays(torch.device("cuda"))
    size = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_k": 8, "d_v": 8, "d_ff": 32, "vocab": 40}
    g = torch.Generator().manual_seed(0)
    tgt = torch.randint(4, 40, (4, 6), generator=g)
    src, tgt_in, tgt_out = torch.randint(4, 40, (4, 5), generator=g), tgt[:, :-1], tgt[:, 1:]
    runners = {}
    for system in ("transduce", "transduce_read_late"):
        runner = ts.make_runner(system, size, torch.device("cpu"))
        torch.manual_seed(1)  # the same dropout for both
        for _ in range(3):
            runner.step(src, tgt_in, tgt_out, "fp32")
        runners[system] = runner
    late, once = runners["transduce_read_late"], runners["transduce"]
    assert late._pending is not None and once._pending is None  # the last one left unread
    for a, b in zip(late.model.parameters(), once.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the same three updates


def test_transduce_flash_alone_keeps_the_flash_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Trainer's systems step inside ``training_attention`` as ``Trainer.train`` does (flash
    off on CUDA); ``transduce_flash`` asks it to keep flash, for the comparison."""
    import contextlib

    import transduce.kernels

    ts = _train_step()
    seen: list[bool] = []

    @contextlib.contextmanager
    def recording(device: torch.device, *, flash: bool = False):  # type: ignore[no-untyped-def]
        seen.append(flash)
        yield

    monkeypatch.setattr(transduce.kernels, "training_attention", recording)
    size = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_k": 8, "d_v": 8, "d_ff": 32, "vocab": 40}
    g = torch.Generator().manual_seed(0)
    tgt = torch.randint(4, 40, (4, 6), generator=g)
    src, tgt_in, tgt_out = torch.randint(4, 40, (4, 5), generator=g), tgt[:, :-1], tgt[:, 1:]
    for system in ("transduce", "transduce_flash"):
        ts.make_runner(system, size, torch.device("cpu")).step(src, tgt_in, tgt_out, "fp32")
    assert seen == [False, True]

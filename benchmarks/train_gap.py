"""`transduce train` against its own update, on the same data: what the command costs beyond the
step (issue 40: "transduce train within 10% of the benchmark's step").

    python benchmarks/train_gap.py --config configs/multi30k_en_de_gpu.yaml \
        --set device=cuda --set max_tokens=25000 [--set ...] [--seconds 30] [--passes 3]

Two measures of one config, one after the other in this call:

  step  the config's Trainer, built by the very code `transduce train` runs
        (``training.run.train``), but in place of its loop the Trainer's own update
        (``_launch``/``_resolve`` reading one update late where it does, else ``_update``) over
        the first epoch's batches, moved to the device beforehand: one pass to meet their shapes,
        then ``--passes`` passes timed (the device synchronised around each). No data reading,
        logging, checkpoints or validation: what ``benchmarks/train_step.py`` times, on real
        batches.
  cli   `transduce train` itself (a subprocess) for ``--seconds`` of training, a log line every
        10 updates, no validation or checkpoint before its end: its steady target tokens/s, the
        median of its logged windows after the first two (as ``benchmarks/gpu_check.sh``).

Both count the target tokens that are not padding. The last line is JSON: both rates and
``cli_over_step`` (1.0: the command costs nothing beyond its step; the issue's target >= 0.9).
The vocabulary is learned once, by the step measure, and given to the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

LOG_EVERY = 10


class Measured(Exception):
    """Carries the step measure out of ``Trainer.train`` (nothing after it is wanted)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("measured")
        self.result = result


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _update_all(trainer: Any, groups: Iterable[list[Any]]) -> int:
    """``trainer``'s own update over ``groups`` as ``Trainer._step`` makes them (the one queued
    before read as the next is launched, the last drained as an epoch's end does); the target
    tokens."""
    tokens = 0
    for group in groups:
        tokens += sum(b.n_tokens for b in group)
        trainer.compiled.start_update()
        if trainer.reads_late:
            pending = trainer._launch(group)
            earlier, trainer._pending = trainer._pending, pending
            if earlier is not None:
                trainer._resolve(earlier)
                trainer.progress.step += 1
        else:
            trainer._update(group)
            trainer.progress.step += 1
        trainer.compiled.end_update(trainer.progress.step)
    if trainer._pending is not None:
        trainer._resolve(trainer._pending)
        trainer._pending = None
        trainer.progress.step += 1
    return tokens


def _timed(trainer: Any, groups: Callable[[], Iterable[list[Any]]]) -> tuple[float, int]:
    """(seconds, target tokens) of ``_update_all`` over ``groups()``, the device synchronised
    before and after."""
    _sync(trainer.device)
    started = time.perf_counter()
    tokens = _update_all(trainer, groups())
    _sync(trainer.device)
    return time.perf_counter() - started, tokens


def _rate_of(timings: list[tuple[float, int]]) -> int:
    """Target tokens/s over (seconds, tokens) timings."""
    return round(sum(t for _, t in timings) / sum(s for s, _ in timings))


def _on_device(trainer: Any, epoch: int) -> list[list[Any]]:
    """The update groups of ``epoch``, read and moved to the device beforehand."""
    with trainer.feed.epoch(epoch, trainer.device) as reader:
        firsts = range(0, len(reader.batches), reader.update_freq)
        return [[b.to(trainer.device) for b in reader.read(first)] for first in firsts]


def _read(trainer: Any, epoch: int, early: bool | None = None) -> Iterator[list[Any]]:
    """The update groups of ``epoch`` as the Trainer reads them while it trains: the feed's
    ``EpochReader`` (pinned memory, the next group read ahead on a thread); ``early`` (None:
    the Trainer's way, ``READ_EARLY_ON_CUDA`` on CUDA): started as each group is handed out
    (True) or once the update's gradient work is launched (False, ``Trainer.reading``)."""
    from transduce.training.loss_window import LossWindow
    from transduce.training.progress import Progress

    p, window = Progress(), LossWindow()
    with trainer.feed.epoch(epoch, trainer.device, early) as reader:
        before, trainer.reading = trainer.reading, reader.read_ahead
        try:
            while (group := reader.next(p, window)) is not None:
                yield group
        finally:
            trainer.reading = before


def _read_alone(trainer: Any, epoch: int) -> tuple[float, int, int]:
    """(seconds, target tokens, update groups) of reading ``epoch``'s update groups as the
    Trainer's reader does (pinned for CUDA), one after another on this thread, with no update:
    the host time a read holds beside the update's launching."""
    with trainer.feed.epoch(epoch, trainer.device) as reader:
        firsts = range(0, len(reader.batches), reader.update_freq)
        started, tokens = time.perf_counter(), 0
        for first in firsts:
            tokens += sum(b.n_tokens for b in reader.read(first))
        return time.perf_counter() - started, tokens, len(firsts)


def bare_updates(trainer: Any, passes: int, diagnose: bool) -> dict[str, Any]:
    """``passes`` timed passes of ``trainer``'s own update over its first epoch's update groups
    (already on the device), after one untimed pass; target tokens/s of the timed ones. With
    ``diagnose``, also: the same passes read as the Trainer reads (``reader_*``; and each next
    read started once the update is launched, ``reader_launched_*``), and epochs 1
    to ``passes`` (new batch shapes), on the device beforehand (``epochs_*``) and as read, and
    epochs 0 to ``passes`` - 1 read alone, with no update (``read_alone_*``). Under
    ``training_attention``, as ``Trainer.train`` trains. The step's rate is the median pass's,
    the diagnosis's the total tokens over the total seconds."""
    from transduce.kernels import training_attention

    with training_attention(trainer.device):  # the attention backends Trainer.train uses
        return _bare_updates(trainer, passes, diagnose)


def _bare_updates(trainer: Any, passes: int, diagnose: bool) -> dict[str, Any]:
    trainer.reads_late = trainer._reads_late()
    trainer.compiled.attach()
    groups = _on_device(trainer, 0)
    first_s, tokens = _timed(trainer, lambda: groups)
    seconds = [_timed(trainer, lambda: groups)[0] for _ in range(passes)]
    result: dict[str, Any] = {
        "updates_a_pass": len(groups),
        "tokens_a_pass": tokens,
        "first_pass_s": round(first_s, 3),
        "pass_s": [round(s, 3) for s in seconds],
        "step_tokens_per_s": round(tokens / statistics.median(seconds)),
        "step_best_tokens_per_s": round(tokens / min(seconds)),
        "reads_late": trainer.reads_late,
        "precision": trainer.precision,
        "device": str(trainer.device),
    }
    if diagnose:
        rate = _rate_of
        # the reader alone, and its milliseconds an update (what a read holds of the host)
        alone = [_read_alone(trainer, e) for e in range(passes)]
        result["read_alone_tokens_per_s"] = rate([(s, t) for s, t, _ in alone])
        result["read_alone_ms_an_update"] = round(
            1000 * sum(s for s, _, _ in alone) / sum(n for _, _, n in alone), 3
        )
        result["reader_tokens_per_s"] = rate(
            [_timed(trainer, lambda: _read(trainer, 0)) for _ in range(passes)]
        )
        result["reader_launched_tokens_per_s"] = rate(
            [_timed(trainer, lambda: _read(trainer, 0, early=False)) for _ in range(passes)]
        )
        later = range(1, passes + 1)  # epochs of new shapes, on the device before the clock
        result["epochs_tokens_per_s"] = rate(
            [_timed(trainer, lambda g=_on_device(trainer, e): g) for e in later]
        )
        result["epochs_read_tokens_per_s"] = rate(
            [_timed(trainer, lambda e=e + passes: _read(trainer, e)) for e in later]
        )
    return result


def measure_step(
    config: str, sets: list[str], out: Path, passes: int, diagnose: bool = False
) -> dict[str, Any]:
    """The step measure: the config's Trainer built by ``training.run.train``, stopped at its
    ``train()`` (``Measured``)."""
    from transduce.config import load_config, parse_overrides, update
    from transduce.training import trainer as trainer_module
    from transduce.training.run import train

    cfg = update(load_config(config), parse_overrides(sets))

    def measured(self: Any) -> dict[str, Any]:
        raise Measured(bare_updates(self, passes, diagnose))

    original = trainer_module.Trainer.train
    trainer_module.Trainer.train = measured  # type: ignore[method-assign]
    try:
        train(cfg, out, show_progress=False)
    except Measured as done:
        return done.result
    finally:
        trainer_module.Trainer.train = original  # type: ignore[method-assign]
    raise RuntimeError("the Trainer never started training")


def steady_rate(run: Path) -> dict[str, Any]:
    """A run folder's logged windows: their count and the median target tokens/s after the
    first two (the first shapes, and with compile the compiling); of all of them where there
    are no more than two (``windows`` says so). With train.compile, its record's first update,
    compile seconds and graphs too (``benchmarks/gpu_check.sh`` reads compiled runs by it)."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and "split" not in r]
    steady = rates[2:] or rates
    out = {
        "windows": len(rates),
        "cli_tokens_per_s": round(statistics.median(steady)) if steady else None,
        "updates": max((r.get("step", 0) for r in records), default=0),
    }
    compiled = [r for r in records if r.get("split") == "compile"]
    if compiled:
        out.update({k: compiled[0][k] for k in ("first_update_s", "compile_s", "compiled_graphs")})
    return out


def measure_cli(
    config: str, sets: list[str], out: Path, seconds: float, updates: int | None = None
) -> dict[str, Any]:
    """`transduce train` for ``seconds`` of training (``max_minutes``), or for ``updates``
    updates (``max_steps``) where given; its steady rate."""
    command = [sys.executable, "-m", "transduce", "train", "--config", config, "--out", str(out)]
    for s in sets:
        command += ["--set", s]
    for s in (
        f"max_minutes={0 if updates else seconds / 60}",
        *([f"max_steps={updates}"] if updates else []),
        f"log_every={LOG_EVERY}",
        "eval_every=0",
        "save_every=1000000",
        "tensorboard=false",
    ):
        command += ["--set", s]
    # this tree's src/ first, what else the path holds kept (an extra such as liger-kernel)
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([*command, "--quiet"], env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"train_gap.py: transduce train failed (exit {done.returncode})")
    return {**steady_rate(out), "cli_wall_s": round(time.perf_counter() - started, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a training config (YAML/TOML)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seconds", type=float, default=30.0, help="the command's training time")
    p.add_argument(
        "--updates", type=int, help="the command's updates instead of --seconds (a test's)"
    )
    p.add_argument("--passes", type=int, default=3, help="timed passes over the first epoch")
    p.add_argument("--out", default="runs/train_gap", help="a folder for the two runs")
    p.add_argument("--diagnose", action="store_true", help="the step fed as the Trainer feeds it")
    p.add_argument("--no-cli", action="store_true", help="the step measure alone")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.passes < 1 or (args.updates is not None and args.updates < 1):
        p.error("--seconds must be positive, --passes and --updates at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"train_gap.py: {out} is not empty; give a new --out")
    step = measure_step(args.config, args.sets, out / "step", args.passes, args.diagnose)
    print(f"step: {json.dumps(step)}", flush=True)  # before the command's run, which may not end
    if args.no_cli:
        return step
    sets = list(args.sets)
    vocab = out / "step" / "vocab.model"
    if vocab.is_file() and not any(s.startswith("vocab_model=") for s in sets):
        sets.append(f"vocab_model={vocab}")  # learned once
    cli = measure_cli(args.config, sets, out / "cli", args.seconds, args.updates)
    ratio = None
    if cli["cli_tokens_per_s"]:
        ratio = round(cli["cli_tokens_per_s"] / step["step_tokens_per_s"], 3)
    result = {**step, **cli, "cli_over_step": ratio}
    print(
        f"step (the Trainer's update over epoch 0, {step['updates_a_pass']} updates a pass): "
        f"{step['step_tokens_per_s']:,} target tokens/s "
        f"(best pass {step['step_best_tokens_per_s']:,})"
    )
    print(
        f"cli (`transduce train`, {cli['updates']} updates, {cli['windows']} windows): "
        f"{cli['cli_tokens_per_s'] or 0:,} target tokens/s steady; cli over step {ratio}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

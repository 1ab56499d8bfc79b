"""Training-step speed of this checkout against an earlier commit's, paired in one process.

Two runs of ``benchmarks/train_step.py`` minutes apart differ by up to 25% on a shared 2-core
machine, more than the change one wants to see. Here the earlier commit's package (its
``src/transduce`` and its own ``benchmarks/train_step.py``, taken with ``git archive`` and
renamed ``transduce_base`` so that both import side by side) and this checkout's run round by
round on the same batch, each round in a rotated order, and the figure is the median of the
per-round ratios. Each side steps as its own benchmark did at its commit (its own
``make_runner("transduce", ...)``: the earlier one may lack the gradient norm, the Trainer's
Adam, bf16-weights).

    python benchmarks/train_step_paired.py --baseline 6e6d9af --sizes small base \
        --precisions bf16 bf16-weights --baseline-precision bf16

Needs a git checkout holding the commit. The default baseline, 6e6d9af, is the tree issue 40
measured its CPU figures against. CPU only.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASE_NAME = "transduce_base"
NATIVE_NAMESPACE = "transduce_native"  # kernels/native's operators (and the build's name)
# references to the package in Python source, and only those (not "transduce" as a word)
_DOTTED = re.compile(r"\btransduce(?=\.[a-z_])")  # transduce.x
_FROM = re.compile(r"\bfrom transduce import\b")
_IMPORT = re.compile(r"^(\s*)import transduce\b")


def renamed(source: str, name: str = BASE_NAME) -> str:
    """Python source with its references to the package ``transduce`` (``transduce.x``,
    ``from transduce import``, ``import transduce``) made references to ``name``; other words
    (strings such as "transduce" as a system's name, "transduce: error") stay."""
    lines = []
    for line in source.split("\n"):
        line = _DOTTED.sub(name, line)
        line = _FROM.sub(f"from {name} import", line)
        lines.append(_IMPORT.sub(rf"\1import {name}", line))
    return "\n".join(lines)


def unpack_baseline(commit: str, into: Path) -> Path:
    """``commit``'s package as ``into/transduce_base`` and its train_step.py (renamed alike) as
    ``into/train_step_base.py``, its native kernels' sources with it (their operators renamed
    ``transduce_base_native``); returns ``into``. A SystemExit naming the commit if git cannot
    give it."""
    paths = ["src/transduce", "benchmarks/train_step.py"]
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, *paths], capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"train_step_paired.py: git cannot give {commit}: {proc.stderr.decode()}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith((".py", ".cpp", ".h")):
                continue
            data = tar.extractfile(member)
            assert data is not None
            # its native operators in a namespace of their own: two builds register side by side
            text = data.read().decode().replace(NATIVE_NAMESPACE, f"{BASE_NAME}_native")
            if member.name.endswith(".py"):
                text = renamed(text)
            if member.name == "benchmarks/train_step.py":
                target = into / "train_step_base.py"
            else:
                target = into / BASE_NAME / Path(member.name).relative_to("src/transduce")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return into


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="6e6d9af", help="the earlier commit (6e6d9af)")
    p.add_argument("--sizes", nargs="+", choices=["small", "base"], default=["small", "base"])
    p.add_argument("--precisions", nargs="+", default=["bf16", "bf16-weights"], help="ours")
    p.add_argument("--baseline-precision", default="bf16", help="the earlier commit's (bf16)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


Runners = dict[str, tuple[object, str]]  # key -> (a benchmark's Runner, its precision)


def timed_rounds(
    runners: Runners, batch: tuple[torch.Tensor, ...], steps: int, rounds: int, label: str
) -> dict[str, list[float]]:
    """Seconds a step of each runner, a list a runner, ``rounds`` rounds in rotated order."""
    keys = list(runners)
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            runner, p = runners[k]
            t0 = time.perf_counter()
            for _ in range(steps):
                runner.step(*batch, p)  # type: ignore[attr-defined]
            times[k].append((time.perf_counter() - t0) / steps)
        print(
            f"  [{label} round {r + 1}/{rounds}] "
            + " ".join(f"{k}={v[-1] * 1e3:.0f}ms" for k, v in times.items()),
            file=sys.stderr,
            flush=True,
        )
    return times


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    import train_step as ours  # this checkout's benchmark (and, through it, its package)

    from transduce.runtime import tune_malloc

    tune_malloc()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    out: dict[str, float] = {}
    base_key = f"{args.baseline}/{args.baseline_precision}"
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(unpack_baseline(args.baseline, Path(tmp))))
        theirs = load(Path(tmp) / "train_step_base.py", "train_step_base")
        for size_name in args.sizes:
            size = ours.SIZES[size_name]
            g = torch.Generator().manual_seed(1)
            src = torch.randint(4, size["vocab"], (ours.BATCH, ours.SRC_LEN), generator=g)
            tgt = torch.randint(4, size["vocab"], (ours.BATCH, ours.TGT_LEN + 1), generator=g)
            batch = (src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous())  # src, in, out
            tokens = int((batch[2] != ours.PAD).sum())
            runners: Runners = {
                base_key: (theirs.make_runner("transduce", size, cpu), args.baseline_precision)
            }
            for p in args.precisions:
                runners[f"ours/{p}"] = (ours.make_runner("transduce", size, cpu), p)
            warmup, steps, _ = ours.SCHEDULE[size_name]
            for runner, p in runners.values():
                for _ in range(warmup):
                    runner.step(*batch, p)  # type: ignore[attr-defined]
            times = timed_rounds(runners, batch, steps, args.rounds, size_name)
            for k, ts in times.items():
                ratios = [b / t for b, t in zip(times[base_key], ts, strict=True)]
                rate = tokens / statistics.median(ts)
                print(
                    f"{size_name:5s} {k:24s} {rate:8,.0f} tgt tok/s   over {base_key}: median "
                    f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})"
                )
                out[f"{size_name}_{k}_over_baseline"] = round(statistics.median(ratios), 3)
    return out


if __name__ == "__main__":
    main()

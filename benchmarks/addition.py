"""Time-to-99%: how long `transduce demo` takes to reach 99% exact match on held-out sums.

Runs the demo config (optionally with --set overrides) with validation every --eval-every steps
and no early stop, and prints one JSON line with the seconds and steps at which held-out sequence
accuracy first reached 99%, so later changes can be compared on the same machine.

    python benchmarks/addition.py [--minutes 5] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import torch

from transduce.config import parse_overrides, update
from transduce.demo import demo_config
from transduce.runtime import tune_malloc
from transduce.training.run import train_synthetic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    tune_malloc()
    overrides = {
        "max_minutes": str(args.minutes),
        "eval_every": str(args.eval_every),
        "target_seq_accuracy": "0.99",
        **parse_overrides(args.overrides),
    }
    cfg = update(demo_config(), overrides)
    with tempfile.TemporaryDirectory() as out:
        summary = train_synthetic(cfg, out, show_progress=False)
        records = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    reached = next(
        (r for r in records if r.get("split") == "valid" and r["seq_accuracy"] >= 0.99), None
    )
    train_times = {r["step"]: r["elapsed"] for r in records if "elapsed" in r}
    print(
        json.dumps(
            {
                "benchmark": "addition_time_to_99",
                "reached": reached is not None,
                "steps_to_99": reached["step"] if reached else None,
                "seconds_to_99": train_times.get(reached["step"]) if reached else None,
                "final_seq_accuracy": summary.get("seq_accuracy"),
                "seconds_total": summary["seconds"],
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "machine": platform.processor() or platform.machine(),
                "overrides": overrides,
            }
        )
    )


if __name__ == "__main__":
    main()

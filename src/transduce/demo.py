"""``transduce demo``: learn multi-digit addition on the CPU in a few minutes.

The run is the config in ``DEMO_CONFIG``; ``configs/addition.yaml`` holds the same run for
``transduce train --config`` (a test keeps the two equal).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transduce.config import Config, from_dict, update
from transduce.data.synthetic import make_task
from transduce.training.checkpoint import load_model
from transduce.training.run import predict_ids, train_synthetic

DEMO_CONFIG: dict[str, Any] = {
    "model": {
        "n_layers": 2, "d_model": 128, "d_ff": 512, "n_heads": 4, "d_k": 32, "d_v": 32,
        "dropout": 0.0,
    },
    "train": {
        "label_smoothing": 0.0, "warmup": 400, "lr_factor": 1.0, "max_tokens": 4096,
        "max_steps": 6000, "max_minutes": 5.0, "save_every": 500, "keep_last": 2,
        "eval_every": 250, "target_seq_accuracy": 0.995, "log_every": 25,
    },
    "task": {
        "name": "addition", "train_size": 200000, "valid_size": 1000, "min_digits": 1,
        "max_digits": 3,
    },
    "decode": {"beam": 1},
}  # fmt: skip


def demo_config() -> Config:
    return from_dict(DEMO_CONFIG, source="demo config")


def run_demo(
    out_dir: str | Path, overrides: dict[str, str] | None = None, *, show_progress: bool | None = None
) -> dict[str, Any]:
    """Train the addition demo into ``out_dir``; print examples; return the summary."""
    cfg = update(demo_config(), overrides or {})
    started = time.monotonic()
    summary = train_synthetic(cfg, out_dir, show_progress=show_progress)
    best = Path(out_dir) / "best.pt"
    print(f"run folder: {Path(out_dir).resolve()} (model.pt, best.pt, metrics.jsonl)")
    show_examples(cfg, best if best.exists() else Path(out_dir) / "model.pt")
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def show_examples(cfg: Config, model_path: Path, n: int = 8) -> None:
    """Print a few held-out sums with the model's answers."""
    model, vocab, _ = load_model(model_path)
    task = make_task(cfg.task)
    examples = task.valid[:n]
    hyps = predict_ids(
        model, [vocab.encode(s) for s, _ in examples], batch_size=n, max_len_offset=8
    )
    for (src, ref), hyp in zip(examples, hyps):
        answer = vocab.decode(hyp)
        mark = "ok" if answer == ref else f"WRONG (expected {ref})"
        print(f"  {src:>9} = {answer:<6} {mark}")


__all__ = ["DEMO_CONFIG", "demo_config", "run_demo"]

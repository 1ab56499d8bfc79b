"""``transduce demo``: learn multi-digit addition on the CPU in a few minutes.

The run is the config in ``DEMO_CONFIG``; ``configs/addition.yaml`` holds the same run for
``transduce train --config`` (a test keeps the two equal).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transduce.checkpoint import load_model
from transduce.config import Config, SyntheticTaskConfig, from_dict, update
from transduce.data.synthetic import make_task
from transduce.errors import UserError
from transduce.evaluation.accuracy import sequence_accuracy, token_accuracy
from transduce.inference.search import predict_ids, searchable
from transduce.training.fit import check_new_run, check_resumable
from transduce.training.run import train_synthetic

DEMO_CONFIG: dict[str, Any] = {
    "model": {
        "n_layers": 2,
        "d_model": 128,
        "d_ff": 512,
        "n_heads": 4,
        "d_k": 32,
        "d_v": 32,
        "dropout": 0.0,
    },
    "train": {
        "label_smoothing": 0.0,
        "warmup": 400,
        "lr_factor": 0.25,
        "max_tokens": 1024,
        "max_steps": 6000,
        "max_minutes": 5.0,
        "save_every": 500,
        "keep_last": 2,
        "eval_every": 250,
        "target_seq_accuracy": 0.995,
        "log_every": 25,
    },
    "task": {
        "name": "addition",
        "train_size": 200000,
        "valid_size": 1000,
        "min_digits": 1,
        "max_digits": 3,
    },
    "decode": {"beam": 1},
}


def demo_config() -> Config:
    return from_dict(DEMO_CONFIG, source="demo config")


def run_demo(
    out_dir: str | Path,
    overrides: dict[str, str] | None = None,
    *,
    resume: bool = False,
    show_progress: bool | None = None,
) -> dict[str, Any]:
    """Train the addition demo into ``out_dir`` (``resume``: continue the stopped one there),
    print test examples, return the summary.

    Training stops once validation exact match reaches ``target_seq_accuracy`` (or at the time
    budget); the best checkpoint by validation is then scored on the separate test split, which
    is what ``seq_accuracy`` and ``token_accuracy`` report.
    """
    cfg = update(demo_config(), overrides or {})
    if cfg.decode.beam != 1 or cfg.decode.sampling:  # its test below is greedy search
        raise UserError(
            "the demo scores greedy outputs (decode.beam 1, no sampling); for other decoding "
            "train with `transduce train --config configs/addition.yaml` and decode the model"
        )
    if resume:
        check_resumable(out_dir)
    check_new_run(out_dir, resume)
    started = time.monotonic()
    summary = train_synthetic(cfg, out_dir, resume=resume, show_progress=show_progress)
    out = Path(out_dir)
    model_path = out / "best.pt" if (out / "best.pt").exists() else out / "model.pt"
    print(f"run folder: {out.resolve()} (model.pt, best.pt, metrics.jsonl)")
    model, vocab, _ = load_model(model_path)
    assert isinstance(cfg.task, SyntheticTaskConfig)
    test = make_task(cfg.task).test
    hyps = predict_ids(
        searchable(model),
        [vocab.encode(s) for s, _ in test],
        batch_size=cfg.decode.decode_batch,
        max_len_offset=cfg.decode.max_len_offset,
    )
    refs = [vocab.encode(t) for _, t in test]
    for (src, ref), hyp in list(zip(test, hyps))[:8]:
        answer = vocab.decode(hyp)
        mark = "ok" if answer == ref else f"WRONG (expected {ref})"
        shown = src[::-1] if cfg.task.reverse_input else src  # the question, not as read
        print(f"  {shown:>9} = {answer:<6} {mark}")
    return {
        "task": cfg.task.name,
        "seq_accuracy": sequence_accuracy(hyps, refs),
        "token_accuracy": token_accuracy(hyps, refs),
        "test_examples": len(test),
        "seconds": round(time.monotonic() - started, 1),
        "steps": summary["step"],
        "stopped_by": summary["stopped_by"],
        "valid_seq_accuracy": summary.get("seq_accuracy"),
        "model": str(model_path),
    }


__all__ = ["DEMO_CONFIG", "demo_config", "run_demo"]

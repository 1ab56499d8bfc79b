"""Synthetic run folders (metrics.jsonl as the trainer writes it) and checks of written figures."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

# on tests that draw; the computations are tested without matplotlib
requires_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed"
)


def run_records(
    *,
    steps: int = 200,
    log_every: int = 10,
    steps_per_epoch: int = 50,
    eval_every: int = 50,
    task: str = "synthetic",
    seconds_per_step: float = 0.6,
    learn_steps: float = 120.0,
    positions: int = 4,
) -> list[dict]:
    """The lines of a run: training every ``log_every`` steps, validation every ``eval_every``.

    Synthetic tasks get sequence accuracy ``min(1, step / learn_steps)``, position ``p``'s
    accuracy ``min(1, step / learn_steps + (positions - p) * 0.05)`` (later positions learnt later).
    """
    lines: list[dict] = []
    for s in range(log_every, steps + 1, log_every):
        nll = 2.0 * math.exp(-s / 60) + 0.3
        lines.append(
            {
                "step": s,
                "epoch": (s - 1) // steps_per_epoch,
                "loss": nll + 0.1,
                "nll": nll,
                "ppl": math.exp(nll),
                "lr": 1e-3 * min(s / 40, (40 / s) ** 0.5),
                "tokens_per_s": 1000.0 + s,
                "elapsed": s * seconds_per_step,
            }
        )
        if s % eval_every == 0:
            valid = {
                "step": s,
                "split": "valid",
                "valid_loss": nll + 0.2,
                "valid_nll": nll + 0.1,
                "valid_ppl": math.exp(nll + 0.1),
                "neg_valid_nll": -(nll + 0.1),
            }
            if task == "translation":
                valid.update(
                    bleu=30.0 * (1 - math.exp(-s / 80)), chrf=50.0 * (1 - math.exp(-s / 80))
                )
            else:
                seq = min(1.0, s / learn_steps)
                pos = [min(1.0, seq + (positions - p) * 0.05) for p in range(1, positions + 1)]
                valid.update(
                    seq_accuracy=seq, token_accuracy=sum(pos) / positions, position_accuracy=pos
                )
            lines.append({**valid, "valid_seconds": 1.5})
    return lines


def write_run(folder: Path, lines: list[dict], tail: str = "") -> Path:
    """Writes ``lines`` (then ``tail``, e.g. a half-written line) to ``folder/metrics.jsonl``."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(line) + "\n" for line in lines) + tail
    (folder / "metrics.jsonl").write_text(text)
    return folder


def check_png(path: Path, size: tuple[int, int] | None = None, min_colors: int = 4) -> np.ndarray:
    """The decoded PNG (H, W, channels); asserts its pixel size (width, height) when given, and
    that it is not blank: at least ``min_colors`` distinct colours."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)
    if size is not None:
        assert (pixels.shape[1], pixels.shape[0]) == size
    flat = (pixels[..., :3].reshape(-1, 3) * 255).round().astype(np.uint8)
    assert len(np.unique(flat, axis=0)) >= min_colors
    return pixels


def check_vector(path: Path) -> str:
    """Asserts that ``path`` is what its suffix says (SVG or PDF); returns SVG text, "" for PDF."""
    data = path.read_bytes()
    if path.suffix == ".pdf":
        assert data.startswith(b"%PDF-")
        return ""
    text = data.decode()
    assert (
        text.lstrip().startswith("<?xml")
        and "<svg" in text[:2000]
        and text.rstrip().endswith("</svg>")
    )
    return text

"""Model files and checkpoints: atomic writes, the last K kept, loading with clear errors,
averaging (section 6.1), and the model and vocabulary a file holds (``load_model``).

A training checkpoint is a dict with ``config`` (Config.to_dict()), ``vocab`` (Vocab.to_dict()),
``model`` (state dict) and, for resuming, ``optimizer``, ``step``, ``epoch``, ``batch_index``,
``rng`` and ``elapsed``. A model file (``model.pt``, ``best.pt``, an average) holds only the first
three, which is all that translation needs.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transduce.architectures import Seq2Seq, build_model
from transduce.config import Config, from_dict
from transduce.data.subword import SentencePieceVocab
from transduce.data.vocab import CharVocab, TokenVocab, Vocab, VocabPair, vocab_sizes
from transduce.errors import UserError

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def save_atomic(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename over ``path``:
    a reader (or a run killed mid-write) sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU; a missing or unreadable file is a UserError."""
    p = Path(path)
    if p.is_dir():
        p = p / "model.pt"
    if not p.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        data = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise UserError(f"{p}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or "model" not in data or "config" not in data:
        raise UserError(f"{p}: not a transduce checkpoint (no model/config inside)")
    return data


def step_checkpoints(directory: str | Path) -> list[Path]:
    """``step_N.pt`` files in ``directory``, oldest step first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


def step_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def prune(directory: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (all of them when it is 0)."""
    found = step_checkpoints(directory)
    for p in found[: max(len(found) - keep_last, 0)]:
        p.unlink(missing_ok=True)


def average(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The element-wise mean of the models in ``paths`` (floating tensors; others from the last).

    Returns a model checkpoint (config, vocab, model) with the newest one's config and vocab.
    Sums are kept in float64 so averaging 20 checkpoints (the paper's big model) loses nothing.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    last: dict[str, Any] = {}
    keys: set[str] | None = None
    for p in paths:
        last = load(p)
        if keys is None:
            keys = set(last["model"])
        elif set(last["model"]) != keys:
            raise UserError(f"{p}: holds different parameters from {paths[0]}")
        for k, v in last["model"].items():
            if k in sums and v.shape != sums[k].shape:
                raise UserError(
                    f"{p}: {k} has shape {tuple(v.shape)}, not {tuple(sums[k].shape)} as in {paths[0]}"
                )
            if v.is_floating_point():
                sums[k] = sums[k] + v.double() if k in sums else v.double()
    model = {
        k: (sums[k] / len(paths)).to(v.dtype) if k in sums else v for k, v in last["model"].items()
    }
    out: dict[str, Any] = {key: last[key] for key in ("config", "vocab") if key in last}
    out["model"] = model
    out["averaged"] = [str(p) for p in paths]
    return out


def last_checkpoints(run_dir: str | Path, last: int) -> list[Path]:
    """The newest ``last`` step checkpoints of a run folder; a UserError when there are none."""
    if last <= 0:
        raise UserError(f"--last must be positive; got {last}")
    found = step_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        raise UserError(f"no checkpoints/step_*.pt in run folder {run_dir}")
    return found[-last:]


def vocab_from_dict(data: dict[str, Any]) -> Vocab:
    """Rebuild a vocabulary saved with its ``to_dict`` (checkpoints carry their vocabulary)."""
    kind = data.get("kind")
    if kind == "char":
        return CharVocab(list(data["symbols"]))
    if kind == "sentencepiece":
        return SentencePieceVocab.from_dict(data)
    if kind == "tokens":
        return TokenVocab(list(data["tokens"]))
    if kind == "pair":
        return VocabPair(vocab_from_dict(data["source"]), vocab_from_dict(data["target"]))
    raise ValueError(f"unknown vocabulary kind {kind!r}")


def load_model(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[Seq2Seq, Vocab, Config]:
    """(model in eval mode, vocabulary, Config) from a checkpoint file or run folder."""
    data = load(path)
    cfg = from_dict(data["config"], source=str(path), stored=True)
    vocab = vocab_from_dict(data["vocab"])
    src_size, tgt_size = vocab_sizes(vocab)
    model = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    model.load_state_dict(data["model"])
    return model.to(device).eval(), vocab, cfg

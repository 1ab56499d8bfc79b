"""The model a checkpoint file holds: its vocabulary and config (``load_model``), its weights as
safetensors (``save_safetensors``, ``load_safetensors``), and ``convert`` of older files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from transduce.architectures import Seq2Seq, build_model
from transduce.checkpoint.files import (
    FORMAT,
    UnsafeCheckpoint,
    _read_archive,
    _resolve,
    _unpickle_trusted,
    _write_atomic,
    load,
    save,
    to_plain,
)
from transduce.config import Config, from_dict
from transduce.data.marian_vocab import MarianVocab
from transduce.data.subword import SentencePieceVocab
from transduce.data.vocab import CharVocab, TokenVocab, Vocab, VocabPair, vocab_sizes
from transduce.errors import UserError


def vocab_from_dict(data: dict[str, Any]) -> Vocab:
    """Rebuild a vocabulary saved with its ``to_dict`` (checkpoints carry their vocabulary)."""
    kind = data.get("kind")
    if kind == "char":
        return CharVocab(list(data["symbols"]))
    if kind == "sentencepiece":
        return SentencePieceVocab.from_dict(data)
    if kind == "tokens":
        return TokenVocab(list(data["tokens"]))
    if kind == "marian":  # a model imported from Marian (transduce.export.huggingface)
        return MarianVocab.from_dict(data)
    if kind == "pair":
        return VocabPair(vocab_from_dict(data["source"]), vocab_from_dict(data["target"]))
    raise ValueError(f"unknown vocabulary kind {kind!r}")


def _parts(p: Path, data: dict[str, Any]) -> tuple[Config, Vocab]:
    """The Config and vocabulary of a loaded file; a UserError naming it if they are damaged."""
    cfg = from_dict(data["config"], source=str(p), stored=True)
    try:
        vocab = vocab_from_dict(data["vocab"])
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the file holds, it is the file's fault
        raise UserError(f"{p}: damaged vocabulary ({type(e).__name__}: {e})") from None
    return cfg, vocab


def _tied(cfg: Config, vocab: Vocab) -> dict[str, str]:
    """State-dict names that are the same tensor as an earlier name (alias -> first name)."""
    src_size, tgt_size = vocab_sizes(vocab)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in first:
            tied[name] = first[id(t)]
        else:
            first[id(t)] = name
    return tied


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UserError(
            "safetensors files need the safetensors package: pip install safetensors"
        ) from None
    return safetensors.torch


def safetensors_available() -> bool:
    try:
        _safetensors()
    except UserError:
        return False
    return True


def save_safetensors(state: dict[str, Any], path: str | Path) -> None:
    """Write the model of ``state`` (a model file or checkpoint) as safetensors, atomically:
    every tensor once (tied weights under their first name; ``transduce.tied`` in the metadata
    maps the other names to it), and the config and vocabulary as JSON in the metadata
    (``transduce.config``, ``transduce.vocab``)."""
    st = _safetensors()
    p = Path(path)
    cfg, vocab = _parts(p, state)
    tied = _tied(cfg, vocab)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state["model"].items() if k not in tied}
    metadata = {
        "format": "pt",
        "transduce.format": str(FORMAT),
        "transduce.config": json.dumps(state["config"]),
        "transduce.vocab": json.dumps(state["vocab"]),
        "transduce.tied": json.dumps(tied),
    }
    _write_atomic(p, lambda f: f.write(st.save(tensors, metadata=metadata)))


def save_model_file(state: dict[str, Any], path: str | Path) -> None:
    """``state`` (a model file's config, vocab and model) written as ``path`` names it:
    safetensors for a name ending ``.safetensors`` (``save_safetensors``: what ``load_model``
    reads by that name), transduce's archive otherwise (``save``). A folder, or a write that
    fails, is a UserError naming ``path`` (not the temporary file beside it)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p}: is a folder; name the model file to write")
    try:
        if p.suffix == ".safetensors":
            save_safetensors(state, p)
        else:
            save(state, p)
    except OSError as e:
        raise UserError(f"{p}: cannot write ({e.strerror or e})") from None


def load_safetensors(path: str | Path) -> dict[str, Any]:
    """A ``save_safetensors`` file as a model file's dict (format, config, vocab, model)."""
    st = _safetensors()
    p = Path(path)
    if not p.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        from safetensors import safe_open

        with safe_open(str(p), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = st.load_file(str(p))
    except Exception as e:  # noqa: BLE001 - a damaged file
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"{p}: not a readable safetensors file ({type(e).__name__}: {detail})"
        ) from None
    try:
        config = json.loads(metadata["transduce.config"])
        vocab = json.loads(metadata["transduce.vocab"])
        tied = json.loads(metadata.get("transduce.tied", "{}"))
    except (KeyError, ValueError):
        raise UserError(
            f"{p}: not a transduce safetensors file (no config and vocabulary in its metadata)"
        ) from None
    for alias, name in tied.items():
        if name not in tensors:
            raise UserError(f"{p}: {alias} is tied to {name}, which the file lacks")
        tensors[alias] = tensors[name]
    return {"format": FORMAT, "config": config, "vocab": vocab, "model": tensors}


def read_model_file(path: str | Path) -> dict[str, Any]:
    """A model file's dict (config, vocab, model): a ``.safetensors`` file of
    ``save_safetensors``, else a checkpoint or model file in the safe format (a run folder: its
    ``model.pt``)."""
    p = Path(path)
    return load_safetensors(p) if p.suffix == ".safetensors" else load(p)


def load_model(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[Seq2Seq, Vocab, Config]:
    """(model in eval mode, vocabulary, Config) from a checkpoint file, a run folder (its
    ``model.pt``) or a ``.safetensors`` file of ``save_safetensors``."""
    p = Path(path)
    model, vocab, cfg = _model_of(p, read_model_file(p))
    return model.to(device).eval(), vocab, cfg


def _model_of(p: Path, data: dict[str, Any]) -> tuple[Seq2Seq, Vocab, Config]:
    """(model, vocabulary, Config) that the loaded file ``p`` holds; a UserError naming it if its
    config, vocabulary or weights are damaged, do not fit together or are not finite."""
    cfg, vocab = _parts(p, data)
    src_size, tgt_size = vocab_sizes(vocab)
    model = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    try:
        model.load_state_dict(data["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        first = (str(e).strip().splitlines() or [""])[-1].strip()[:200]
        raise UserError(f"{p}: its weights do not fit its own config ({first})") from None
    check_finite(p, data["model"])
    return model, vocab, cfg


def check_finite(path: str | Path, weights: dict[str, Any]) -> None:
    """A UserError naming ``path`` when a floating tensor of ``weights`` holds NaN or infinity:
    such a model decodes garbage or fails deep inside a search (training never saves one)."""
    bad = [
        k
        for k, v in weights.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(v.isfinite().all())
    ]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UserError(f"{path}: weights hold NaN or infinity ({shown}); not a usable model")


def convert(old: str | Path, new: str | Path, *, trust: bool = False) -> dict[str, Any]:
    """Rewrite the checkpoint ``old`` in the safe format as ``new`` (``.safetensors``: the model
    alone, see ``save_safetensors``), then read ``new`` back the safe way.

    Without ``trust`` only what ``torch.load(weights_only=True)`` reads is converted (a file of
    an older transduce that held tensors and plain data, just no ``format`` key); with it, the
    file is unpickled the general way, which runs any code it names: only for files whose
    source you trust. NumPy values become lists and numbers (random states included; resuming
    from the new file is exact). Returns a summary."""
    p = _resolve(old)
    out = Path(new)
    try:  # a .safetensors file holds tensors and JSON alone: safe as it is
        data = load_safetensors(p) if p.suffix == ".safetensors" else _read_archive(p)
        unpickled = False
    except UnsafeCheckpoint:
        if not trust:
            raise UserError(
                f"{p}: holds Python objects beyond tensors and plain data, and reading it runs "
                "code the file names: add --trust only if you trust its source"
            ) from None
        data, unpickled = _unpickle_trusted(p), True
    if not isinstance(data, dict) or "model" not in data or "config" not in data:
        raise UserError(f"{p}: not a transduce checkpoint (no model/config inside)")
    if data.get("format") not in (None, FORMAT):
        raise UserError(
            f"{p}: checkpoint format {data['format']!r} is not one this transduce knows"
        )
    try:
        plain = to_plain({k: v for k, v in data.items() if k != "format"})
    except TypeError as e:
        raise UserError(f"{p}: cannot convert: {e}") from None
    _model_of(p, plain)  # a file that holds no usable model is not converted into one
    try:
        if out.suffix == ".safetensors":
            save_safetensors(plain, out)
            load_safetensors(out)
        else:
            save(plain, out)
            load(out)
    except OSError as e:
        raise UserError(f"{out}: cannot write ({e.strerror or e})") from None
    kind = "training checkpoint" if "optimizer" in plain else "model"
    return {
        "input": str(p),
        "output": str(out),
        "format": FORMAT,
        "kind": kind,
        "unpickled": unpickled,
    }

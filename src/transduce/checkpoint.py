"""Model files and checkpoints: a safe file format, atomic writes, the last K kept, loading with
clear errors, averaging (section 6.1), and the model and vocabulary a file holds
(``load_model``).

**The format.** Every file transduce writes is a ``torch.save`` archive of one dict holding only
tensors and plain data (dict, list, tuple, str, int, float, bool, None, bytes) with
``"format": FORMAT`` (2), read back with ``torch.load(weights_only=True)``: PyTorch's restricted
unpickler, which builds tensors and containers and calls no other code, so a tampered file cannot
run anything. A model file (``model.pt``, ``best.pt``, an average) holds ``format``, ``config``
(``Config.to_dict()``), ``vocab`` (``Vocab.to_dict()``) and ``model`` (the state dict), which is
all that translation needs; a training checkpoint (``checkpoints/step_N.pt``) adds ``optimizer``,
``scaler``, ``progress``, ``rng`` and ``rng_ranks`` (random states as lists and tensors, see
``training/rng.py``) and ``precision`` (as resolved on the device) for resuming; an average adds
``averaged`` (the files averaged).

Files written before format 2 (pickles holding NumPy objects, or dicts without ``format``) are
refused with a one-line UserError naming the remedy, ``transduce convert OLD NEW --trust``
(``convert``): the one place that unpickles a file the general way, only when asked to.

``save_safetensors`` writes the model of a file as safetensors (tied weights stored once, the
config and vocabulary in its metadata) for other tools; ``load_model`` reads those too.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import pickle
import re
import secrets
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from transduce.architectures import Seq2Seq, build_model
from transduce.config import Config, from_dict
from transduce.data.marian_vocab import MarianVocab
from transduce.data.subword import SentencePieceVocab
from transduce.data.vocab import CharVocab, TokenVocab, Vocab, VocabPair, vocab_sizes
from transduce.errors import UserError

# The file format: 2 = only tensors and plain data, loaded with weights_only=True. (The files
# before it, call them 1, were general pickles with no format key.)
FORMAT = 2

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
_PLAIN_SCALARS = (str, int, float, bool, bytes, type(None))


def convert_remedy(path: str | Path) -> str:
    """The command that converts an old file, for error messages."""
    return f"transduce convert {path} NEW.pt --trust"


# --- plain data -----------------------------------------------------------------------------------


def to_plain(obj: Any, where: str = "") -> Any:
    """``obj`` as tensors and plain data only: NumPy arrays become lists (tensors keep their
    dtype), NumPy scalars Python numbers, a tensor subclass (Parameter) a plain tensor; dicts,
    lists and tuples are walked. Anything else is a TypeError naming where it is (``where``:
    the key path so far)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach() if type(obj) is not torch.Tensor else obj
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):  # before the scalars: numpy.float64 is a float subclass
        return obj.item()
    if type(obj) in _PLAIN_SCALARS:  # not subclasses (an IntEnum pickles as its class)
        return obj
    if isinstance(obj, dict):
        out = collections.OrderedDict() if isinstance(obj, collections.OrderedDict) else {}
        for k, v in obj.items():
            if not isinstance(k, str | int):
                raise TypeError(f"{where or 'the file'}: a key of type {type(k).__name__}")
            out[k] = to_plain(v, f"{where}.{k}" if where else str(k))
        metadata = getattr(obj, "_metadata", None)  # a state dict's module versions
        if isinstance(out, collections.OrderedDict) and isinstance(metadata, dict):
            out._metadata = to_plain(metadata, f"{where}._metadata")  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list | tuple):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise TypeError(
        f"{where or 'the file'}: {type(obj).__module__}.{type(obj).__qualname__} "
        "is not a tensor or plain data"
    )


# --- writing --------------------------------------------------------------------------------------


class _KeepsWriteErrors:
    """A binary file that keeps the OSError of a failed write (ENOSPC, a quota): torch.save's
    C++ writer turns it into a RuntimeError, and the caller must see the OSError."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new file ``.NAME.RANDOM.tmp`` beside ``path``, opened for writing, created with mode
    0666 and so given what the umask (and a default ACL) leaves, as open() gives config.json
    beside it: tempfile.mkstemp's 0600 would keep a model file from a server under another uid
    or a colleague on shared storage."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(tempfile.TMP_MAX):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))


def _write_atomic(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            kept = _KeepsWriteErrors(f)
            try:
                write(kept)  # type: ignore[arg-type]  # a file in all that writers use
            except RuntimeError:
                if kept.error is not None:
                    raise kept.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` as ``save_atomic`` does: another rank reading it
    meanwhile sees the old file or the new one, never an empty or half-written one."""
    _write_atomic(Path(path), lambda f: f.write(text.encode("utf-8")))


def save_atomic(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary file in the same folder (created with the mode open() would
    give it), fsync, then rename over ``path``: a reader (or a run killed mid-write) sees the old
    file or the new one, never half of one. Writes ``obj`` as given; checkpoints go through
    ``save``."""
    _write_atomic(Path(path), lambda f: torch.save(obj, f))


def save(state: dict[str, Any], path: str | Path) -> None:
    """Write a model file or checkpoint in the safe format, atomically: ``state`` made plain
    (``to_plain``; anything else is a TypeError, a bug) with ``"format": FORMAT`` added."""
    plain = to_plain(state)
    plain["format"] = FORMAT
    save_atomic(plain, path)


# --- reading --------------------------------------------------------------------------------------


def _resolve(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "model.pt"
    if not p.is_file():
        raise UserError(f"checkpoint not found: {path}")
    return p


class UnsafeCheckpoint(UserError):
    """A file holding objects that only the general unpickler builds (running code to do so)."""


def _read_archive(p: Path) -> Any:
    """``torch.load(weights_only=True)`` of ``p``, or a UserError: a file that is no torch
    archive, or one holding objects beyond tensors and plain data (refused, never unpickled)."""
    try:
        is_archive = zipfile.is_zipfile(p)
    except OSError as e:
        raise UserError(f"{p}: cannot read ({e.strerror or e})") from None
    if not is_archive:
        raise UserError(f"{p}: not a transduce checkpoint (not a torch.save archive, or truncated)")
    try:
        with warnings.catch_warnings():  # e.g. the pickle protocol: one line, the error, is enough
            warnings.simplefilter("ignore")
            return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UnsafeCheckpoint(
            f"{p}: refused: it holds Python objects beyond tensors and plain data, which loading "
            "would run code for (a checkpoint of a transduce before the safe format, or a "
            f"tampered file); only if you trust its source, convert it: {convert_remedy(p)}"
        ) from None
    except Exception as e:  # noqa: BLE001 - any other failure means a damaged file
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(f"{p}: not a readable checkpoint ({type(e).__name__}: {detail})") from None


def _check_format(p: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or "model" not in data or "config" not in data:
        raise UserError(f"{p}: not a transduce checkpoint (no model/config inside)")
    version = data.get("format")
    if version is None:
        raise UserError(
            f"{p}: written before transduce's safe checkpoint format (no format key); "
            f"convert it: {convert_remedy(p)}"
        )
    if version != FORMAT:
        raise UserError(
            f"{p}: checkpoint format {version!r}, this transduce reads format {FORMAT} "
            "(written by another version of transduce?)"
        )
    return data


def load(path: str | Path) -> dict[str, Any]:
    """A model file or checkpoint (or a run folder's ``model.pt``) on the CPU, read with
    ``torch.load(weights_only=True)``: nothing in the file runs. A missing, damaged, old-format
    or unsafe file is a one-line UserError."""
    p = _resolve(path)
    return _check_format(p, _read_archive(p))


def _unpickle_trusted(p: Path) -> Any:
    """The general unpickler, which runs whatever code the file names: ``convert --trust`` only."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(f"{p}: not a readable checkpoint ({type(e).__name__}: {detail})") from None


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
    try:
        data, unpickled = _read_archive(p), False
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


# --- step files -----------------------------------------------------------------------------------


def step_checkpoints(directory: str | Path) -> list[Path]:
    """``step_N.pt`` files in ``directory``, oldest step first."""
    return [p for _, p in _numbered(directory)]


def _numbered(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the ``step_N.pt`` files in ``directory``, oldest step first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_FILE.match(p.name)))


def step_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def prune(
    directory: str | Path, keep_last: int, save_every: int = 0, scheduled_after: int = 0
) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (all of them when it is 0).
    With ``save_every``, first those off its schedule (a step not a multiple of it: written for
    a stop signal) unless newest, so that a preempted and resumed run keeps, and averages, the
    checkpoints an uninterrupted one would; only those after step ``scheduled_after`` (a run
    resumed there with another ``save_every``: the earlier ones kept its own schedule)."""
    if save_every > 0:
        for step, p in _numbered(directory)[:-1]:
            if step > scheduled_after and step % save_every:
                p.unlink(missing_ok=True)
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
    first: dict[str, Any] = {}
    keys: set[str] | None = None
    for p in paths:
        last = load(p)
        if not isinstance(last["model"], dict) or not all(
            isinstance(v, torch.Tensor) for v in last["model"].values()
        ):
            raise UserError(f"{p}: its model is not a mapping of names to tensors")
        _parts(Path(p), last)  # a damaged config or vocabulary: one line naming the file
        check_finite(p, last["model"])
        if keys is None:
            keys, first = set(last["model"]), last
        elif set(last["model"]) != keys:
            raise UserError(f"{p}: holds different parameters from {paths[0]}")
        else:
            _check_same_model(p, last, first, paths[0])
        for k, v in last["model"].items():
            if k in sums and v.shape != sums[k].shape:
                raise UserError(
                    f"{p}: {k} has shape {tuple(v.shape)}, "
                    f"not {tuple(sums[k].shape)} as in {paths[0]}"
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


def _check_same_model(
    path: str | Path, data: dict[str, Any], first: dict[str, Any], first_path: str | Path
) -> None:
    """A UserError unless checkpoint ``data`` has the model architecture and vocabulary of
    ``first``: tensors of equal shapes from models of other vocabularies (or of another norm or
    activation) would average into nonsense in silence."""
    if data.get("vocab") != first.get("vocab"):
        raise UserError(
            f"{path}: its vocabulary is not that of {first_path}; average checkpoints of one run"
        )
    model, first_model = (d.get("config", {}).get("model") for d in (data, first))
    if model != first_model:
        keys = sorted(set(model or {}) | set(first_model or {}))
        differ = [k for k in keys if (model or {}).get(k) != (first_model or {}).get(k)]
        raise UserError(
            f"{path}: its model config differs from {first_path}'s "
            f"({', '.join(differ) or 'model'}); average checkpoints of one run"
        )


def last_checkpoints(run_dir: str | Path, last: int) -> list[Path]:
    """The newest ``last`` step checkpoints of a run folder; a UserError when there are none."""
    if last <= 0:
        raise UserError(f"--last must be positive; got {last}")
    found = step_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        raise UserError(f"no checkpoints/step_*.pt in run folder {run_dir}")
    return found[-last:]


# --- the model a file holds -----------------------------------------------------------------------


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


def load_model(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[Seq2Seq, Vocab, Config]:
    """(model in eval mode, vocabulary, Config) from a checkpoint file, a run folder (its
    ``model.pt``) or a ``.safetensors`` file of ``save_safetensors``."""
    p = Path(path)
    data = load_safetensors(p) if p.suffix == ".safetensors" else load(p)
    model, vocab, cfg = _model_of(p, data)
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

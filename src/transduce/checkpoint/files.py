"""Checkpoint files: the safe format (``FORMAT``: plain data and tensors, read with
``torch.load(weights_only=True)``), atomic writes, reading with one-line errors, and the refusal
of older pickles with their remedy (``transduce.checkpoint``'s docstring)."""

from __future__ import annotations

import collections
import errno
import os
import pickle
import secrets
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from transduce.errors import UserError

FORMAT = 2

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
        marian = (p / "config.json").is_file() and (p / "source.spm").is_file()
        if not (p / "model.pt").is_file() and marian:
            raise UserError(
                f"{path}: a folder with config.json but no model.pt: not a transduce model "
                "(a Hugging Face/Marian folder? transduce import huggingface turns it into one)"
            )
        if not (p / "model.pt").is_file():  # a folder, but not a finished run's
            saved = sorted(p.glob("step_*.pt")) or sorted(p.glob("checkpoints/step_*.pt"))
            hint = f" (its newest step checkpoint: {saved[-1]})" if saved else ""
            raise UserError(
                f"checkpoint not found: {path} is a folder without a model.pt{hint}; name a "
                "model file"
            )
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

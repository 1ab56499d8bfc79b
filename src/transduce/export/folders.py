"""Where an export writes: a new folder, or with ``force`` an earlier transduce export of the same
kind, replaced only when it holds nothing an export does not write (never ".", a run folder,
another tool's model folder, or the model file being exported)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from transduce.errors import UserError

__all__ = ["check_not_inside", "check_replaceable"]


def check_not_inside(model_path: Path, folder: Path) -> None:
    """A UserError if the model ``model_path`` (a file or a run folder) is ``folder`` or lies in
    it: replacing the folder would delete what is being exported."""
    model, out = model_path.resolve(), folder.resolve()
    if model == out or out in model.parents:
        raise UserError(
            f"{model_path} lies in the output folder {folder}: the export would replace it; "
            "write the export elsewhere"
        )


def check_replaceable(
    folder: Path, force: bool, written: frozenset[str], not_ours: Callable[[Path], str | None]
) -> None:
    """A UserError unless ``folder`` may be written: it does not exist, or is empty, or
    ``force`` is given and it is an earlier export (``not_ours``: why it is not one, None when
    it is) holding only files an export writes (``written``)."""
    if folder.exists() and not force:
        raise UserError(f"{folder} already exists; pass --force (force=True) to replace it")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} exists and is not a folder")
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    if not entries:
        return
    why = not_ours(folder)
    if why is not None:
        raise UserError(f"{folder} {why}; not replacing it")
    others = [e.name for e in entries if e.name not in written or not e.is_file()]
    if others:
        raise UserError(
            f"{folder} holds {others[0]!r}, which no export writes; not replacing it (move "
            "what you keep there elsewhere first)"
        )

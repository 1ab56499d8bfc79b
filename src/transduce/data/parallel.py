"""Reading text corpora: one sentence per line, UTF-8, plain or gzip-compressed (``.gz`` suffix).

Every problem with a file is a ``UserError`` that names the file (and the line where there is one):
a missing or unreadable file, a corrupt or truncated gzip stream, invalid UTF-8 (line number and
byte offset), parallel files whose line counts differ.

Lines are split on ``\\n`` only (a U+2028 inside a sentence does not break it), a UTF-8 byte order
mark at the start of a file is dropped, and each line is stripped of surrounding whitespace
(``str.strip``, which also removes a ``\\r`` left by Windows line ends).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from transduce.errors import UserError

__all__ = ["ParallelText", "iter_lines", "read_lines", "read_parallel", "resolve_data_path"]

_BOM = "\ufeff"


@dataclass(frozen=True)
class ParallelText:
    """Aligned sentence pairs: ``source[i]`` translates to ``target[i]``.

    ``skipped`` counts the line pairs dropped because one side (or both) was empty;
    ``skipped_lines`` holds their 1-based line numbers in the files.
    """

    source: list[str]
    target: list[str]
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(zip(self.source, self.target))


def _open_binary(path: Path, name: str, compressed: bool) -> BinaryIO:
    if not path.exists():
        raise UserError(f"{name}: no such file")
    if path.is_dir():
        raise UserError(f"{name}: is a folder, expected a text file")
    try:
        if compressed:
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as e:
        raise UserError(f"{name}: cannot open ({e.strerror or e})") from e


def iter_lines(
    path: str | Path, *, name: str | None = None, compressed: bool | None = None
) -> Iterator[str]:
    """Yield the stripped lines of a UTF-8 text file (``.gz`` files are decompressed).

    Empty lines are yielded (as ``""``) so that line numbers stay meaningful. ``name`` is how
    error messages call the file (default: the path); ``compressed`` says whether it is gzip
    (default: whether the name ends in ``.gz``).
    """
    path = Path(path)
    name = name or str(path)
    if compressed is None:
        compressed = path.suffix == ".gz"
    offset = 0  # byte offset of the current line in the (decompressed) file
    lineno = 0
    with _open_binary(path, name, compressed) as f:
        try:
            for raw in f:
                lineno += 1
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise UserError(
                        f"{name}: line {lineno}: invalid UTF-8 at byte {e.start} of the line "
                        f"(byte offset {offset + e.start} in the "
                        f"{'decompressed ' if compressed else ''}file)"
                    ) from None
                if lineno == 1 and text.startswith(_BOM):
                    text = text[1:]
                offset += len(raw)
                yield text.strip()
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            detail = "truncated" if isinstance(e, EOFError) else str(e)
            raise UserError(
                f"{name}: corrupt gzip file after line {lineno} ({detail})"
            ) from None
        except OSError as e:
            raise UserError(f"{name}: read error after line {lineno} ({e})") from None


def read_lines(path: str | Path) -> list[str]:
    """All stripped lines of a monolingual file, empty lines included (as ``""``), so that an
    output written line by line stays aligned with the input."""
    return list(iter_lines(path))


def read_aligned(first: str | Path, second: str | Path, *, what: str) -> tuple[list[str], list[str]]:
    """The lines of two files that must be line-aligned (empty lines kept); a UserError naming
    both files and both counts when their lengths differ. ``what`` names the pair in it."""
    a, b = read_lines(first), read_lines(second)
    if len(a) != len(b):
        raise UserError(
            f"{what} differ in length: {first} has {len(a)} lines, {second} has {len(b)} lines"
        )
    return a, b


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> ParallelText:
    """Read a sentence-aligned pair of files (plain or ``.gz``).

    Both files must have the same number of lines (else ``UserError`` naming both files and both
    counts). A pair where either side is empty after stripping is skipped as a whole, so the pairs
    stay aligned; how many were skipped is in ``ParallelText.skipped``.
    """
    src, tgt = read_aligned(src_path, tgt_path, what="parallel files")
    source: list[str] = []
    target: list[str] = []
    skipped_lines: list[int] = []
    for i, (s, t) in enumerate(zip(src, tgt), start=1):
        if s and t:
            source.append(s)
            target.append(t)
        else:
            skipped_lines.append(i)
    return ParallelText(source, target, len(skipped_lines), skipped_lines)


_UNSET_VARIABLE = re.compile(r"\$(\w+|\{\w+\})")


def resolve_data_path(value: str, key: str) -> Path:
    """A config path with ``$VAR`` / ``${VAR}`` and ``~`` expanded (relative paths stay relative
    to the current directory); an unset variable is a UserError naming the key."""
    expanded = os.path.expanduser(os.path.expandvars(value))
    m = _UNSET_VARIABLE.search(expanded)
    if m:
        name = m.group(1).strip("{}")
        raise UserError(f"task.{key} = {value!r}: environment variable {name} is not set")
    return Path(expanded)

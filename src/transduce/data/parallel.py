"""Reading text corpora: one sentence per line, UTF-8, plain or gzip-compressed (``.gz`` suffix).

Every problem with a file is a ``UserError`` that names the file (and the line where there is one):
a missing or unreadable file, a folder, a corrupt or truncated gzip stream, invalid UTF-8 (line
number and byte offset), a NUL byte (a binary or UTF-16 file), parallel files whose line counts
differ, and for a corpus (``read_parallel``) an empty file or one of only empty lines.

Lines are split on ``\\n`` only (a U+2028 inside a sentence does not break it; a first line
holding a bare ``\\r``, the line end of classic Mac OS files, is refused), a UTF-8 byte order mark
at the start of a file is dropped, and each line is stripped of surrounding whitespace
(``str.strip``, which also removes a ``\\r`` left by Windows line ends). Byte order marks and
CRLF line ends are counted (``LineStats``) so that a run can say what it normalised.
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

__all__ = [
    "GZIP_MAGIC",
    "LineStats",
    "ParallelText",
    "check_line",
    "iter_lines",
    "read_aligned",
    "read_lines",
    "read_parallel",
    "resolve_data_path",
]

_BOM = "\ufeff"
GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip file


@dataclass
class LineStats:
    """What reading normalised: lines that ended in ``\\r\\n``, files that began with a byte
    order mark."""

    crlf_lines: int = 0
    boms: int = 0

    def describe(self) -> str:
        """``"3 CRLF line ends, 1 byte order mark"`` (``""`` when there was nothing)."""
        parts = []
        if self.crlf_lines:
            parts.append(f"{self.crlf_lines} CRLF line end{'s' * (self.crlf_lines != 1)}")
        if self.boms:
            parts.append(f"{self.boms} byte order mark{'s' * (self.boms != 1)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ParallelText:
    """Aligned sentence pairs: ``source[i]`` translates to ``target[i]``.

    ``skipped`` counts the line pairs dropped because one side (or both) was empty;
    ``skipped_lines`` holds their 1-based line numbers in the files. ``normalised`` counts the
    CRLF line ends and byte order marks of both files (dropped, as ``read_lines`` does).
    """

    source: list[str]
    target: list[str]
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)
    normalised: LineStats = field(default_factory=LineStats, compare=False)

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


def check_line(text: str, name: str, lineno: int, *, written: bool = False) -> None:
    """A UserError naming line ``lineno`` of ``name`` if ``text`` (the line as read, its line end
    included) holds a NUL character (a binary file, or UTF-16 read as UTF-8) or, on line 1, a
    carriage return followed by more text: lines end in ``\\n``, so a file whose lines end in a
    bare ``\\r`` (classic Mac OS) would be one line. Every reader of text lines asks it (files
    and stdin). A stray ``\\r`` on a later line is left to ``str.strip`` or the tokenizer, and
    so is one on line 1 of a file transduce ``written`` (its lines end in ``\\n``)."""
    nul = text.find("\0")
    if nul >= 0:
        raise UserError(
            f"{name}: line {lineno}: NUL byte at character {nul + 1} of the line "
            "(a binary file, or text in UTF-16 rather than UTF-8?)"
        )
    if lineno == 1 and not written:
        cr = text.rstrip("\r\n").find("\r")
        if cr >= 0:
            raise UserError(
                f"{name}: line 1: carriage return (\\r) at character {cr + 1}, followed by more "
                "text: lines must end in \\n or \\r\\n, and a file whose lines end in \\r alone "
                "would be read as one line (convert it: tr '\\r' '\\n' < IN > OUT)"
            )


def iter_lines(
    path: str | Path,
    *,
    name: str | None = None,
    compressed: bool | None = None,
    stats: LineStats | None = None,
    written: bool = False,
) -> Iterator[str]:
    """Yield the stripped lines of a UTF-8 text file (``.gz`` files are decompressed).

    Empty lines are yielded (as ``""``) so that line numbers stay meaningful. ``name`` is how
    error messages call the file (default: the path); ``compressed`` says whether it is gzip
    (default: whether the name ends in ``.gz``); ``stats``, when given, counts the CRLF line
    ends and the byte order mark; ``written``: a file transduce wrote from the lines of others
    (its line 1 read as any other line: once a later line there, as ``check_line`` says).
    """
    path = Path(path)
    name = name or str(path)
    if compressed is None:
        compressed = path.suffix.lower() == ".gz"
    offset = 0  # byte offset of the current line in the (decompressed) file
    lineno = 0
    with _open_binary(path, name, compressed) as f:
        try:
            for raw in f:
                lineno += 1
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    if lineno == 1 and raw.startswith(GZIP_MAGIC) and not compressed:
                        raise UserError(
                            f"{name}: gzip data in a file not named .gz (name it so, or "
                            "decompress it)"
                        ) from None
                    raise UserError(
                        f"{name}: line {lineno}: invalid UTF-8 at byte {e.start} of the line "
                        f"(byte offset {offset + e.start} in the "
                        f"{'decompressed ' if compressed else ''}file)"
                    ) from None
                check_line(text, name, lineno, written=written)
                if lineno == 1 and not written and text.startswith(_BOM):
                    text = text[1:]
                    if stats is not None:
                        stats.boms += 1
                if stats is not None and text.endswith("\r\n"):
                    stats.crlf_lines += 1
                offset += len(raw)
                yield text.strip()
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            detail = "truncated" if isinstance(e, EOFError) else str(e)
            raise UserError(f"{name}: corrupt gzip file after line {lineno} ({detail})") from None
        except OSError as e:
            raise UserError(f"{name}: read error after line {lineno} ({e})") from None


def read_lines(
    path: str | Path, *, stats: LineStats | None = None, written: bool = False
) -> list[str]:
    """All stripped lines of a monolingual file, empty lines included (as ``""``), so that an
    output written line by line stays aligned with the input (``written``: as ``iter_lines``)."""
    return list(iter_lines(path, stats=stats, written=written))


def read_aligned(
    first: str | Path, second: str | Path, *, what: str, stats: LineStats | None = None
) -> tuple[list[str], list[str]]:
    """The lines of two files that must be line-aligned (empty lines kept); a UserError naming
    both files and both counts when their lengths differ. ``what`` names the pair in it."""
    a, b = read_lines(first, stats=stats), read_lines(second, stats=stats)
    _same_length(first, a, second, b, what)
    return a, b


def _same_length(
    first: str | Path, a: list[str], second: str | Path, b: list[str], what: str
) -> None:
    if len(a) != len(b):
        raise UserError(
            f"{what} differ in length: {first} has {len(a)} lines, {second} has {len(b)} lines"
        )


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> ParallelText:
    """Read a sentence-aligned pair of files (plain or ``.gz``).

    Both files must have the same number of lines (else ``UserError`` naming both files and both
    counts), and neither may be empty or hold only empty lines. A pair where either side is empty
    after stripping is skipped as a whole, so the pairs stay aligned; how many were skipped is in
    ``ParallelText.skipped``.
    """
    stats = LineStats()
    src, tgt = read_lines(src_path, stats=stats), read_lines(tgt_path, stats=stats)
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not lines:
            raise UserError(f"{path}: empty file (no lines)")
        if not any(lines):
            raise UserError(f"{path}: all {len(lines)} lines are empty")
    _same_length(src_path, src, tgt_path, tgt, "parallel files")
    source: list[str] = []
    target: list[str] = []
    skipped_lines: list[int] = []
    for i, (s, t) in enumerate(zip(src, tgt), start=1):
        if s and t:
            source.append(s)
            target.append(t)
        else:
            skipped_lines.append(i)
    return ParallelText(source, target, len(skipped_lines), skipped_lines, stats)


_UNSET_VARIABLE = re.compile(r"\$(\w+|\{\w+\})")


def resolve_data_path(value: str, key: str, *, must_exist: bool = True) -> Path:
    """A config path with ``$VAR`` / ``${VAR}`` and ``~`` expanded (relative paths stay relative
    to the current directory); an unset variable, or (``must_exist``) a path where nothing is, is
    a UserError naming the key."""
    expanded = os.path.expanduser(os.path.expandvars(value))
    m = _UNSET_VARIABLE.search(expanded)
    if m:
        name = m.group(1).strip("{}")
        raise UserError(f"task.{key} = {value!r}: environment variable {name} is not set")
    if must_exist and not os.path.exists(expanded):
        raise UserError(f"task.{key}: {expanded}: no such file or folder")
    return Path(expanded)

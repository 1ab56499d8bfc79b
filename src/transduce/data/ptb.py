"""The Penn Treebank sample that NLTK distributes (``treebank.zip``: WSJ files wsj_0001-wsj_0199,
about 5% of the treebank, 3,914 sentences), read into cleaned trees and split by file.

The split is fixed by file number, in order, as the full treebank's standard split is by
section: wsj_0001-0159 train (3,396 sentences), wsj_0160-0179 dev (273), wsj_0180-0199 test
(245). The sample stands in for the full WSJ treebank (LDC licence) of section 6.3 of
"Attention Is All You Need"; its scores are not comparable to the paper's section-23 figures.

``prepare_ptb_sample`` puts ``treebank.zip`` into a folder (downloaded from its public home,
``PTB_SAMPLE_URL``, or copied from a local mirror) and writes per split ``{split}.words`` (one
sentence per line, words separated by single spaces) and ``{split}.trees`` (the cleaned gold
trees, one per line, ``(TOP (S (NP (DT The) (NN cat)) ...))``). Every file is written to a
temporary name first and renamed when complete, so an interrupted run leaves no partial file.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transduce.data.download import download
from transduce.data.trees import Tree, parse_trees, read_tree_file, to_brackets
from transduce.errors import UserError

__all__ = [
    "PTB_SAMPLE_URL",
    "SPLITS",
    "SPLIT_SIZES",
    "MrgFile",
    "prepare_ptb_sample",
    "read_treebank",
    "split_of",
    "split_treebank",
]

PTB_SAMPLE_URL = (
    "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/treebank.zip"
)
SPLITS = {"train": (1, 159), "dev": (160, 179), "test": (180, 199)}  # wsj file numbers
SPLIT_SIZES = {"train": 3396, "dev": 273, "test": 245}  # sentences of the NLTK sample
_WSJ_NAME = re.compile(r"wsj_(\d{4})\.mrg")


@dataclass(frozen=True)
class MrgFile:
    """The cleaned trees of one ``.mrg`` file; ``name`` is its base name (``wsj_0001.mrg``)."""

    name: str
    trees: tuple[Tree, ...]


def split_of(name: str) -> str | None:
    """The split (``train``, ``dev``, ``test``) of a file named ``wsj_NNNN.mrg``; None for a
    name of another form or a number outside 1-199."""
    m = _WSJ_NAME.fullmatch(name)
    if m is None:
        return None
    number = int(m.group(1))
    for split, (first, last) in SPLITS.items():
        if first <= number <= last:
            return split
    return None


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{name}: line {line}: invalid UTF-8 (byte offset {e.start})") from None


def _read_zip(path: Path, shown: str) -> list[MrgFile]:
    """The .mrg files of the zip at ``path``; errors call it ``shown``."""
    try:
        with zipfile.ZipFile(path) as z:
            members = sorted(
                (m for m in z.infolist() if m.filename.endswith(".mrg") and not m.is_dir()),
                key=lambda m: (Path(m.filename).name, m.filename),
            )
            out = []
            for m in members:
                name = f"{shown}:{m.filename}"
                text = _decode(z.read(m), name)
                trees = tuple(parse_trees(text, name=name, clean=True))
                out.append(MrgFile(Path(m.filename).name, trees))
            return out
    # (a damaged member: zlib.error; one marked encrypted: RuntimeError; an unknown
    # compression method: NotImplementedError)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        ValueError,
        zlib.error,
        RuntimeError,
        NotImplementedError,
    ) as e:
        raise UserError(f"{shown}: corrupt or not a zip file ({e})") from None
    except OSError as e:
        raise UserError(f"{shown}: cannot read ({e.strerror or e})") from None


def _read_folder(folder: Path) -> list[MrgFile]:
    paths = sorted(folder.rglob("*.mrg"), key=lambda p: (p.name, str(p)))
    return [MrgFile(p.name, tuple(read_tree_file(p, clean=True))) for p in paths if p.is_file()]


def read_treebank(source: str | Path, shown: str | None = None) -> list[MrgFile]:
    """The cleaned trees of every ``.mrg`` file in ``source``, a zip file (``treebank.zip``) or
    a folder (searched recursively), sorted by file name.

    ``UserError`` for a missing source, a corrupt zip, a file that is not UTF-8 or holds
    malformed brackets (naming the file and line), or a source without ``.mrg`` files; errors
    call the source ``shown`` (default: its path), e.g. the file it was copied from.
    """
    source = Path(source)
    shown = shown or str(source)
    if not source.exists():
        raise UserError(
            f"{source}: no such file or folder (expected treebank.zip or a folder of .mrg files)"
        )
    files = _read_folder(source) if source.is_dir() else _read_zip(source, shown)
    if not files:
        raise UserError(f"{shown}: no .mrg files (expected the Penn Treebank's combined/wsj_*.mrg)")
    return files


def split_treebank(files: Sequence[MrgFile]) -> dict[str, list[Tree]]:
    """The trees of ``files`` by split (``SPLITS``), in file order; files of no split (another
    name, a number above 199) are left out."""
    out: dict[str, list[Tree]] = {split: [] for split in SPLITS}
    for f in files:
        split = split_of(f.name)
        if split is not None:
            out[split].extend(f.trees)
    return out


def _mirror_zip(folder: Path) -> Path:
    for candidate in (folder / "treebank.zip", folder / "ptb-sample" / "treebank.zip"):
        if candidate.is_file():
            return candidate
    raise UserError(f"{folder}: no treebank.zip (looked in {folder} and {folder / 'ptb-sample'})")


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _checked_trees(path: Path, shown: str) -> list[MrgFile]:
    """The trees of the zip at ``path``, each split holding some; a UserError naming ``shown``
    otherwise."""
    files = read_treebank(path, shown)  # every member decompresses (CRC-checked), parses
    empty = [split for split, trees in split_treebank(files).items() if not trees]
    if empty:  # a zip of other files
        first, last = SPLITS[empty[0]]
        raise UserError(
            f"{shown}: no trees of the {empty[0]} split (its wsj_{first:04d}-"
            f"wsj_{last:04d}.mrg files)"
        )
    return files


def _fetch_zip(
    dest: Path, from_folder: Path | None, url: str, timeout: float, force: bool
) -> list[MrgFile]:
    """Put ``treebank.zip`` into ``dest`` (copied or downloaded, read, then renamed); returns
    what it holds. A zip already there that reads and splits is kept, unless ``force``."""
    target = dest / "treebank.zip"
    if not force and target.is_file():
        try:
            return _checked_trees(target, str(target))
        except UserError:
            pass  # broken or not the sample: fetched again below
    tmp = dest / f".treebank.zip.{os.getpid()}.part"
    try:
        if from_folder is not None:
            source = _mirror_zip(from_folder)
            shown = str(source)
            try:
                shutil.copyfile(source, tmp)
            except OSError as e:
                raise UserError(f"cannot copy {source} to {dest}: {e.strerror or e}") from None
        else:
            shown = url
            download(
                url,
                tmp,
                timeout=timeout,
                progress=False,
                offline_hint="without network, copy treebank.zip from a local mirror with "
                "--from DIR (from_folder in Python)",
            )
        files = _checked_trees(tmp, shown)  # refused before anything is kept or written
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return files


def prepare_ptb_sample(
    dest: str | Path,
    from_folder: str | Path | None = None,
    *,
    url: str = PTB_SAMPLE_URL,
    timeout: float = 60.0,
    force: bool = False,
) -> dict[str, int]:
    """Fetch ``treebank.zip`` into ``dest`` and write the split files there.

    With ``from_folder`` the zip is copied from ``from_folder/treebank.zip`` (or
    ``from_folder/ptb-sample/treebank.zip``); otherwise it is downloaded from ``url`` (any URL
    urllib opens, ``file://`` included); a ``treebank.zip`` already in ``dest`` that reads and
    splits is used as it is, unless ``force``. Writes ``{train,dev,test}.words`` and
    ``{train,dev,test}.trees`` (module docstring). Returns the number of sentences per split.
    """
    dest = Path(dest)
    folder = Path(from_folder) if from_folder is not None else None
    if folder is not None and not folder.is_dir():
        raise UserError(
            f"{folder}: no such folder (--from DIR, the folder holding treebank.zip; "
            "from_folder in Python)"
        )
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{dest}: cannot create folder ({e.strerror or e})") from None
    splits = split_treebank(_fetch_zip(dest, folder, url, timeout, force))
    for split, trees in splits.items():
        _write_lines(dest / f"{split}.words", [" ".join(t.words()) for t in trees])
        _write_lines(dest / f"{split}.trees", [to_brackets(t) for t in trees])
    return {split: len(trees) for split, trees in splits.items()}

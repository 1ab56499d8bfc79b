"""Multi30k, task 1 (Elliott et al., 2016): image descriptions in English, German, French and
Czech, sentence-aligned, raw (untokenized) UTF-8, one sentence per line, gzip-compressed.

``fetch_multi30k`` puts the files of one language pair into a folder, either copied from a local
mirror (``from_dir``) or downloaded from the dataset's public home (``BASE_URL``), and checks each
one: it must decompress, which checks gzip's CRC-32 and length of the content (a changed or
truncated file fails), be UTF-8 and have the split's known number of lines. No content hash is
pinned, so a revision upstream with the same splits still fetches. Files keep their
public names (``train.en.gz``, ``val.de.gz``, ``test_2016_flickr.en.gz`` ...). A file already in
the destination that passes the checks is kept; a broken one is fetched again. Every file is
written to a temporary name and renamed once checked, so an interrupted fetch leaves no partial
file behind.

The standard benchmark is en->de: train on ``train``, tune on ``val``, report on
``test_2016_flickr`` with sacreBLEU (``transduce.evaluation.bleu``).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from transduce.console import is_terminal
from transduce.data.download import download
from transduce.data.parallel import iter_lines
from transduce.errors import UserError

__all__ = [
    "BASE_URL",
    "LANGUAGES",
    "SPLITS",
    "SPLIT_SIZES",
    "Multi30k",
    "fetch_multi30k",
    "multi30k_paths",
    "split_languages",
]

BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
LANGUAGES = ("en", "de", "fr", "cs")
SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")
SPLIT_SIZES = {"train": 29000, "val": 1014, "test_2016_flickr": 1000, "test_2017_flickr": 1000}
_SPLIT_LANGUAGES = {"test_2017_flickr": ("en", "de", "fr")}  # no Czech for 2017


def split_languages(split: str) -> tuple[str, ...]:
    """The languages a split exists in."""
    _check_split(split)
    return _SPLIT_LANGUAGES.get(split, LANGUAGES)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown Multi30k split {split!r}; choose from {', '.join(SPLITS)}")


def _check_language(lang: str) -> None:
    if lang not in LANGUAGES:
        raise UserError(f"Multi30k has no language {lang!r}; choose from {', '.join(LANGUAGES)}")


def multi30k_paths(root: str | Path, split: str, lang: str) -> Path:
    """Where ``fetch_multi30k`` puts (or a mirror holds) one file: ``root/{split}.{lang}.gz``."""
    _check_split(split)
    _check_language(lang)
    if lang not in split_languages(split):
        have = ", ".join(split_languages(split))
        raise UserError(f"Multi30k {split} has no {lang!r} side (it has {have})")
    return Path(root) / f"{split}.{lang}.gz"


@dataclass(frozen=True)
class Multi30k:
    """The fetched files of one language pair: ``files[split][lang]`` is a path."""

    root: Path
    src: str
    tgt: str
    files: dict[str, dict[str, Path]]

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.files)

    def pair(self, split: str) -> tuple[Path, Path]:
        """(source path, target path) of a split, e.g. for ``read_parallel``."""
        if split not in self.files:
            raise UserError(
                f"Multi30k {self.src}-{self.tgt} has no split {split!r}; "
                f"it has {', '.join(self.files)}"
            )
        return self.files[split][self.src], self.files[split][self.tgt]


def _verify(path: Path, expected: int, name: str) -> None:
    """Decompress and decode the whole file; UserError naming ``name`` if anything is wrong."""
    n = sum(1 for _ in iter_lines(path, name=name, compressed=True))
    if n != expected:
        raise UserError(
            f"{name}: {n} lines, expected {expected}; the file is incomplete or not the "
            "Multi30k release"
        )


def _is_valid(path: Path, expected: int) -> bool:
    try:
        _verify(path, expected, str(path))
    except UserError:
        return False
    return True


def _mirror_file(from_dir: Path, name: str) -> Path:
    for candidate in (from_dir / name, from_dir / "multi30k" / name):
        if candidate.is_file():
            return candidate
    raise UserError(f"{from_dir}: no {name} (looked in {from_dir} and {from_dir / 'multi30k'})")


def fetch_multi30k(
    dest: str | Path,
    *,
    src: str = "en",
    tgt: str = "de",
    from_dir: str | Path | None = None,
    base_url: str = BASE_URL,
    progress: bool = True,
    force: bool = False,
    timeout: float = 60.0,
) -> Multi30k:
    """Fetch the ``src`` and ``tgt`` files of every split into ``dest`` and check them.

    Splits: train, val, test_2016_flickr, and test_2017_flickr when both languages have it
    (Czech does not). With ``from_dir`` the files are copied from that folder (or its
    ``multi30k/`` subfolder); otherwise they are downloaded from ``base_url`` + file name (any
    URL urllib opens, ``file://`` included). ``force`` fetches again files that are already
    there and valid. Returns where the files are.
    """
    _check_language(src)
    _check_language(tgt)
    if src == tgt:
        raise UserError(f"source and target language are both {src!r}; choose two different ones")
    dest = Path(dest)
    mirror = Path(from_dir) if from_dir is not None else None
    if mirror is not None and not mirror.is_dir():
        raise UserError(
            f"{mirror}: no such folder (--from DIR, the local Multi30k mirror; from_dir in Python)"
        )
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{dest}: cannot create folder ({e.strerror or e})") from None
    if not base_url.endswith("/"):
        base_url += "/"

    files: dict[str, dict[str, Path]] = {}
    for split in SPLITS:
        langs = split_languages(split)
        if src not in langs or tgt not in langs:
            continue
        expected = SPLIT_SIZES[split]
        files[split] = {}
        for lang in (src, tgt):
            target = multi30k_paths(dest, split, lang)
            files[split][lang] = target
            if not force and target.is_file() and _is_valid(target, expected):
                continue
            tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
            try:
                if mirror is not None:
                    source = _mirror_file(mirror, target.name)
                    name = str(source)
                    try:
                        shutil.copyfile(source, tmp)
                    except OSError as e:
                        raise UserError(
                            f"cannot copy {source} to {dest}: {e.strerror or e}"
                        ) from None
                else:
                    name = base_url + target.name
                    download(
                        name,
                        tmp,
                        timeout=timeout,
                        progress=progress,
                        offline_hint="without network, copy the files from a local mirror "
                        "with --from DIR (from_dir in Python)",
                    )
                _verify(tmp, expected, name)
                os.replace(tmp, target)
                # the bar's news, where no bar shows: off a terminal, and for a copy
                if progress and (mirror is not None or not is_terminal()):
                    print(
                        f"transduce: {target}: {expected} lines, checked",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                tmp.unlink(missing_ok=True)
    return Multi30k(dest, src, tgt, files)

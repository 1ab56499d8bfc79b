"""WMT 2014 English-German and English-French, the paper's corpora, from their public homes.

``fetch_wmt14`` downloads the archives (or copies them from a local mirror folder), resumably:
an archive is fetched into ``downloads/NAME.part``, continued from its size on the next try
(an HTTP ``Range`` request, or a seek in a local file), and renamed to ``downloads/NAME`` once
complete and checked. MD5 sums are checked where they are published (the test sets, as pinned
by sacreBLEU); statmt.org publishes none for the training corpora, so those are checked by
being read as complete archives. A resumed archive that fails its MD5 is fetched once more from
the start. Then it writes, in ``dest``:

* ``train.{SRC}`` and ``train.{TGT}``: the training corpora one after another, line-aligned
  (each corpus's two sides must have the same number of lines), uncleaned: ``transduce
  prepare`` cleans them;
* ``newstest2013.{..}`` (the paper's development set) and ``newstest2014.{..}`` (its test
  set), plain text from the SGML files as sacreBLEU extracts them;
* ``wmt14.json``: the archives with their URLs, sizes and SHA-256, and the line counts.

Each is written under a ``.part`` name and renamed once all are whole, ``wmt14.json`` last (an
earlier one is removed first): an interrupted run leaves no shortened file a record vouches for.

The URLs below are the WMT 2014 task page's (https://www.statmt.org/wmt14/translation-task.html)
and could not be checked from the machine this was written on (no network); the tests run the
same code against a local mirror.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from transduce.errors import UserError

__all__ = ["ARCHIVES", "PAIRS", "PUBLISHED_MD5", "fetch_wmt14"]

ARCHIVES = {  # file name -> public URL
    "training-parallel-europarl-v7.tgz": "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v9.tgz": "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "training-parallel-un.tgz": "https://www.statmt.org/wmt13/training-parallel-un.tgz",
    "training-giga-fren.tar": "https://www.statmt.org/wmt10/training-giga-fren.tar",
    "test.tgz": "https://www.statmt.org/wmt13/test.tgz",  # newstest2013
    "test-full.tgz": "https://www.statmt.org/wmt14/test-full.tgz",  # newstest2014
}
PUBLISHED_MD5 = {  # as sacreBLEU pins them (its wmt13 and wmt14 test sets)
    "test.tgz": "48eca5d02f637af44e85186847141f67",
    "test-full.tgz": "a8cd784e006feb32ac6f3d9ec7eb389a",
}
# pair -> (archive, member with {l} for the language) of each training corpus, in order
_TRAIN = {
    "en-de": [
        ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en.{l}"),
        ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.{l}"),
        ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en.{l}"),
    ],
    "en-fr": [
        ("training-parallel-europarl-v7.tgz", "training/europarl-v7.fr-en.{l}"),
        ("training-parallel-commoncrawl.tgz", "commoncrawl.fr-en.{l}"),
        ("training-parallel-un.tgz", "un/undoc.2000.fr-en.{l}"),
        ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.fr-en.{l}"),
        ("training-giga-fren.tar", "giga-fren.release2.fixed.{l}.gz"),
    ],
}
# (output name, archive, member with {l}, and {k}: src or ref where a set has both kinds)
_TEST = {
    "en-de": [
        ("newstest2013", "test.tgz", "test/newstest2013-src.{l}.sgm"),
        ("newstest2014", "test-full.tgz", "test-full/newstest2014-deen-{k}.{l}.sgm"),
    ],
    "en-fr": [
        ("newstest2013", "test.tgz", "test/newstest2013-src.{l}.sgm"),
        ("newstest2014", "test-full.tgz", "test-full/newstest2014-fren-{k}.{l}.sgm"),
    ],
}
PAIRS = tuple(_TRAIN)


def _digest(path: Path, kind: str) -> str:
    h = hashlib.new(kind)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _open_from(url: str, offset: int, timeout: float) -> tuple[IO[bytes], int, int | None]:
    """(stream, where it starts, total size or None): from ``offset`` when the source can."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(urllib.request.url2pathname(parsed.path))
        if not path.is_file():
            raise UserError(f"{path}: no such file (the local mirror)")
        f = open(path, "rb")
        f.seek(min(offset, path.stat().st_size))
        return f, f.tell(), path.stat().st_size
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing after offset: the part is complete
            return open(os.devnull, "rb"), offset, offset
        raise UserError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise UserError(
            f"cannot download {url}: {e}; without network, use a mirror (--from)"
        ) from None
    length = r.headers.get("Content-Length")
    start = offset if r.status == 206 else 0  # a server without ranges sends it all again
    return r, start, start + int(length) if length and length.isdigit() else None


def _fetch(url: str, part: Path, *, progress: bool, timeout: float) -> None:
    """Fetch ``url`` into ``part``, continuing from what is there."""
    have = part.stat().st_size if part.exists() else 0
    stream, start, total = _open_from(url, have, timeout)
    with stream, open(part, "r+b" if part.exists() else "wb") as out:
        out.seek(start)
        out.truncate()
        with tqdm(
            total=total,
            initial=start,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=part.name.removesuffix(".part"),
            disable=not progress,
            leave=False,
        ) as bar:
            try:
                while block := stream.read(1 << 20):
                    out.write(block)
                    bar.update(len(block))
            except OSError as e:
                raise UserError(
                    f"{url}: transfer broken after {out.tell()} bytes ({e}); run again to resume"
                ) from None
    if total is not None and part.stat().st_size != total:
        raise UserError(f"{url}: got {part.stat().st_size} of {total} bytes; run again to resume")


def _archive(
    name: str, downloads: Path, source: str, md5: str | None, *, progress: bool, timeout: float
) -> Path:
    """``downloads/name``, fetched (resumed) from ``source`` and checked, unless already there
    and passing its check."""
    final, part = downloads / name, downloads / (name + ".part")
    if final.is_file() and (md5 is None or _digest(final, "md5") == md5):
        return final
    for _attempt in (0, 1):
        _fetch(source, part, progress=progress, timeout=timeout)
        if md5 is None:  # no published MD5 (the training archives): read through as a tar
            _check_complete(part, source)
            os.replace(part, final)
            return final
        if _digest(part, "md5") == md5:
            os.replace(part, final)
            return final
        part.unlink()  # a resumed part with a bad start: once more from the beginning
    raise UserError(
        f"{source}: MD5 differs from the published {md5}, also when fetched from "
        "the start: the file is not the WMT release"
    )


def _check_complete(part: Path, source: str) -> None:
    """A UserError, ``part`` deleted, unless it reads through as a complete tar archive (a
    truncated one must not be renamed to its final name and reused by the next run)."""
    try:
        with tarfile.open(part, "r:*") as tar:
            for member in tar:
                if member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None
                    with data:
                        while data.read(1 << 20):
                            pass
    except (tarfile.TarError, OSError, EOFError) as e:
        part.unlink()
        raise UserError(f"{source}: not a complete archive ({e}); run again to fetch it") from None


def _members(archive: Path, wanted: dict[str, Path]) -> None:
    """Extract the members named in ``wanted`` (archive path -> output file), in one pass."""
    found: set[str] = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                if member.name in wanted and member.isfile():
                    source = tar.extractfile(member)
                    assert source is not None
                    with source, open(wanted[member.name], "wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
                    found.add(member.name)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(
            f"{archive}: not a complete archive ({e}); delete it to fetch again"
        ) from None
    missing = sorted(set(wanted) - found)
    if missing:
        raise UserError(f"{archive}: has no {', '.join(missing)}")


def _lines(path: Path, name: str) -> int:
    """The lines of the extracted member ``path`` (``name``: the archive's and the member's)."""
    with _opened(path, name) as f:
        return sum(1 for _ in f)


def _append(path: Path, out: IO[bytes], name: str) -> None:
    with _opened(path, name) as f:
        for line in f:
            out.write(line if line.endswith(b"\n") else line + b"\n")


@contextmanager
def _opened(path: Path, name: str) -> Iterator[IO[bytes]]:
    """The member at ``path``, gunzipped where its name ends .gz; what a corrupt one raises
    while it is read, a UserError naming ``name`` (no MD5 is published for the training
    archives, so a damaged mirror gets this far)."""
    import gzip
    import zlib

    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            yield f  # type: ignore[misc]
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{name}: corrupt gzip data ({e})") from None


def _sgm_text(sgm: Path, out: Path) -> int:
    """The ``<seg>`` lines of a WMT SGML file as plain text (sacreBLEU's extraction)."""
    n = 0
    # newline="\n" as sacreBLEU's smart_open: a bare \r inside a <seg> must not split it
    with (
        open(sgm, encoding="utf-8", newline="\n") as f,
        open(out, "w", encoding="utf-8", newline="\n") as o,
    ):
        for line in f:
            if line.startswith("<seg "):
                text = re.sub(r"<seg.*?>(.*)</seg>.*?", "\\1", line)
                o.write(re.sub(r"\s+", " ", text.strip()) + "\n")
                n += 1
    return n


def _check_mirror(folder: Path, names: list[str]) -> None:
    """A UserError when ``folder`` is not a folder or lacks one of the archives ``names``."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (--from, holding the WMT14 archives)")
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise UserError(
            f"{folder}: no {', '.join(missing)} (--from holds the WMT14 archives under their "
            "public names)"
        )


def fetch_wmt14(
    dest: str | Path,
    *,
    pair: str = "en-de",
    from_dir: str | Path | None = None,
    checksums: dict[str, str] | None = None,
    progress: bool = True,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Fetch WMT14 ``pair`` (``en-de`` or ``en-fr``) into ``dest`` (see the module's text);
    ``from_dir``: a folder holding the archives under their public names instead of the URLs;
    ``checksums``: MD5s by archive name, in place of ``PUBLISHED_MD5``. Returns what
    ``dest/wmt14.json`` records."""
    if pair not in _TRAIN:
        raise UserError(f"WMT14 pair {pair!r}: choose from {', '.join(PAIRS)}")
    md5s = PUBLISHED_MD5 if checksums is None else checksums
    src, tgt = pair.split("-")
    dest = Path(dest)
    downloads, raw = dest / "downloads", dest / "downloads" / "extracted"
    needed = dict.fromkeys([a for a, _ in _TRAIN[pair]] + [t[1] for t in _TEST[pair]])
    if from_dir is not None:  # before anything is created
        _check_mirror(Path(from_dir), [n for n in needed if not (downloads / n).is_file()])
    try:
        raw.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{raw}: cannot create folder ({e.strerror or e})") from None
    archives = {}
    for name in needed:
        source = (Path(from_dir) / name).resolve().as_uri() if from_dir else ARCHIVES[name]
        path = _archive(name, downloads, source, md5s.get(name), progress=progress, timeout=timeout)
        archives[name] = {
            "url": ARCHIVES[name],
            "bytes": path.stat().st_size,
            "sha256": _digest(path, "sha256"),
            "md5_checked": name in md5s,
        }
    wanted: dict[str, dict[str, Path]] = {name: {} for name in needed}
    for archive, member in _TRAIN[pair]:
        for lang in (src, tgt):
            name = member.format(l=lang)
            wanted[archive][name] = raw / name.replace("/", "_")
    for _, archive, member in _TEST[pair]:
        for lang, kind in ((src, "src"), (tgt, "ref" if "{k}" in member else "src")):
            name = member.format(l=lang, k=kind)
            wanted[archive][name] = raw / name.replace("/", "_")
    for name, members in wanted.items():
        _members(downloads / name, members)
    record: dict[str, Any] = {"pair": pair, "archives": archives, "corpora": {}, "files": {}}
    # every output under a .part name, renamed once all are whole, the old record gone first:
    # an interrupted run leaves no shortened train.* that a record still vouches for
    (dest / "wmt14.json").unlink(missing_ok=True)
    written: list[Path] = []

    def part(path: Path) -> Path:
        written.append(path)
        return path.with_name(path.name + ".part")

    outs = {lang: part(dest / f"train.{lang}") for lang in (src, tgt)}
    with open(outs[src], "wb") as out_src, open(outs[tgt], "wb") as out_tgt:
        for archive, member in _TRAIN[pair]:
            names = [member.format(l=lang) for lang in (src, tgt)]
            paths = [wanted[archive][name] for name in names]
            counts = [_lines(p, f"{archive}: {n}") for p, n in zip(paths, names, strict=True)]
            if counts[0] != counts[1]:
                raise UserError(
                    f"{archive}: {names[0]} has {counts[0]} lines, {names[1]} has {counts[1]}"
                )
            _append(paths[0], out_src, f"{archive}: {names[0]}")
            _append(paths[1], out_tgt, f"{archive}: {names[1]}")
            record["corpora"][member.format(l="*")] = counts[0]
    record["files"]["train"] = sum(record["corpora"].values())
    for out_name, archive, member in _TEST[pair]:
        counts = []
        for lang, kind in ((src, "src"), (tgt, "ref" if "{k}" in member else "src")):
            sgm = wanted[archive][member.format(l=lang, k=kind)]
            counts.append(_sgm_text(sgm, part(dest / f"{out_name}.{lang}")))
        if counts[0] != counts[1]:
            raise UserError(
                f"{archive}: {out_name} has {counts[0]} source, {counts[1]} reference segments"
            )
        record["files"][out_name] = counts[0]
    for path in written:
        os.replace(path.with_name(path.name + ".part"), path)
    shutil.rmtree(raw)
    tmp = dest / "wmt14.json.part"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, dest / "wmt14.json")
    return record

"""transduce data wmt14 against a local mirror of tiny archives with the public names and
layout: the files it writes, MD5 checks, resuming a partial download."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from transduce.cli.main import main
from transduce.data import wmt14
from transduce.data.wmt14 import fetch_wmt14
from transduce.errors import UserError


def _tgz(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _sgm(lines: list[str]) -> str:
    segs = "".join(f'<seg id="{i}">{x}</seg>\n' for i, x in enumerate(lines, 1))
    return f'<srcset setid="x">\n<doc docid="d">\n{segs}</doc>\n</srcset>\n'


def mirror(folder: Path) -> dict[str, str]:
    """The en-de archives, a few lines each; their MD5s."""
    folder.mkdir()
    _tgz(
        folder / "training-parallel-europarl-v7.tgz",
        {
            "training/europarl-v7.de-en.en": "Resumption of the session\nHello\n",
            "training/europarl-v7.de-en.de": "Wiederaufnahme der Sitzung\nHallo\n",
            "training/europarl-v7.fr-en.en": "not this pair\n",
        },
    )
    _tgz(
        folder / "training-parallel-commoncrawl.tgz",
        {
            "commoncrawl.de-en.en": "a crawled line",
            "commoncrawl.de-en.de": "eine Zeile",
        },
    )
    _tgz(
        folder / "training-parallel-nc-v9.tgz",
        {
            "training/news-commentary-v9.de-en.en": "news\n",
            "training/news-commentary-v9.de-en.de": "Nachrichten\n",
        },
    )
    _tgz(
        folder / "test.tgz",
        {
            "test/newstest2013-src.en.sgm": _sgm(["A  dev  sentence", "two"]),
            "test/newstest2013-src.de.sgm": _sgm(["Ein Satz", "zwei"]),
        },
    )
    _tgz(
        folder / "test-full.tgz",
        {
            "test-full/newstest2014-deen-src.en.sgm": _sgm(["test one"]),
            "test-full/newstest2014-deen-ref.de.sgm": _sgm(["Test eins"]),
        },
    )
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_fetch_from_a_mirror_writes_the_corpus(tmp_path: Path) -> None:
    md5 = mirror(tmp_path / "mirror")
    record = fetch_wmt14(
        tmp_path / "wmt", from_dir=tmp_path / "mirror", checksums=md5, progress=False
    )
    out = tmp_path / "wmt"
    assert (out / "train.en").read_text().splitlines() == [
        "Resumption of the session",
        "Hello",
        "a crawled line",
        "news",
    ]
    assert (out / "train.de").read_text().splitlines()[2:] == ["eine Zeile", "Nachrichten"]
    assert (out / "newstest2013.en").read_text() == "A dev sentence\ntwo\n"
    assert (out / "newstest2014.de").read_text() == "Test eins\n"
    assert record["files"] == {"train": 4, "newstest2013": 2, "newstest2014": 1}
    assert json.loads((out / "wmt14.json").read_text())["archives"]["test.tgz"]["md5_checked"]
    assert not list((out / "downloads").glob("*.part"))


def test_resume_and_checksums(tmp_path: Path) -> None:
    md5 = mirror(tmp_path / "mirror")
    downloads = tmp_path / "wmt" / "downloads"
    downloads.mkdir(parents=True)
    whole = (tmp_path / "mirror" / "test-full.tgz").read_bytes()
    (downloads / "test-full.tgz.part").write_bytes(whole[: len(whole) // 2])  # interrupted
    bad = (tmp_path / "mirror" / "test.tgz").read_bytes()
    (downloads / "test.tgz.part").write_bytes(b"X" + bad[1:10])  # a broken start: refetched
    fetch_wmt14(tmp_path / "wmt", from_dir=tmp_path / "mirror", checksums=md5, progress=False)
    assert (downloads / "test-full.tgz").read_bytes() == whole
    assert (downloads / "test.tgz").read_bytes() == bad
    # A mirror whose file is not the published one fails its MD5, naming it.
    wrong = {**md5, "test.tgz": "0" * 32}
    with pytest.raises(UserError, match="test.tgz: MD5 differs from the published 0000"):
        fetch_wmt14(
            tmp_path / "other", from_dir=tmp_path / "mirror", checksums=wrong, progress=False
        )


def test_cli_and_missing_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    md5 = mirror(tmp_path / "mirror")
    monkeypatch.setattr(wmt14, "PUBLISHED_MD5", md5)
    args = ["data", "wmt14", "--dest", str(tmp_path / "wmt"), "--from", str(tmp_path / "mirror")]
    assert main([*args, "--quiet"]) == 0
    assert (tmp_path / "wmt" / "newstest2014.en").read_text() == "test one\n"
    assert (
        main(
            [
                "data",
                "wmt14",
                "--pair",
                "en-fr",
                "--dest",
                str(tmp_path / "fr"),
                "--from",
                str(tmp_path / "mirror"),
                "--quiet",
            ]
        )
        == 2
    )  # no UN archive in the mirror


def test_public_urls_are_statmt() -> None:
    assert all(url.startswith("https://www.statmt.org/") for url in wmt14.ARCHIVES.values())


def test_a_missing_mirror_or_archive_is_named_before_anything_is_created(tmp_path: Path) -> None:
    md5 = mirror(tmp_path / "mirror")
    with pytest.raises(UserError, match="nowhere: no such folder"):
        fetch_wmt14(tmp_path / "wmt", from_dir=tmp_path / "nowhere", checksums=md5, progress=False)
    (tmp_path / "mirror" / "test.tgz").unlink()
    with pytest.raises(UserError, match=r"mirror: no test\.tgz \(--from holds"):
        fetch_wmt14(tmp_path / "wmt", from_dir=tmp_path / "mirror", checksums=md5, progress=False)
    assert not (tmp_path / "wmt").exists()


def test_sgm_text_splits_on_newline_only_as_sacrebleu(tmp_path: Path) -> None:
    sgm, out = tmp_path / "t.sgm", tmp_path / "t.txt"
    body = '<seg id="1">Hello\rworld  x</seg>\r\n<seg id="2">two\x0bthree</seg>\n'
    sgm.write_bytes(f'<srcset setid="x">\n<doc docid="d">\n{body}</doc>\n</srcset>\n'.encode())
    assert wmt14._sgm_text(sgm, out) == 2
    assert out.read_bytes() == b"Hello world x\ntwo three\n"
    fake_sgml = pytest.importorskip("sacrebleu.dataset.fake_sgml")
    theirs = tmp_path / "sacrebleu.txt"
    dataset = object.__new__(fake_sgml.FakeSGMLDataset)  # no __init__: it would download
    dataset._convert_format(str(sgm), str(theirs))
    assert out.read_bytes() == theirs.read_bytes()


def test_a_truncated_training_archive_is_not_kept_under_its_name(tmp_path: Path) -> None:
    """No MD5 is published for it: it was renamed to its final name before being read, and a
    run after the mirror was mended reused it."""
    md5 = mirror(tmp_path / "mirror")
    crawl = tmp_path / "mirror" / "training-parallel-commoncrawl.tgz"
    whole = crawl.read_bytes()
    crawl.write_bytes(whole[:-30])
    checksums = {k: v for k, v in md5.items() if not k.startswith("training")}
    with pytest.raises(UserError, match="commoncrawl.tgz: not a complete archive"):
        fetch_wmt14(tmp_path / "wmt", from_dir=tmp_path / "mirror", checksums=checksums)
    downloads = tmp_path / "wmt" / "downloads"
    assert not any(p.name.startswith("training-parallel-commoncrawl") for p in downloads.iterdir())
    crawl.write_bytes(whole)  # the mirror mended: the next run takes it
    fetch_wmt14(tmp_path / "wmt", from_dir=tmp_path / "mirror", checksums=checksums)
    assert (downloads / "training-parallel-commoncrawl.tgz").read_bytes() == whole


def test_a_corrupt_gzip_member_is_one_line_naming_it(tmp_path: Path) -> None:
    """giga-fren's members are .gz files: a truncated one was an EOFError traceback."""
    import gzip

    member = tmp_path / "giga-fren.release2.fixed.en.gz"
    member.write_bytes(gzip.compress(b"a line\n" * 1000)[:40])
    with pytest.raises(UserError, match=r"giga.tar: giga-fren.release2.fixed.en.gz: corrupt gzip"):
        wmt14._lines(member, "giga.tar: giga-fren.release2.fixed.en.gz")
    member.write_bytes(b"plain text, not gzip\n")
    with pytest.raises(UserError, match=r"giga.tar: m.gz: corrupt gzip data \(Not a gzip"):
        wmt14._lines(member, "giga.tar: m.gz")


def test_an_interrupted_run_leaves_no_record_of_shortened_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    md5 = mirror(tmp_path / "mirror")
    dest = tmp_path / "wmt"
    fetch_wmt14(dest, from_dir=tmp_path / "mirror", checksums=md5, progress=False)
    before = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
    calls: list[int] = []
    append = wmt14._append

    def interrupted(*args: object) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        append(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(wmt14, "_append", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch_wmt14(dest, from_dir=tmp_path / "mirror", checksums=md5, progress=False)
    assert not (dest / "wmt14.json").exists()  # nothing vouches for what is there
    for name in ("train.en", "train.de"):  # and the whole files of the last run are intact
        assert (dest / name).read_bytes() == before[name]

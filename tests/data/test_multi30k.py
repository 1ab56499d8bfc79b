import gzip
import os
from pathlib import Path

import pytest

from transduce.data.multi30k import (
    BASE_URL,
    SPLIT_SIZES,
    Multi30k,
    fetch_multi30k,
    multi30k_paths,
    split_languages,
)
from transduce.data.parallel import read_parallel
from transduce.errors import UserError


def data_root() -> Path:
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding multi30k/)")
    return Path(root)


def make_release(folder: Path, langs=("en", "de")) -> Path:
    """A fake Multi30k release with the right line counts (no network, no real data)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in SPLIT_SIZES.items():
        for lang in langs:
            if lang not in split_languages(split):
                continue
            text = "".join(f"{lang} {split} {i} ä\n" for i in range(n))
            with gzip.open(folder / f"{split}.{lang}.gz", "wb", compresslevel=1) as f:
                f.write(text.encode("utf-8"))
    return folder


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return make_release(tmp_path_factory.mktemp("server"), langs=("en", "de", "cs"))


def test_paths():
    assert multi30k_paths("/x", "val", "de") == Path("/x/val.de.gz")
    with pytest.raises(UserError, match="no 'cs' side"):
        multi30k_paths("/x", "test_2017_flickr", "cs")
    with pytest.raises(UserError, match="unknown Multi30k split"):
        multi30k_paths("/x", "dev", "de")
    with pytest.raises(UserError, match="no language 'es'"):
        multi30k_paths("/x", "val", "es")


def test_bad_languages(tmp_path):
    with pytest.raises(UserError, match="both 'en'"):
        fetch_multi30k(tmp_path, src="en", tgt="en")
    with pytest.raises(UserError, match="no language 'xx'"):
        fetch_multi30k(tmp_path, src="xx", tgt="de")
    assert not any(tmp_path.iterdir())


def test_default_url_is_public_home():
    assert BASE_URL == "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"


def test_download_via_file_url(release, tmp_path):
    dest = tmp_path / "out"
    m = fetch_multi30k(dest, base_url=release.as_uri(), progress=False)
    assert isinstance(m, Multi30k)
    assert m.splits == ("train", "val", "test_2016_flickr", "test_2017_flickr")
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        f"{s}.{lang}.gz" for s in m.splits for lang in ("en", "de")
    )
    src, tgt = m.pair("train")
    assert src == dest / "train.en.gz"
    pt = read_parallel(src, tgt)
    assert len(pt) == 29000 and pt.target[5] == "de train 5 ä"


def test_czech_has_no_2017(release, tmp_path):
    m = fetch_multi30k(tmp_path, src="cs", tgt="en", base_url=release.as_uri(), progress=False)
    assert m.splits == ("train", "val", "test_2016_flickr")
    with pytest.raises(UserError, match="no split 'test_2017_flickr'"):
        m.pair("test_2017_flickr")


def test_copy_from_dir_and_reuse(release, tmp_path):
    m = fetch_multi30k(tmp_path, from_dir=release, progress=False)
    stamp = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    # a second fetch keeps the valid files; a broken one is fetched again
    (tmp_path / "val.de.gz").write_bytes(b"junk")
    fetch_multi30k(tmp_path, from_dir=release, base_url="file:///nonexistent/", progress=False)
    assert (tmp_path / "val.de.gz").read_bytes() == (release / "val.de.gz").read_bytes()
    assert all(p.stat().st_mtime_ns == t for p, t in stamp.items() if p.name != "val.de.gz")
    assert m.files["val"]["de"] == tmp_path / "val.de.gz"


def test_missing_in_mirror(tmp_path):
    mirror = make_release(tmp_path / "mirror", langs=("en",))
    with pytest.raises(UserError, match=r"no train\.de\.gz"):
        fetch_multi30k(tmp_path / "out", from_dir=mirror, progress=False)


def test_download_failure_is_user_error(tmp_path):
    missing = (tmp_path / "nothing").as_uri()
    with pytest.raises(UserError, match=r"cannot download .*train\.en\.gz"):
        fetch_multi30k(tmp_path / "out", base_url=missing, progress=False)


def _corrupt(tmp_path, release, name, data: bytes) -> Path:
    server = tmp_path / "server"
    server.mkdir()
    for p in release.iterdir():
        (server / p.name).write_bytes(p.read_bytes())
    (server / name).write_bytes(data)
    return server


def test_truncated_download(release, tmp_path):
    good = (release / "val.en.gz").read_bytes()
    server = _corrupt(tmp_path, release, "val.en.gz", good[: len(good) // 2])
    dest = tmp_path / "out"
    with pytest.raises(UserError, match=r"val\.en\.gz: corrupt gzip file"):
        fetch_multi30k(dest, base_url=server.as_uri(), progress=False)
    assert not (dest / "val.en.gz").exists()
    assert not [p for p in dest.iterdir() if p.name.endswith(".part")]


def test_checksum_mismatch(release, tmp_path):
    # A byte changed inside the content with the stream still decodable: gzip's CRC-32 of the
    # content, checked at the end of decompression, no longer matches.
    text = "".join(f"en val {i} a\n" for i in range(SPLIT_SIZES["val"])).encode()
    data = bytearray(gzip.compress(text, compresslevel=0))  # stored: content bytes appear as is
    at = data.index(b"en val 7 a")
    data[at + 7 : at + 8] = b"9"
    server = _corrupt(tmp_path, release, "val.en.gz", bytes(data))
    with pytest.raises(UserError, match=r"val\.en\.gz: corrupt gzip file.*CRC"):
        fetch_multi30k(tmp_path / "out", from_dir=server, progress=False)


def test_wrong_line_count(release, tmp_path):
    server = _corrupt(tmp_path, release, "test_2016_flickr.de.gz", gzip.compress(b"one\ntwo\n"))
    with pytest.raises(UserError, match=r"test_2016_flickr\.de\.gz: 2 lines, expected 1000"):
        fetch_multi30k(tmp_path / "out", from_dir=server, progress=False)


def test_invalid_utf8(release, tmp_path):
    lines = b"ok\n" * 500 + b"\xff\xfe\n" + b"ok\n" * 513
    server = _corrupt(tmp_path, release, "val.de.gz", gzip.compress(lines))
    with pytest.raises(UserError, match=r"val\.de\.gz: line 501: invalid UTF-8"):
        fetch_multi30k(tmp_path / "out", base_url=server.as_uri(), progress=False)


def test_fetch_from_mirror(tmp_path):
    mirror = data_root() / "multi30k"
    m = fetch_multi30k(tmp_path, src="en", tgt="de", from_dir=data_root(), progress=False)
    assert m.pair("train") == (tmp_path / "train.en.gz", tmp_path / "train.de.gz")
    pt = read_parallel(*m.pair("train"))
    assert len(pt) + pt.skipped == 29000
    assert len(read_parallel(*m.pair("test_2016_flickr"))) == 1000
    assert (tmp_path / "val.de.gz").read_bytes() == (mirror / "val.de.gz").read_bytes()


def test_without_a_terminal_each_file_fetched_is_a_line(release, tmp_path, capsys):
    m = fetch_multi30k(tmp_path, from_dir=release, progress=True)  # capsys: not a terminal
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == sum(len(f) for f in m.files.values())
    assert all(line.startswith("transduce: ") and line.endswith("lines, checked") for line in lines)
    fetch_multi30k(tmp_path / "quiet", from_dir=release, progress=False)
    assert capsys.readouterr().err == ""


def test_a_copy_from_a_mirror_is_a_line_on_a_terminal_too(release, tmp_path, capsys, monkeypatch):
    """On a terminal a download shows its bar; a copy from a mirror shows none, so each file
    copied is a line there too, and --quiet (progress=False) silences it."""
    import transduce.data.multi30k as multi30k

    monkeypatch.setattr(multi30k, "is_terminal", lambda *a: True)
    m = fetch_multi30k(tmp_path / "loud", from_dir=release, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == sum(len(f) for f in m.files.values())
    fetch_multi30k(tmp_path / "quiet", from_dir=release, progress=False)
    assert capsys.readouterr().err == ""

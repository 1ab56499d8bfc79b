"""The Penn Treebank sample: reading, the split by file, and preparing the split files."""

import os
import zipfile
from pathlib import Path

import pytest

from transduce.data.ptb import (
    SPLIT_SIZES,
    prepare_ptb_sample,
    read_treebank,
    split_of,
    split_treebank,
)
from transduce.data.trees import parse_trees, read_tree_file
from transduce.errors import UserError

WSJ_0001_FIRST = (
    "(TOP (S (NP (NP (NNP Pierre) (NNP Vinken)) (, ,) (ADJP (NP (CD 61) (NNS years)) (JJ old)) "
    "(, ,)) (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) (PP (IN as) (NP (DT a) "
    "(JJ nonexecutive) (NN director))) (NP (NNP Nov.) (CD 29)))) (. .)))"
)
FAKE = {
    "treebank/combined/wsj_0001.mrg": "( (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat)) (. .)) )\n",
    "treebank/combined/wsj_0170.mrg": "( (S (NP-SBJ-1 (PRP It)) (VP (VBZ is) (S (-NONE- *-1)))))\n"
    "( (NP (NN dog) ))\n",
    "treebank/combined/wsj_0190.mrg": "( (FRAG (NN Yes) (. !)) )\n",
    "treebank/combined/README": "not a tree\n",
}


def data_root() -> Path:
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding ptb-sample/treebank.zip)")
    return Path(root)


def make_zip(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path


@pytest.mark.parametrize(
    "name, split",
    [
        ("wsj_0001.mrg", "train"),
        ("wsj_0159.mrg", "train"),
        ("wsj_0160.mrg", "dev"),
        ("wsj_0179.mrg", "dev"),
        ("wsj_0180.mrg", "test"),
        ("wsj_0199.mrg", "test"),
        ("wsj_0200.mrg", None),
        ("wsj_0000.mrg", None),
        ("wsj_0001.pos", None),
        ("README", None),
    ],
)
def test_split_of(name, split):
    assert split_of(name) == split


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[dict[str, int], Path]:
    """The real sample prepared once (reading it takes seconds)."""
    out = tmp_path_factory.mktemp("ptb")
    return prepare_ptb_sample(out, from_folder=data_root()), out  # finds ptb-sample/


def test_prepare_the_real_sample(prepared):
    counts, out = prepared
    assert counts == SPLIT_SIZES == {"train": 3396, "dev": 273, "test": 245}
    assert sorted(p.name for p in out.iterdir()) == [
        "dev.trees",
        "dev.words",
        "test.trees",
        "test.words",
        "train.trees",
        "train.words",
        "treebank.zip",
    ]
    for split, n in SPLIT_SIZES.items():
        words = (out / f"{split}.words").read_text(encoding="utf-8").splitlines()
        lines = (out / f"{split}.trees").read_text(encoding="utf-8").splitlines()
        assert len(words) == len(lines) == n
    assert lines[0].startswith("(TOP (S (NP (NP (NNP Genetics) (NNP Institute)")
    assert (out / "train.trees").read_text().splitlines()[0] == WSJ_0001_FIRST
    assert (out / "train.words").read_text().splitlines()[0].startswith("Pierre Vinken , 61")


def test_read_real_files_from_a_folder(prepared, tmp_path):
    _, out = prepared
    with zipfile.ZipFile(out / "treebank.zip") as z:  # the test split's 20 files
        members = [m for m in z.namelist() if split_of(Path(m).name) == "test"]
        z.extractall(tmp_path, members)
    files = read_treebank(tmp_path)
    assert [f.name for f in files] == [f"wsj_{i:04d}.mrg" for i in range(180, 200)]
    trees = split_treebank(files)["test"]
    assert len(trees) == 245
    assert trees == read_tree_file(out / "test.trees")
    words = (out / "test.words").read_text(encoding="utf-8").splitlines()
    assert [" ".join(t.words()) for t in trees] == words


def test_prepare_from_a_fake_zip_cleans_and_splits(tmp_path):
    make_zip(tmp_path / "treebank.zip", FAKE)
    counts = prepare_ptb_sample(tmp_path / "out", tmp_path)
    assert counts == {"train": 1, "dev": 2, "test": 1}
    out = tmp_path / "out"
    assert (out / "dev.trees").read_text().splitlines() == [
        "(TOP (S (NP (PRP It)) (VP (VBZ is))))",  # -NONE- and its emptied S removed, tags cut
        "(TOP (NP (NN dog)))",
    ]
    assert (out / "dev.words").read_text() == "It is\ndog\n"
    assert (out / "test.words").read_text() == "Yes !\n"


def test_prepare_downloads_through_urllib(tmp_path):
    # a file:// URL: urllib's code path without network
    src = make_zip(tmp_path / "served.zip", FAKE)
    counts = prepare_ptb_sample(tmp_path / "out", url=src.as_uri())
    assert counts == {"train": 1, "dev": 2, "test": 1}
    with pytest.raises(UserError, match="cannot download"):
        prepare_ptb_sample(tmp_path / "out2", url=(tmp_path / "missing.zip").as_uri())
    assert list((tmp_path / "out2").iterdir()) == []  # no partial file left


def test_read_a_folder_of_mrg_files(tmp_path):
    for name, text in FAKE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    files = read_treebank(tmp_path)
    assert [f.name for f in files] == ["wsj_0001.mrg", "wsj_0170.mrg", "wsj_0190.mrg"]
    assert files[1].trees == tuple(parse_trees(FAKE["treebank/combined/wsj_0170.mrg"], clean=True))


def test_missing_zip(tmp_path):
    with pytest.raises(UserError, match=r"no treebank\.zip"):
        prepare_ptb_sample(tmp_path / "out", tmp_path)
    with pytest.raises(UserError, match="no such folder"):
        prepare_ptb_sample(tmp_path / "out", tmp_path / "nowhere")
    with pytest.raises(UserError, match="no such file or folder"):
        read_treebank(tmp_path / "treebank.zip")


def test_corrupt_zip(tmp_path):
    (tmp_path / "treebank.zip").write_bytes(b"this is not a zip file")
    with pytest.raises(UserError, match="corrupt or not a zip"):
        prepare_ptb_sample(tmp_path / "out", tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []
    # a damaged member: its CRC-32 no longer matches
    good = make_zip(tmp_path / "good.zip", {"wsj_0001.mrg": "( (S (NN " + "a" * 200 + ")))\n"})
    data = bytearray(good.read_bytes())
    at = data.index(b"aaaa")
    data[at : at + 4] = b"bbbb"
    (tmp_path / "treebank.zip").write_bytes(bytes(data))
    with pytest.raises(UserError, match="corrupt or not a zip"):
        read_treebank(tmp_path / "treebank.zip")


def _deflated(path: Path, text: str) -> bytearray:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("wsj_0001.mrg", text)
    return bytearray(path.read_bytes())


@pytest.mark.parametrize("damage", ["deflate data", "encrypted", "compression method"])
def test_a_damaged_compressed_member_is_a_one_line_error(tmp_path, damage):
    """A zlib.error, RuntimeError or NotImplementedError out of zipfile was a traceback."""
    import random

    rng = random.Random(0)
    text = "".join(f"( (S (NN w{rng.randrange(10**6)})))\n" for _ in range(300))
    data = _deflated(tmp_path / "good.zip", text)
    header = data.index(b"PK\x03\x04")
    if damage == "deflate data":
        data[header + 60 : header + 100] = bytes(b ^ 0x5A for b in data[header + 60 : header + 100])
    elif damage == "encrypted":  # the general-purpose flag's bit 0, in both headers
        for sig, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            data[data.index(sig) + at] |= 1
    else:  # method 99, in both headers
        for sig, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
            data[data.index(sig) + at] = 99
    (tmp_path / "treebank.zip").write_bytes(bytes(data))
    with pytest.raises(UserError, match="treebank.zip: corrupt or not a zip"):
        read_treebank(tmp_path / "treebank.zip")


def test_zip_or_folder_without_mrg_files(tmp_path):
    make_zip(tmp_path / "treebank.zip", {"treebank/raw/wsj_0001": "Pierre Vinken\n"})
    with pytest.raises(UserError, match=r"no \.mrg files"):
        prepare_ptb_sample(tmp_path / "out", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no \.mrg files"):
        read_treebank(tmp_path / "empty")


def test_malformed_member_names_zip_member_and_line(tmp_path):
    bad = dict(FAKE)
    bad["treebank/combined/wsj_0002.mrg"] = "( (S (NN a)) )\n( (S (NN b)\n"
    zip_path = make_zip(tmp_path / "treebank.zip", bad)
    with pytest.raises(UserError) as e:
        read_treebank(zip_path)
    assert str(e.value).startswith(f"{zip_path}:treebank/combined/wsj_0002.mrg: line 2: ")
    with zipfile.ZipFile(zip_path, "w") as z:  # latin-1 bytes, not UTF-8
        z.writestr("wsj_0002.mrg", "\n( (S (NN caf\xe9)) )\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"wsj_0002\.mrg: line 2: invalid UTF-8"):
        read_treebank(zip_path)


def test_a_zip_without_one_of_the_splits_is_refused_naming_the_file_it_came_from(tmp_path):
    """A treebank.zip holding no file of a split (here only wsj_0500, beyond the sample's 199)
    would write six empty files and say so with exit 0: refused, before anything is written,
    naming the mirror's zip (not the temporary copy it was read from)."""
    (tmp_path / "mirror").mkdir()
    zipped = make_zip(
        tmp_path / "mirror" / "treebank.zip",
        {"combined/wsj_0500.mrg": FAKE["treebank/combined/wsj_0001.mrg"]},
    )
    with pytest.raises(UserError, match="no trees of the train split") as caught:
        prepare_ptb_sample(tmp_path / "out", tmp_path / "mirror")
    assert str(zipped) in str(caught.value) and ".part" not in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []
    # a corrupt mirror is named as the user's file too
    zipped.write_bytes(b"not a zip")
    with pytest.raises(UserError, match="corrupt or not a zip") as caught:
        prepare_ptb_sample(tmp_path / "out", tmp_path / "mirror")
    assert str(caught.value).startswith(str(zipped))


def test_a_good_zip_already_in_dest_is_kept_and_force_fetches_again(tmp_path):
    """A second run finds treebank.zip in DEST and uses it (it downloaded it again), a broken
    one there is fetched again, and force fetches a good one again."""
    src = make_zip(tmp_path / "served.zip", FAKE)
    out = tmp_path / "out"
    assert prepare_ptb_sample(out, url=src.as_uri()) == {"train": 1, "dev": 2, "test": 1}
    gone = (tmp_path / "missing.zip").as_uri()
    assert prepare_ptb_sample(out, url=gone) == {"train": 1, "dev": 2, "test": 1}  # no fetch
    with pytest.raises(UserError, match="cannot download"):
        prepare_ptb_sample(out, url=gone, force=True)
    (out / "treebank.zip").write_bytes(b"damaged")
    with pytest.raises(UserError, match="cannot download"):  # a broken zip is not kept
        prepare_ptb_sample(out, url=gone)
    assert prepare_ptb_sample(out, url=src.as_uri()) == {"train": 1, "dev": 2, "test": 1}

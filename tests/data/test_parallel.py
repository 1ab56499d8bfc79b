import gzip
from pathlib import Path

import pytest

from transduce.data.parallel import ParallelText, iter_lines, read_lines, read_parallel
from transduce.errors import UserError


def write(path: Path, text: str | bytes) -> Path:
    data = text.encode("utf-8") if isinstance(text, str) else text
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


SRC = "A dog runs.\n  Two men  \nA cat.\n\nEnd\n"
TGT = "Ein Hund rennt.\nZwei Männer\n\nLeer.\nEnde\n"


def test_plain_and_gz_give_the_same_result(tmp_path):
    plain = read_parallel(write(tmp_path / "s.txt", SRC), write(tmp_path / "t.txt", TGT))
    gz = read_parallel(write(tmp_path / "s.gz", SRC), write(tmp_path / "t.gz", TGT))
    assert plain == gz
    assert plain.source == ["A dog runs.", "Two men", "End"]


def test_empty_pairs_are_skipped_and_alignment_kept(tmp_path):
    pt = read_parallel(write(tmp_path / "s.txt", SRC), write(tmp_path / "t.txt", TGT))
    assert isinstance(pt, ParallelText)
    assert list(pt) == [
        ("A dog runs.", "Ein Hund rennt."),
        ("Two men", "Zwei Männer"),
        ("End", "Ende"),
    ]
    assert pt.skipped == 2
    assert pt.skipped_lines == [3, 4]
    assert len(pt) == 3


def test_whitespace_crlf_bom_and_no_final_newline(tmp_path):
    p = write(tmp_path / "a.txt", "\ufeffone \r\n\ttwo\u2028half\r\nthree")
    assert read_lines(p) == ["one", "two\u2028half", "three"]


def test_read_lines_keeps_empty_lines(tmp_path):
    assert read_lines(write(tmp_path / "a.gz", "x\n\n y \n")) == ["x", "", "y"]


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"nope\.txt: no such file"):
        read_lines(tmp_path / "nope.txt")
    with pytest.raises(UserError, match="nope.de"):
        read_parallel(write(tmp_path / "ok.en", "a\n"), tmp_path / "nope.de")


def test_folder_is_refused(tmp_path):
    with pytest.raises(UserError, match="folder"):
        read_lines(tmp_path)


@pytest.mark.parametrize("suffix", [".txt", ".gz"])
def test_invalid_utf8_names_file_line_and_byte(tmp_path, suffix):
    p = write(tmp_path / f"bad{suffix}", b"fine\nalso fine\nab\xffcd\n")
    with pytest.raises(UserError) as e:
        read_lines(p)
    msg = str(e.value)
    assert str(p) in msg
    assert "line 3" in msg
    assert "byte 2 of the line" in msg
    assert "byte offset 17" in msg  # 5 + 10 + 2
    assert "\n" not in msg


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    s = write(tmp_path / "x.en", "a\nb\nc\n")
    t = write(tmp_path / "x.de", "a\nb\n")
    with pytest.raises(UserError) as e:
        read_parallel(s, t)
    msg = str(e.value)
    assert f"{s} has 3 lines" in msg and f"{t} has 2 lines" in msg


def test_truncated_gzip(tmp_path):
    p = write(tmp_path / "t.gz", "".join(f"sentence {i}\n" for i in range(5000)))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"t\.gz: corrupt gzip file .*truncated"):
        read_lines(p)


def test_not_gzip(tmp_path):
    p = tmp_path / "plain.gz"
    p.write_text("not compressed\n")
    with pytest.raises(UserError, match=r"plain\.gz: corrupt gzip file"):
        read_lines(p)


def test_iter_lines_custom_name(tmp_path):
    p = write(tmp_path / "a.txt", b"\xc3\n")
    with pytest.raises(UserError, match=r"^https://example/a\.txt: line 1:"):
        list(iter_lines(p, name="https://example/a.txt"))


def test_gzip_data_is_read_under_any_case_of_gz_and_named_when_misnamed(tmp_path):
    """A .GZ file is gzip as a .gz is; gzip data under another name was "invalid UTF-8 at byte
    1", now the message says what it is."""
    data = gzip.compress(b"ein hund\nzwei katzen\n")
    (tmp_path / "upper.en.GZ").write_bytes(data)
    assert read_lines(tmp_path / "upper.en.GZ") == ["ein hund", "zwei katzen"]
    (tmp_path / "plain.en").write_bytes(data)
    with pytest.raises(UserError, match=r"plain\.en: gzip data in a file not named \.gz"):
        read_lines(tmp_path / "plain.en")


def test_offline_hints_name_the_command_line_flag(tmp_path, monkeypatch):
    """Without network the data commands point at --from, the flag a user types (they said
    from_dir / from_folder, the Python parameters)."""
    from transduce.data import multi30k, ptb

    hints: list[str] = []

    def offline(url, dest, *, offline_hint, **kwargs):  # noqa: ANN001, ANN003, ANN202
        hints.append(offline_hint)
        raise UserError(f"cannot download {url}: no network; {offline_hint}")

    monkeypatch.setattr(multi30k, "download", offline)
    monkeypatch.setattr(ptb, "download", offline)
    with pytest.raises(UserError):
        multi30k.fetch_multi30k(tmp_path / "m", src="en", tgt="de", progress=False)
    with pytest.raises(UserError):
        ptb.prepare_ptb_sample(tmp_path / "p")
    assert len(hints) == 2 and all("--from DIR" in hint for hint in hints)

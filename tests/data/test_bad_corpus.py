"""Bad training text, table-driven, through ``transduce train``: each problem stops the run with
exit 2 and one line naming the file (and the line where there is one), no traceback, and no run
folder left half-written. CRLF line ends and a byte order mark are normalised and counted; a
1 MB line is read and left out by the length filter, counted in the summary."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from transduce.cli.main import main
from transduce.data.parallel import read_parallel

WORDS = "the a dog cat man woman runs sits on in red blue big small park street ball".split()
LINES = [" ".join(WORDS[(i * j + i) % len(WORDS)] for j in range(2 + i % 6)) for i in range(120)]


def text(lines: list[str], end: str = "\n") -> bytes:
    return "".join(line + end for line in lines).encode("utf-8")


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def truncated_gz() -> bytes:
    data = gz(text(LINES * 40))
    return data[: len(data) // 2]


# name -> (source file name, source bytes or None for a folder, expected words in the message)
Case = tuple[str, "bytes | None | Callable[[Path], None]", tuple[str, ...]]
BAD: dict[str, Case] = {
    "nul byte": ("a.en", text(LINES[:3]) + b"two\x00words\n" + text(LINES[4:]), ("line 4", "NUL")),
    "invalid utf-8": (
        "a.en",
        text(LINES[:6]) + b"caf\xe9\n" + text(LINES[7:]),
        ("line 7", "invalid UTF-8"),
    ),
    "truncated gzip": ("a.en.gz", truncated_gz(), ("corrupt gzip", "after line")),
    "not gzip at all": ("a.en.gz", text(LINES), ("corrupt gzip", "after line 0")),
    "empty file": ("a.en", b"", ("empty file",)),
    "only empty lines": ("a.en", b"\n" * len(LINES), (f"all {len(LINES)} lines are empty",)),
    "only blanks, CRLF": ("a.en", b"  \r\n" * len(LINES), (f"all {len(LINES)} lines are empty",)),
    "a folder": ("a.en", None, ("folder",)),
    "no read permission": ("a.en", "unreadable", ("cannot open", "ermission")),  # type: ignore[dict-item]
    "missing": ("a.en", "missing", ("no such file",)),  # type: ignore[dict-item]
    "fewer lines": (
        "a.en",
        text(LINES[:-3]),
        ("differ in length", f"{len(LINES) - 3} lines", f"{len(LINES)} lines"),
    ),
    "more lines": ("a.en", text(LINES + ["extra"]), ("differ in length",)),
    # classic Mac OS line ends: the whole file would be one line
    "bare CR line ends": ("a.en", text(LINES, end="\r"), ("line 1", "carriage return")),
}


def _config(tmp_path: Path, src: Path, tgt: Path, **train: object) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "n_layers": 1,
                    "d_model": 16,
                    "d_ff": 32,
                    "n_heads": 2,
                    "d_k": 8,
                    "d_v": 8,
                },
                "train": {
                    "max_tokens": 256,
                    "max_steps": 2,
                    "eval_every": 0,
                    "log_every": 1,
                    "tensorboard": False,
                    **train,
                },
                "task": {
                    "name": "translation",
                    "train_src": str(src),
                    "train_tgt": str(tgt),
                    "vocab_size": 60,
                },
            }
        )
    )
    return cfg


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_training_text_stops_with_one_line(case: str, tmp_path: Path, capsys) -> None:
    name, content, expected = BAD[case]
    src = tmp_path / name
    if content is None:
        src.mkdir()
    elif content == "missing":
        pass
    elif content == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        src.write_bytes(text(LINES))
        src.chmod(0)
    else:
        src.write_bytes(content)
    tgt = tmp_path / "a.de"
    tgt.write_bytes(text([line.upper() for line in LINES]))
    run = tmp_path / "run"
    code = main(
        [
            "--no-malloc-tuning",
            "train",
            "--config",
            str(_config(tmp_path, src, tgt)),
            "--out",
            str(run),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("transduce: error: ") and str(src) in lines[0], lines[0]
    for word in expected:
        assert word in lines[0], (word, lines[0])
    if case.endswith("lines") and "empty" not in case:
        assert str(tgt) in lines[0]  # both files of a count mismatch
    assert not run.exists()  # nothing half-written


def test_crlf_and_bom_are_normalised_and_counted(tmp_path: Path, capsys) -> None:
    lf_src, lf_tgt = tmp_path / "lf.en", tmp_path / "lf.de"
    lf_src.write_bytes(text(LINES))
    lf_tgt.write_bytes(text([line.upper() for line in LINES]))
    crlf_src, crlf_tgt = tmp_path / "crlf.en", tmp_path / "crlf.de.gz"
    crlf_src.write_bytes(b"\xef\xbb\xbf" + text(LINES, "\r\n"))
    crlf_tgt.write_bytes(gz(b"\xef\xbb\xbf" + text([line.upper() for line in LINES], "\r\n")))
    lf, crlf = read_parallel(lf_src, lf_tgt), read_parallel(crlf_src, crlf_tgt)
    assert lf == crlf  # the same pairs
    assert crlf.normalised.crlf_lines == 2 * len(LINES) and crlf.normalised.boms == 2
    assert lf.normalised.describe() == ""

    code = main(
        [
            "--no-malloc-tuning",
            "train",
            "--config",
            str(_config(tmp_path, crlf_src, crlf_tgt)),
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = next(line for line in err.splitlines() if line.startswith("transduce: train: "))
    assert f"{2 * len(LINES)} CRLF line ends, 2 byte order marks normalised" in report


def test_a_one_megabyte_line_is_read_and_left_out_by_the_length_filter(
    tmp_path: Path, capsys
) -> None:
    huge = " ".join(WORDS[i % len(WORDS)] for i in range(250_000))[:1_000_000]
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_bytes(text(LINES[:50] + [huge] + LINES[50:]))
    tgt.write_bytes(text([line.upper() for line in LINES[:50] + [huge] + LINES[50:]]))
    code = main(
        [
            "--no-malloc-tuning",
            "train",
            "--config",
            str(_config(tmp_path, src, tgt)),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["train_pairs"] == len(LINES) + 1
    assert summary["filtered_pairs"] == 1
    assert "1 pairs longer than max_len=256 tokens left out" in err

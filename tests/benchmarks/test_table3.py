"""benchmarks/table3.py end to end on a sliver of Multi30k: the scaled rows really are the
paper's relative changes, and the Markdown table holds one line of real figures per row."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from benchmark_testkit import load_benchmark


def _table3():  # noqa: ANN202 - the benchmark script as a module
    return load_benchmark("table3")


def test_rows_scale_like_the_paper() -> None:
    t3 = _table3()
    base = t3.scaled_model("base", 4, 2)
    assert (base["d_model"], base["d_ff"], base["n_heads"], base["d_k"], base["n_layers"]) == (
        128,
        512,
        8,
        16,
        3,
    )
    for row, heads, dk in [("A1", 1, 128), ("A2", 4, 32), ("A3", 16, 8), ("A4", 32, 4)]:
        m = t3.scaled_model(row, 4, 2)
        assert (m["n_heads"], m["d_k"], m["d_v"]) == (heads, dk, dk)
        assert m["n_heads"] * m["d_k"] == base["d_model"]  # computation held constant
    assert [t3.scaled_model(r, 4, 2)["n_layers"] for r in ("C1", "C2", "C3")] == [1, 2, 4]
    assert t3.scaled_model("C4", 4, 2)["d_model"] == 64
    assert t3.scaled_model("C7", 4, 2)["d_ff"] == 1024
    assert t3.scaled_model("D2", 4, 2)["dropout"] == 0.2
    assert t3.scaled_model("E", 4, 2)["positional"] == "learned"


def test_dev_bleu_uses_the_alpha_option_not_the_recipes() -> None:
    t3 = _table3()
    recipe = {
        "train": {"warmup": 10},
        "decode": {"alpha": 1.6, "beam": 5},
        "task": {"name": "translation"},  # valid_beam: a translation recipe (Multi30k)
    }
    parse = lambda argv: t3.argparse.Namespace(  # noqa: E731 - the options row_config reads
        steps=5, minutes=0.0, beam=4, width=4, depth=2, set=[], **argv
    )
    assert t3.row_config("base", parse({"alpha": 0.6}), recipe).decode.alpha == 0.6
    cfg = t3.row_config("base", parse({"alpha": 1.0}), recipe)
    assert cfg.decode.alpha == 1.0 and cfg.decode.beam == 5 and cfg.train.valid_beam == 4


def test_two_rows_end_to_end(tmp_path: Path, capsys) -> None:
    root = os.environ.get("TRANSDUCE_DATA")
    if not root:
        pytest.skip("TRANSDUCE_DATA is not set (folder holding multi30k/)")
    files = {}
    for split, name, n in (("train", "train", 300), ("valid", "val", 20)):
        for lang in ("en", "de"):
            with gzip.open(Path(root) / "multi30k" / f"{name}.{lang}.gz", "rt") as f:
                lines = [next(f) for _ in range(n)]
            files[f"{split}_{'src' if lang == 'en' else 'tgt'}"] = tmp_path / f"{split}.{lang}"
            files[f"{split}_{'src' if lang == 'en' else 'tgt'}"].write_text("".join(lines))
    sets = [f"--set={k}={v}" for k, v in files.items()]
    sets += [
        "--set=vocab_size=300",
        "--set=max_tokens=600",
        "--set=max_len_offset=5",
        "--set=precision=fp32",
    ]
    code = _table3().main(
        ["--rows", "base,D3", "--steps", "4", "--beam", "1", "--out", str(tmp_path / "out"), *sets]
    )
    assert code == 0
    table = (tmp_path / "out" / "table3.md").read_text()
    assert table in capsys.readouterr().out
    rows = json.loads((tmp_path / "out" / "table3.json").read_text())
    assert [r["row"] for r in rows] == ["base", "D3"]
    assert rows[0]["label_smoothing"] == 0.1 and rows[1]["label_smoothing"] == 0.0
    for r in rows:
        assert r["steps"] == 4 and 1.0 < r["params_m"] < 2.0 and r["dev_ppl"] > 1.0
        assert f"| {r['row']} |" in table
    # the second row reused the first row's vocabulary rather than learning another
    first, second = (tmp_path / "out" / r / "vocab.model" for r in ("base", "D3"))
    assert first.read_bytes() == second.read_bytes()

"""benchmarks/train_step_paired.py: the earlier commit's package renamed so that both import side
by side, and one paired round against this checkout's own HEAD."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_testkit import TINY, load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def test_renamed_touches_the_package_only() -> None:
    renamed = load_benchmark("train_step_paired").renamed
    source = "\n".join(
        [
            "import transduce",
            "from transduce import kernels",
            "    from transduce.model import make_model",
            "x = transduce.kernels.linear",
            'SYSTEMS = ("transduce", "torch")',
            'print("transduce: error")',
            "import transduce_other",
        ]
    )
    assert renamed(source).split("\n") == [
        "import transduce_base",
        "from transduce_base import kernels",
        "    from transduce_base.model import make_model",
        "x = transduce_base.kernels.linear",
        'SYSTEMS = ("transduce", "torch")',
        'print("transduce: error")',
        "import transduce_other",
    ]


def _has_head() -> bool:
    if shutil.which("git") is None:
        return False
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "HEAD"], capture_output=True
    )
    return proc.returncode == 0


@pytest.mark.skipif(not _has_head(), reason="not a git checkout with a commit")
def test_one_round_against_head_runs_both_sides(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paired = load_benchmark("train_step_paired")
    monkeypatch.setenv("TRANSDUCE_NATIVE", "0")  # the baseline's native build would take a minute
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import decode  # the SIZES train_step.py reads (and hands the baseline's side): a tiny model

    monkeypatch.setitem(decode.SIZES, "small", TINY)
    argv = ["--baseline", "HEAD", "--sizes", "small", "--rounds", "1"]
    out = paired.main([*argv, "--precisions", "fp32", "--baseline-precision", "fp32"])
    assert set(out) == {"small_HEAD/fp32_over_baseline", "small_ours/fp32_over_baseline"}
    assert out["small_HEAD/fp32_over_baseline"] == 1.0
    assert out["small_ours/fp32_over_baseline"] > 0
    assert "HEAD/fp32" in capsys.readouterr().out
    # the baseline's side ran the commit's own package, unpacked elsewhere, not this checkout's
    base = sys.modules["transduce_base.training.loss"]
    assert base.__file__ is not None and not base.__file__.startswith(str(ROOT))


@pytest.mark.skipif(not _has_head(), reason="not a git checkout with a commit")
def test_the_baselines_native_kernels_come_with_it_under_their_own_namespace(
    tmp_path: Path,
) -> None:
    # two builds registering the same operators would clash: the baseline's are renamed
    paired = load_benchmark("train_step_paired")
    paired.unpack_baseline("HEAD", tmp_path)
    native = tmp_path / "transduce_base" / "kernels" / "native"
    sources = sorted(p.name for p in native.glob("*.cpp"))
    assert "training.cpp" in sources and (native / "vec.h").exists()
    for path in [*native.glob("*.cpp"), native / "__init__.py"]:
        text = path.read_text()
        assert "transduce_base_native" in text and "transduce_native" not in text, path.name

"""tune_malloc and enlarge_onednn_cache: applied on Linux/glibc, switchable off by the
environment. Run in subprocesses so this test process keeps its allocator settings."""

import os
import subprocess
import sys

import pytest

CODE = "from transduce.runtime import tune_malloc; print(tune_malloc(), tune_malloc())"


def _run(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("TRANSDUCE_MALLOC_TUNING", None)
    if env_value is not None:
        env["TRANSDUCE_MALLOC_TUNING"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_tune_malloc_applies_on_linux() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert _run(None) == "True True"
    assert _run("1") == "True True"


def test_tune_malloc_disabled_by_environment() -> None:
    assert _run("0") == "False False"


def _onednn(env_extra: dict[str, str]) -> str:
    code = (
        "import os; from transduce.kernels.process import enlarge_onednn_cache; "
        "print(enlarge_onednn_cache(), os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRANSDUCE_MALLOC_TUNING", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    }
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_enlarge_onednn_cache_sets_the_capacity() -> None:
    from transduce.kernels.process import ONEDNN_CACHE_CAPACITY

    assert _onednn({}) == f"True {ONEDNN_CACHE_CAPACITY}"


def test_enlarge_onednn_cache_keeps_the_users_value() -> None:
    assert _onednn({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "300"}) == "False 300"


def test_enlarge_onednn_cache_disabled_by_environment() -> None:
    assert _onednn({"TRANSDUCE_MALLOC_TUNING": "0"}) == "False None"


def test_cli_enlarges_the_onednn_cache_before_running_a_command(monkeypatch, capsys) -> None:
    import transduce.runtime
    from transduce.cli.main import main

    monkeypatch.setattr(transduce.runtime, "tune_malloc", lambda: False)  # keep this process's
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.delenv("TRANSDUCE_MALLOC_TUNING", raising=False)
    try:
        assert main(["--no-malloc-tuning", "params", "--preset", "base"]) == 0
        assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
        # the option after the subcommand works too, nested ones included
        assert main(["params", "--preset", "base", "--no-malloc-tuning"]) == 0
        assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
        from transduce.cli.main import build_parser

        args = build_parser().parse_args(["data", "multi30k", "--dest", "d", "--no-malloc-tuning"])
        assert args.no_malloc_tuning
        assert main(["params", "--preset", "base"]) == 0
        assert os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY") == str(
            transduce.kernels.process.ONEDNN_CACHE_CAPACITY
        )
    finally:
        os.environ.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
    capsys.readouterr()

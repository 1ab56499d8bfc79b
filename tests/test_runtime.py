"""tune_malloc: applied on Linux/glibc, switchable off by the environment. Run in subprocesses so
this test process keeps its allocator settings."""

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
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
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

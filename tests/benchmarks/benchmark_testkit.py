"""A script of benchmarks/ as a module, for the tests of the benchmarks (and the server-abuse
tests, which drive serve_load.py's abusers)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# A model size small enough for a benchmark's end-to-end test (in place of decode.SIZES' SMALL)
TINY = {"n_layers": 1, "d_model": 64, "n_heads": 4, "d_k": 16, "d_v": 16, "d_ff": 128, "vocab": 300}


def load_benchmark(script: str, name: str | None = None, *, keep: bool = False) -> types.ModuleType:
    """benchmarks/``script``.py as a module named ``name`` (default: the script's name).

    It is in ``sys.modules`` while it loads (dataclasses look their module up), and after that
    only with ``keep`` (a script whose objects are pickled, or which a later import finds by
    name). A name other than the script's keeps it apart from the script imported by a sibling
    (decode.py, imported as ``decode`` by the benchmarks built on it)."""
    name = script if name is None else name
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if not keep:
            del sys.modules[name]
    return module


__all__ = ["BENCHMARKS", "TINY", "load_benchmark"]

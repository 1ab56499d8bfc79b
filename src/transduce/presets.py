"""The paper's configurations as data: ``base``, ``big`` (Table 3 bottom) and every row of Table 3.

Each preset is a set of changes to the defaults of ``transduce.config`` (which are the base model);
``transduce.config.preset_config`` makes the Config of one.
Table 3 rows are named by their group letter and position within the group, e.g. ``A1`` (h=1) or
``C4`` (d_model=256); the comments below say what each group varies, and ``PAPER_PARAMS``
gives the paper's parameter count (millions) where the table lists one.
"""

from __future__ import annotations

from typing import Any

_BASE: dict[str, Any] = {}
_BIG = {"d_model": 1024, "d_ff": 4096, "n_heads": 16, "d_k": 64, "d_v": 64, "dropout": 0.3}

PRESETS: dict[str, dict[str, Any]] = {
    "base": _BASE,
    "big": _BIG,
    # (A) attention heads and key/value sizes, computation held constant
    "A1": {"n_heads": 1, "d_k": 512, "d_v": 512},
    "A2": {"n_heads": 4, "d_k": 128, "d_v": 128},
    "A3": {"n_heads": 16, "d_k": 32, "d_v": 32},
    "A4": {"n_heads": 32, "d_k": 16, "d_v": 16},
    # (B) attention key size
    "B1": {"d_k": 16},
    "B2": {"d_k": 32},
    # (C) model size
    "C1": {"n_layers": 2},
    "C2": {"n_layers": 4},
    "C3": {"n_layers": 8},
    "C4": {"d_model": 256, "d_k": 32, "d_v": 32},
    "C5": {"d_model": 1024, "d_k": 128, "d_v": 128},
    "C6": {"d_ff": 1024},
    "C7": {"d_ff": 4096},
    # (D) regularisation
    "D1": {"dropout": 0.0},
    "D2": {"dropout": 0.2},
    "D3": {"label_smoothing": 0.0},
    "D4": {"label_smoothing": 0.2},
    # (E) learned positional embeddings instead of sinusoids
    "E": {"positional": "learned"},
}

PAPER_PARAMS: dict[str, float] = {
    "base": 65,
    "big": 213,
    "B1": 58,
    "B2": 60,
    "C1": 36,
    "C2": 50,
    "C3": 80,
    "C4": 28,
    "C5": 168,
    "C6": 53,
    "C7": 90,
}

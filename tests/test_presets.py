"""The paper's configurations (Table 3) and their parameter counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transduce.config import Config, preset_config
from transduce.errors import UserError
from transduce.model.transformer import make_model, parameter_breakdown
from transduce.presets import PAPER_PARAMS, PRESETS

VOCAB = 37000  # the shared BPE vocabulary of WMT 2014 English-German (section 5.1)


def _count(name: str) -> dict[str, int]:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = make_model(preset_config(name).model, src_vocab_size=VOCAB)
    return parameter_breakdown(model)


def test_meta_device_count_equals_real_count() -> None:
    cfg = dataclasses.replace(Config().model, n_layers=1, d_model=32, d_ff=64, d_k=4, d_v=4)
    real = parameter_breakdown(make_model(cfg, src_vocab_size=100))
    with torch.device("meta"):
        meta = parameter_breakdown(make_model(cfg, src_vocab_size=100))
    assert meta == real


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_a_valid_config(name: str) -> None:
    cfg = preset_config(name)
    for key, value in PRESETS[name].items():
        section = next(
            s for s in ("model", "train", "task", "decode") if hasattr(getattr(cfg, s), key)
        )
        assert getattr(getattr(cfg, section), key) == value


def test_preset_names() -> None:
    assert {"base", "big"} <= set(PRESETS)
    table3 = {f"A{i}" for i in range(1, 5)} | {"B1", "B2"} | {f"C{i}" for i in range(1, 8)}
    table3 |= {f"D{i}" for i in range(1, 5)} | {"E"}
    assert table3 <= set(PRESETS)
    assert set(PAPER_PARAMS) <= set(PRESETS)
    assert preset_config("base") == Config()
    with pytest.raises(UserError, match="nope") as e:
        preset_config("nope")
    assert "base" in str(e.value) and "big" in str(e.value)


def test_big_model_settings() -> None:
    m = preset_config("big").model
    assert (m.d_model, m.d_ff, m.n_heads, m.dropout) == (1024, 4096, 16, 0.3)
    assert m.n_heads * m.d_k == m.d_model


@pytest.mark.parametrize("name", list(PAPER_PARAMS))
def test_parameter_count_matches_paper(name: str) -> None:
    total = _count(name)["total"] / 1e6
    paper = PAPER_PARAMS[name]
    assert abs(total - paper) / paper <= 0.08, f"{name}: {total:.1f}M vs paper {paper}M"


def test_rows_a_and_d_hold_parameters_constant() -> None:
    base = _count("base")["total"]
    for name in ["A1", "A2", "A3", "A4", "D1", "D2", "D3", "D4"]:
        assert _count(name)["total"] == base, name
    for name in ["A1", "A2", "A3", "A4"]:  # computation held constant: h * d_k = d_model
        m = preset_config(name).model
        assert m.n_heads * m.d_k == m.d_model == m.n_heads * m.d_v


def test_row_e_adds_learned_position_tables() -> None:
    cfg = preset_config("E").model
    assert cfg.positional == "learned"
    base, e = _count("base"), _count("E")
    assert e["total"] - base["total"] == 2 * cfg.max_positions * cfg.d_model
    assert e["positions"] == 2 * cfg.max_positions * cfg.d_model

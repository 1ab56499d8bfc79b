"""Every shipped config loads, and the paper's WMT recipes say what section 5 and 6.1 say."""

from __future__ import annotations

from pathlib import Path

import pytest

from transduce.config import load_config
from transduce.presets import preset_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_config_loads(path: Path) -> None:
    cfg = load_config(path)  # raises on an unknown key, a wrong type or a value out of range
    assert cfg.train.max_steps > 0


@pytest.mark.parametrize(
    "name,preset,steps,average,dropout",
    [("wmt14_en_de_base.yaml", "base", 100_000, 5, 0.1),
     ("wmt14_en_de_big.yaml", "big", 300_000, 20, 0.3)],
)  # fmt: skip
def test_wmt_recipes_follow_the_paper(
    name: str, preset: str, steps: int, average: int, dropout: float
) -> None:
    cfg = load_config(CONFIGS / name)
    assert cfg.model == preset_config(preset).model and cfg.model.dropout == dropout
    t = cfg.train
    assert (t.warmup, t.lr_factor, t.label_smoothing) == (4000, 1.0, 0.1)
    assert (t.adam_beta1, t.adam_beta2, t.adam_eps) == (0.9, 0.98, 1e-9)
    assert t.max_steps == steps and t.average_last == t.keep_last == average
    assert t.cooldown == 0.0  # eq. 3 alone
    assert 8 * t.max_tokens * t.update_freq == 25_000  # tokens per update on the 8 GPUs
    assert cfg.task.vocab_size == 37_000
    d = cfg.decode
    assert (d.beam, d.alpha, d.max_len_offset) == (4, 0.6, 50)

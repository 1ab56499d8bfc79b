"""Every shipped config loads, and the paper's WMT recipes say what section 5 and 6.1 say."""

from __future__ import annotations

from pathlib import Path

import pytest

from transduce.config import load_config, preset_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_config_loads(path: Path) -> None:
    cfg = load_config(path)  # raises on an unknown key, a wrong type or a value out of range
    assert cfg.train.max_steps > 0


@pytest.mark.parametrize(
    "name,preset,steps,average,dropout",
    [
        ("wmt14_en_de_base.yaml", "base", 100_000, 5, 0.1),
        ("wmt14_en_de_big.yaml", "big", 300_000, 20, 0.3),
    ],
)
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
    # max_tokens bounds padded tokens; batches hold real tokens worth ~85% (source) and ~87%
    # (target) of the bound (measured on Multi30k, see the config), so 8 GPUs' update holds the
    # paper's ~25k source and target tokens
    for fill in (0.85, 0.87):
        assert 24_000 <= fill * 8 * t.max_tokens * t.update_freq <= 26_000
    assert t.precision == "auto"  # bf16 where the GPU has it; the paper's P100s would emulate it
    assert cfg.task.vocab_size == 37_000
    d = cfg.decode
    assert (d.beam, d.alpha, d.max_len_offset) == (4, 0.6, 50)


def test_cpu_sized_big_recipe_makes_the_paper_s_base_to_big_changes() -> None:
    tiny = load_config(CONFIGS / "multi30k_en_de_tiny.yaml")
    big = load_config(CONFIGS / "multi30k_en_de_big_tiny.yaml")
    base_m, big_m = preset_config("base").model, preset_config("big").model
    for key in ("d_model", "d_ff", "n_heads"):  # twice the width and heads
        assert getattr(big.model, key) / getattr(tiny.model, key) == getattr(big_m, key) / getattr(
            base_m, key
        )
    assert (big.model.n_layers, big.model.d_k, big.model.d_v) == (
        tiny.model.n_layers,
        tiny.model.d_k,
        tiny.model.d_v,
    )
    assert big.model.dropout == big_m.dropout == 0.3
    assert big.train.average_last == big.train.keep_last == 20
    assert big.train.max_minutes == 3 * tiny.train.max_minutes  # 300k steps to 100k
    same = ("max_tokens", "update_freq", "warmup", "lr_factor", "cooldown", "label_smoothing")
    assert all(getattr(big.train, k) == getattr(tiny.train, k) for k in same)
    assert big.decode == tiny.decode and big.task == tiny.task


def test_parsing_recipe_makes_the_papers_changes() -> None:
    from transduce.config import ParsingTaskConfig

    cfg = load_config(CONFIGS / "ptb_parsing.yaml")
    assert isinstance(cfg.task, ParsingTaskConfig) and cfg.task.parse_data == "data/ptb-sample"
    # section 6.3's 4 layers learn the alignment far slower on 3.4k sentences and 2 cores than 2
    # (benchmarks/RESULTS.md, "positions counted in words"); counting positions in words is what
    # lets the Transformer parse at all in 30 minutes
    assert (cfg.model.n_layers, cfg.model.position_unit) == (2, "word")
    assert (cfg.decode.beam, cfg.decode.alpha, cfg.decode.max_len_offset) == (21, 0.3, 300)
    assert cfg.train.max_minutes == 30


def test_the_readmes_recurrent_parser_command_makes_that_config() -> None:
    """The README's parsing section trains the LSTM with --set overrides of ptb_parsing.yaml:
    each key exists and the result is the recurrent model (what `train` would build)."""
    import re
    import shlex

    from transduce.cli.main import build_parser
    from transduce.config import parse_overrides, update

    readme = (CONFIGS.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Parsing") : readme.index("### Seeing what it learns")]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    commands = [c for b in blocks for c in b.replace("\\\n", " ").splitlines()]
    (train,) = [c for c in commands if "architecture=rnn" in c]
    args = build_parser().parse_args(shlex.split(train)[1:])
    cfg = update(load_config(args.config), parse_overrides(args.overrides))
    assert cfg.model.architecture == "rnn" and cfg.model.rnn_attention == "additive"
    assert getattr(cfg.task, "bpe_dropout") == 0.1 and cfg.train.pad_multiple == 8  # as measured
    assert cfg.task.name == "parsing"
    evaluate = [c for c in commands if "ptb_lstm" in c and c.startswith("transduce evaluate")]
    assert (
        len(evaluate) == 1 and build_parser().parse_args(shlex.split(evaluate[0])[1:]).constrained
    )

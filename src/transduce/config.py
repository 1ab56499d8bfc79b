"""Configuration as frozen, typed dataclasses; presets are data (``transduce.presets``).

A run's configuration has four sections, ``model``, ``train``, ``task`` and ``decode``. Every key
name is unique across sections, so a command-line override can name a key alone
(``--set d_model=256``) or with its section (``--set model.d_model=256``). Unknown keys and values
of the wrong type are ``UserError``s that name the offending key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from transduce.errors import UserError


@dataclass(frozen=True)
class ModelConfig:
    """Model shape (the paper's names, Table 3 columns)."""

    n_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8
    d_k: int = 64
    d_v: int = 64
    dropout: float = 0.1  # P_drop: residual and embedding dropout
    attention_dropout: float = 0.0  # on attention weights; not in the paper
    activation_dropout: float = 0.0  # after the FFN's ReLU; not in the paper
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024  # size of the learned table (and initial sinusoid table)
    norm: Literal["post", "pre"] = "post"  # post: LayerNorm(x + Sublayer(x)) as in the paper
    tie_embeddings: bool = True  # share embeddings with the pre-softmax projection (3.4)


@dataclass(frozen=True)
class TrainConfig:
    """Training recipe (section 5)."""

    label_smoothing: float = 0.1
    warmup: int = 4000
    lr_factor: float = 1.0  # multiplies the schedule of eq. 3
    cooldown: float = 0.0  # anneal the lr linearly to 0 over this last share of the budget
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    # decoupled (AdamW) on matrices, per step p -= lr * weight_decay * p; 0 = none, the paper
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no gradient clipping
    max_tokens: int = 4096  # source+target-padded tokens per batch (max of the two)
    update_freq: int = 1  # batches accumulated per optimizer step
    max_len: int = 256  # training pairs with a longer side are dropped
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget; 0 = no limit
    seed: int = 1
    save_every: int = 1000  # optimizer steps between checkpoints
    keep_last: int = 5  # periodic checkpoints kept
    average_last: int = 0  # average this many last checkpoints at the end (0 = off)
    log_every: int = 10
    eval_every: int = 1000  # steps between validations (0 = only at the end)
    patience: int = 0  # early stopping after this many validations without gain (0 = off)
    device: str = "cpu"
    # bf16: autocast to bfloat16 (CPUs with bfloat16 instructions, GPUs); fp16: autocast to
    # float16 with loss scaling (GPUs); fp32 master weights in both. auto: bf16 where the
    # device computes in bfloat16 natively (training.trainer.native_bf16), else fp32: 1.7x
    # faster on a 2-core AMX CPU, the same val BLEU at equal updates (benchmarks/RESULTS.md)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    target_seq_accuracy: float = 0.0  # stop once validation exact match reaches this (0 = off)
    valid_beam: int = 1  # translation: beam for the validation BLEU (1 = greedy, the fastest)
    tensorboard: bool = True  # also log metrics to run_dir/tensorboard (needs tensorboard)


@dataclass(frozen=True)
class TaskConfig:
    """What to learn: a synthetic task generated in code (``copy``, ``reverse``, ``addition``)
    or ``translation`` between sentence-aligned text files.

    Translation file paths may hold environment variables (``${TRANSDUCE_DATA}/...``), expanded
    when training starts; relative paths are relative to the current directory. Files may be
    gzip-compressed (``.gz``).
    """

    name: Literal["copy", "reverse", "addition", "translation"] = "addition"
    train_size: int = 50_000
    valid_size: int = 1_000
    min_digits: int = 1  # addition: operand lengths
    max_digits: int = 3
    reverse_input: bool = False  # feed the source sequence reversed
    min_length: int = 1  # copy / reverse: sequence lengths
    max_length: int = 10
    n_symbols: int = 10  # copy / reverse: alphabet size
    data_seed: int = 1234
    train_src: str = ""  # translation: training source file, one sentence per line
    train_tgt: str = ""  # translation: its line-aligned target file
    valid_src: str = ""  # translation: validation files (loss, BLEU, best.pt); optional
    valid_tgt: str = ""
    vocab_size: int = 8000  # translation: shared source+target SentencePiece BPE pieces
    vocab_sample: int = 0  # translation: learn the vocabulary on this many sentences (0 = all)
    # translation: BPE-dropout (Provilkov et al., 2020; not in the paper) on both sides of the
    # training text, a new segmentation every epoch; 0 = the one deterministic segmentation.
    # 0.1 makes Multi30k's training text ~40% more pieces and, in a one-hour CPU budget, learned
    # far slower (val greedy BLEU 8.7 against 29.0 at 2,000 updates; benchmarks/RESULTS.md)
    bpe_dropout: float = 0.0
    max_valid_sentences: int = 0  # translation: validate on the first N pairs only (0 = all)


@dataclass(frozen=True)
class DecodeConfig:
    """Inference settings (section 6.1: beam 4, alpha 0.6, max length input + 50)."""

    beam: int = 4
    alpha: float = 0.6  # GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha
    max_len_offset: int = 50
    decode_batch: int = 256  # sentences per decoding batch
    batch_tokens: int = 4000  # translation: padded source tokens per batch (sorted by length)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


_SECTION_TYPES = {
    "model": ModelConfig,
    "train": TrainConfig,
    "task": TaskConfig,
    "decode": DecodeConfig,
}
# Key name -> section; names are unique across sections (a test checks it).
KEY_SECTION: dict[str, str] = {
    f.name: section for section, cls in _SECTION_TYPES.items() for f in fields(cls)
}


def coerce(section: str, key: str, value: Any) -> Any:
    """Check (and for strings from the command line, convert) ``value`` for ``section.key``."""
    hint = typing.get_type_hints(_SECTION_TYPES[section])[key]
    where = f"{section}.{key}"
    origin = get_origin(hint)
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise UserError(f"{where} must be one of {', '.join(map(str, allowed))}; got {value!r}")
        return value
    if origin in (types.UnionType, typing.Union):
        raise AssertionError(f"unsupported config type for {where}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise UserError(f"{where} must be true or false; got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise UserError(f"{where} must be an integer; got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise UserError(f"{where} must be an integer; got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError(f"{where} must be a number; got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where} must be a string; got {value!r}")
    raise AssertionError(f"unsupported config type {hint} for {where}")


def resolve_key(key: str) -> tuple[str, str]:
    """'d_model' or 'model.d_model' -> ('model', 'd_model'); unknown keys are UserErrors."""
    if "." in key:
        section, name = key.split(".", 1)
        if section not in _SECTION_TYPES:
            raise UserError(
                f"unknown config section {section!r} in {key!r}; "
                f"sections are {', '.join(_SECTION_TYPES)}"
            )
        if KEY_SECTION.get(name) != section:
            raise UserError(f"unknown config key {key!r}")
        return section, name
    if key not in KEY_SECTION:
        raise UserError(f"unknown config key {key!r}")
    return KEY_SECTION[key], key


def update(cfg: Config, values: dict[str, Any]) -> Config:
    """Return ``cfg`` with flat or dotted keys replaced; values are type-checked."""
    by_section: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, name = resolve_key(key)
        by_section.setdefault(section, {})[name] = coerce(section, name, value)
    out = cfg
    for section, changes in by_section.items():
        out = replace(out, **{section: replace(getattr(out, section), **changes)})
    validate(out)
    return out


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """['d_model=256', ...] -> {'d_model': '256'}."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def from_dict(data: dict[str, Any], *, source: str = "config") -> Config:
    """Build a Config from nested sections (a parsed YAML file); ``preset`` names a base."""
    from transduce.presets import preset_config

    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    data = dict(data)
    preset = data.pop("preset", None)
    cfg = preset_config(preset) if preset is not None else Config()
    flat: dict[str, Any] = {}
    for section, values in data.items():
        if section not in _SECTION_TYPES:
            raise UserError(
                f"{source}: unknown section {section!r}; sections are "
                f"preset, {', '.join(_SECTION_TYPES)}"
            )
        if not isinstance(values, dict):
            raise UserError(f"{source}: section {section!r} must be a mapping")
        for key, value in values.items():
            flat[f"{section}.{key}"] = value
    try:
        return update(cfg, flat)
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def load_config(path: str | Path) -> Config:
    """Read a config file (see ``configs/``): TOML if its name ends in ``.toml``, else YAML.
    Both hold the same sections and keys."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read ({e})") from None
    if p.suffix.lower() == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{p}: not valid TOML: {e}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UserError(f"{p}: not valid YAML: {e}") from None
    return from_dict(data or {}, source=str(p))


def validate(cfg: Config) -> None:
    """Cross-field checks, each a UserError naming the key."""
    m, t, k, d = cfg.model, cfg.train, cfg.task, cfg.decode
    positive = {
        "n_layers": m.n_layers, "d_model": m.d_model, "d_ff": m.d_ff, "n_heads": m.n_heads,
        "d_k": m.d_k, "d_v": m.d_v, "max_positions": m.max_positions, "warmup": t.warmup,
        "max_tokens": t.max_tokens, "update_freq": t.update_freq, "max_len": t.max_len,
        "max_steps": t.max_steps, "keep_last": t.keep_last, "log_every": t.log_every,
        "save_every": t.save_every, "train_size": k.train_size, "valid_size": k.valid_size,
        "beam": d.beam, "decode_batch": d.decode_batch, "n_symbols": k.n_symbols,
        "min_digits": k.min_digits, "min_length": k.min_length, "vocab_size": k.vocab_size,
        "valid_beam": t.valid_beam, "batch_tokens": d.batch_tokens,
    }  # fmt: skip
    for key, value in positive.items():
        if value <= 0:
            raise UserError(f"{key} must be positive; got {value}")
    for key, value in {"dropout": m.dropout, "attention_dropout": m.attention_dropout,
                       "activation_dropout": m.activation_dropout,
                       "label_smoothing": t.label_smoothing,
                       "bpe_dropout": k.bpe_dropout}.items():  # fmt: skip
        if not 0.0 <= value < 1.0:
            raise UserError(f"{key} must be in [0, 1); got {value}")
    if k.bpe_dropout and k.name != "translation":
        raise UserError(
            f"bpe_dropout applies to subword vocabularies (task translation); task.name is "
            f"{k.name!r}"
        )
    if not 0.0 <= t.cooldown <= 1.0:
        raise UserError(f"cooldown must be in [0, 1]; got {t.cooldown}")
    if t.average_last > t.keep_last:
        raise UserError(f"average_last ({t.average_last}) exceeds keep_last ({t.keep_last})")
    if k.max_digits < k.min_digits:
        raise UserError(f"max_digits ({k.max_digits}) is below min_digits ({k.min_digits})")
    if k.max_length < k.min_length:
        raise UserError(f"max_length ({k.max_length}) is below min_length ({k.min_length})")
    for key, value in {"max_epochs": t.max_epochs, "max_minutes": t.max_minutes,
                       "eval_every": t.eval_every, "patience": t.patience,
                       "average_last": t.average_last, "max_len_offset": d.max_len_offset,
                       "clip_norm": t.clip_norm, "alpha": d.alpha, "weight_decay": t.weight_decay,
                       "max_valid_sentences": k.max_valid_sentences,
                       "vocab_sample": k.vocab_sample}.items():  # fmt: skip
        if value < 0:
            raise UserError(f"{key} must not be negative; got {value}")
    if bool(k.valid_src) != bool(k.valid_tgt):
        given, missing = ("valid_src", "valid_tgt") if k.valid_src else ("valid_tgt", "valid_src")
        raise UserError(
            f"{given} is set but {missing} is not; give both validation files or neither"
        )

"""Typed configuration: keys, types, validation, overrides and YAML files."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal, get_args, get_origin

import pytest

from transduce.config import (
    KEY_SECTION,
    TASKS,
    Config,
    DecodeConfig,
    ModelConfig,
    ParsingTaskConfig,
    SyntheticTaskConfig,
    TrainConfig,
    TranslationTaskConfig,
    coerce,
    from_dict,
    load_config,
    parse_overrides,
    resolve_key,
    update,
)
from transduce.errors import UserError

SECTIONS: dict[str, tuple[type, ...]] = {
    "model": (ModelConfig,),
    "train": (TrainConfig,),
    "task": (SyntheticTaskConfig, TranslationTaskConfig, ParsingTaskConfig),
    "decode": (DecodeConfig,),
}


def _hint(key: str) -> object:
    cls = next(c for c in SECTIONS[KEY_SECTION[key]] if key in typing.get_type_hints(c))
    return typing.get_type_hints(cls)[key]


def test_sections_of_config_are_the_four_sections() -> None:
    assert {f.name: f.type for f in dataclasses.fields(Config)} == {
        "model": "ModelConfig",
        "train": "TrainConfig",
        "task": "TaskConfig",
        "decode": "DecodeConfig",
    }
    assert set(TASKS) == {"copy", "reverse", "addition", "translation", "parsing"}


def test_key_names_are_unique_across_sections() -> None:
    per_section = {
        section: {f.name for cls in classes for f in dataclasses.fields(cls)}
        for section, classes in SECTIONS.items()
    }
    names = [n for keys in per_section.values() for n in keys]
    duplicates = {n for n in names if names.count(n) > 1}
    assert not duplicates, f"keys in more than one section: {duplicates}"
    assert set(KEY_SECTION) == set(names)
    for section, keys in per_section.items():
        for name in keys:
            assert KEY_SECTION[name] == section


def test_defaults_are_the_base_model_and_valid() -> None:
    cfg = Config()
    m = cfg.model
    assert (m.n_layers, m.d_model, m.d_ff, m.n_heads, m.d_k, m.d_v) == (6, 512, 2048, 8, 64, 64)
    assert m.dropout == 0.1 and m.norm == "post" and m.positional == "sinusoidal"
    assert cfg.train.label_smoothing == 0.1 and cfg.train.warmup == 4000
    assert (cfg.train.adam_beta1, cfg.train.adam_beta2, cfg.train.adam_eps) == (0.9, 0.98, 1e-9)
    assert (cfg.decode.beam, cfg.decode.alpha, cfg.decode.max_len_offset) == (4, 0.6, 50)


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().model.d_model = 3  # type: ignore[misc]


def test_update_flat_and_dotted_keys() -> None:
    cfg = update(Config(), {"d_model": 256, "train.warmup": "8000", "model.norm": "pre"})
    assert cfg.model.d_model == 256
    assert cfg.train.warmup == 8000 and isinstance(cfg.train.warmup, int)
    assert cfg.model.norm == "pre"
    assert Config().model.d_model == 512  # the original is untouched
    assert cfg.to_dict()["model"]["d_model"] == 256


@pytest.mark.parametrize("key", ["d_modle", "model.d_modle", "train.d_model", "decode.beam_size"])
def test_unknown_key_is_a_user_error_naming_it(key: str) -> None:
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        update(Config(), {key: 1})


def test_unknown_section_in_dotted_key() -> None:
    with pytest.raises(UserError, match="modle"):
        resolve_key("modle.d_model")
    assert resolve_key("d_model") == ("model", "d_model")
    assert resolve_key("decode.beam") == ("decode", "beam")


@pytest.mark.parametrize(
    "key,value",
    [
        ("d_model", "abc"),
        ("model.n_layers", "2.5"),
        ("warmup", 3.5),
        ("dropout", "x"),
        ("tie_embeddings", "maybe"),
        ("d_ff", True),
        ("device", 3),
        ("beam", None),
    ],
)
def test_wrong_type_is_a_user_error_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(UserError) as e:
        update(Config(), {key: value})
    assert key.split(".")[-1] in str(e.value)


@pytest.mark.parametrize(
    "key,text,expected",
    [
        ("d_model", "256", 256),
        ("max_steps", "100_000", 100_000),
        ("dropout", "0.2", 0.2),
        ("warmup", 4000.0, 4000),
        ("lr_factor", 2, 2.0),
        ("tie_embeddings", "false", False),
        ("tie_embeddings", "Yes", True),
        ("tie_embeddings", "0", False),
        ("device", "cuda:1", "cuda:1"),
    ],
)
def test_values_are_coerced(key: str, text: object, expected: object) -> None:
    value = coerce(KEY_SECTION[key], key, text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    "key,bad", [("norm", "mid"), ("positional", "rotary"), ("precision", "fp8"), ("name", "sort")]
)
def test_literal_values_are_validated(key: str, bad: str) -> None:
    hint = _hint(key)
    assert get_origin(hint) is Literal
    with pytest.raises(UserError, match=key):
        update(Config(), {key: bad})
    for good in get_args(hint):
        assert getattr(getattr(update(Config(), {key: good}), KEY_SECTION[key]), key) == good


@pytest.mark.parametrize(
    "key,value",
    [
        ("d_model", 0),
        ("n_layers", -1),
        ("n_heads", 0),
        ("d_k", 0),
        ("warmup", 0),
        ("beam", 0),
        ("max_positions", 0),
        ("dropout", -0.1),
        ("dropout", 1.0),
        ("label_smoothing", 1.5),
        ("attention_dropout", -0.5),
        ("clip_norm", -1.0),
        ("max_epochs", -1),
        ("alpha", -0.1),
        ("max_len_offset", -1),
        ("patience", -2),
        ("bpe_dropout", 1.0),
        ("bpe_dropout", -0.1),
        ("weight_decay", -0.01),
        ("alpha", 10.5),
        ("max_len_offset", 10_001),
        ("dropout", float("nan")),
        ("max_minutes", float("inf")),
        ("lr_factor", "nan"),
        ("alpha", "-inf"),
        ("max_bad_updates", 0),
        ("adam_beta1", 1.5),
        ("adam_beta2", -1.0),
        ("adam_eps", 0.0),
        ("adam_eps", -1.0),
        ("lr_factor", 0.0),  # nothing learned
        ("lr_factor", -1.0),  # gradient ascent
        ("seed", -1),
        ("seed", 2**32),
        ("target_seq_accuracy", 2.0),
    ],
)
def test_validate_rejects_out_of_range_values(key: str, value: object) -> None:
    with pytest.raises(UserError, match=key):
        update(Config(), {key: value})


def test_validate_cross_field_checks() -> None:
    with pytest.raises(UserError, match="max_digits"):
        update(Config(), {"min_digits": 4, "max_digits": 3})
    with pytest.raises(UserError, match="max_length"):
        update(Config(), {"name": "copy", "min_length": 5, "max_length": 2})
    update(Config(), {"min_digits": 3, "max_digits": 3, "max_epochs": 0, "clip_norm": 0.0})
    with pytest.raises(UserError, match="bpe_dropout is not a key of task SyntheticTaskConfig"):
        update(Config(), {"bpe_dropout": 0.1})  # a character vocabulary has no merges to drop
    assert update(Config(), {"name": "translation", "bpe_dropout": 0.1}).task.bpe_dropout == 0.1
    with pytest.raises(UserError, match="valid_tgt"):
        update(Config(), {"name": "translation", "valid_src": "a.txt"})


@pytest.mark.parametrize(
    "build,key",
    [
        (lambda: ModelConfig(n_heads=0), "n_heads"),
        (lambda: ModelConfig(d_model="512"), "d_model"),
        (lambda: ModelConfig(norm="mid"), "norm"),
        (lambda: TrainConfig(dropout=0.1), None),
        (lambda: TrainConfig(average_last=9, keep_last=2), "average_last"),
        (lambda: SyntheticTaskConfig(name="copy", min_length=3, max_length=2), "max_length"),
        (lambda: TranslationTaskConfig(bpe_dropout=1.0), "bpe_dropout"),
        (lambda: DecodeConfig(beam=0), "beam"),
        (lambda: DecodeConfig(alpha=True), "alpha"),
        (lambda: Config(task=ModelConfig()), "task"),
    ],
)
def test_configs_built_in_python_are_checked_on_construction(build, key: str | None) -> None:
    with pytest.raises((UserError, TypeError)) as e:
        build()
    if key is not None:
        assert e.type is UserError and key in str(e.value)


def test_an_int_is_taken_for_a_float_in_python() -> None:
    cfg = TrainConfig(lr_factor=2)
    assert cfg.lr_factor == 2.0 and type(cfg.lr_factor) is float


def test_each_task_sees_only_its_own_keys() -> None:
    cfg = update(Config(), {"name": "translation", "train_src": "a.en", "vocab_size": 500})
    assert isinstance(cfg.task, TranslationTaskConfig) and cfg.task.vocab_size == 500
    assert "min_digits" not in cfg.to_dict()["task"]
    with pytest.raises(UserError, match="min_digits is not a key of task TranslationTaskConfig"):
        update(cfg, {"min_digits": 2})
    # another task: its own defaults, where the old one's settings are not lost by it
    with pytest.raises(UserError, match=r"settings \(task.train_src, task.vocab_size\) are not"):
        update(cfg, {"name": "copy", "max_length": 5})
    back = update(Config(), {"name": "copy", "max_length": 5})
    assert back.task == SyntheticTaskConfig(name="copy", max_length=5)
    with pytest.raises(UserError, match="train_src"):
        from_dict({"task": {"name": "addition", "train_src": "a.en"}})


def test_configs_stored_before_the_task_split_still_load() -> None:
    # What a checkpoint written before the split holds: every task key, defaults included
    old = {
        "model": {"d_model": 64},
        "task": {
            "name": "translation",
            "train_size": 50000,
            "valid_size": 1000,
            "min_digits": 1,
            "max_digits": 3,
            "reverse_input": False,
            "min_length": 1,
            "max_length": 10,
            "n_symbols": 10,
            "data_seed": 1234,
            "train_src": "t.en",
            "train_tgt": "t.de",
            "valid_src": "",
            "valid_tgt": "",
            "vocab_size": 8000,
            "vocab_sample": 0,
            "bpe_dropout": 0.0,
            "max_valid_sentences": 0,
        },
    }
    cfg = from_dict(old, stored=True)
    assert cfg.task == TranslationTaskConfig(train_src="t.en", train_tgt="t.de")
    with pytest.raises(UserError, match="train_size"):
        from_dict(old)  # a user's file is held to the task's own keys


def test_parse_overrides() -> None:
    assert parse_overrides(["d_model=256", " model.norm = pre ", "device=cuda:0=x"]) == {
        "d_model": "256",
        "model.norm": "pre",
        "device": "cuda:0=x",
    }
    assert parse_overrides([]) == {}
    with pytest.raises(UserError, match="d_model"):
        parse_overrides(["d_model"])


def test_from_dict_sections_and_preset() -> None:
    cfg = from_dict({"preset": "big", "model": {"n_layers": 2}, "decode": {"beam": 1}})
    assert cfg.model.d_model == 1024 and cfg.model.n_layers == 2 and cfg.decode.beam == 1
    assert from_dict({}) == Config()


def test_from_dict_errors() -> None:
    with pytest.raises(UserError, match="modle"):
        from_dict({"modle": {"d_model": 3}})
    with pytest.raises(UserError, match="model"):
        from_dict({"model": 3})
    with pytest.raises(UserError, match="mapping"):
        from_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(UserError, match="nope"):
        from_dict({"preset": "nope"})
    # a key in the wrong section is unknown there
    with pytest.raises(UserError, match="warmup"):
        from_dict({"model": {"warmup": 10}})
    with pytest.raises(UserError, match="d_model") as e:
        from_dict({"model": {"d_model": "abc"}}, source="my.yaml")
    assert "my.yaml" in str(e.value)


def test_load_config_reads_yaml(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "preset: C4\nmodel:\n  n_layers: 3\n  norm: pre\ntrain:\n  warmup: 100\n"
        "  lr_factor: 2\ntask:\n  name: copy\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert cfg.model.d_model == 256 and cfg.model.d_k == 32  # from the preset
    assert cfg.model.n_layers == 3 and cfg.model.norm == "pre"
    assert cfg.train.warmup == 100 and cfg.train.lr_factor == 2.0
    assert cfg.task.name == "copy"
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")  # no task named: a mistake, not the default task
    with pytest.raises(UserError, match="empty.yaml: holds no settings"):
        load_config(str(empty))


def test_load_config_reads_toml_as_the_same_config(tmp_path) -> None:
    yaml_file, toml_file = tmp_path / "run.yaml", tmp_path / "run.TOML"
    yaml_file.write_text(
        "preset: C4\nmodel:\n  n_layers: 3\ntrain:\n  adam_eps: 1.0e-9\n  warmup: 100\n"
        "task:\n  name: translation\n  train_src: a.txt\n  vocab_sample: 500\n",
        encoding="utf-8",
    )
    toml_file.write_text(
        'preset = "C4"\n[model]\nn_layers = 3\n[train]\nadam_eps = 1.0e-9\nwarmup = 100\n'
        '[task]\nname = "translation"\ntrain_src = "a.txt"\nvocab_sample = 500\n',
        encoding="utf-8",
    )
    cfg = load_config(toml_file)
    assert cfg == load_config(yaml_file)
    assert cfg.model.n_layers == 3 and cfg.model.d_model == 256 and cfg.task.vocab_sample == 500


@pytest.mark.parametrize(
    ("suffix", "syntax", "broken", "misspelt"),
    [
        (".yaml", "YAML", "model: [1, 2\n", "model:\n  d_modle: 3\n"),
        (".toml", "TOML", "[model\nn_layers = 3\n", "[model]\nd_modle = 3\n"),
    ],
)
def test_load_config_errors(tmp_path, suffix: str, syntax: str, broken: str, misspelt: str) -> None:
    missing = tmp_path / f"missing{suffix}"
    with pytest.raises(UserError, match=f"missing{suffix}"):
        load_config(missing)
    bad = tmp_path / f"bad{suffix}"
    bad.write_text(broken, encoding="utf-8")
    with pytest.raises(UserError, match=f"bad{suffix}: not valid {syntax}"):
        load_config(bad)
    wrong = tmp_path / f"wrong{suffix}"
    wrong.write_text(misspelt, encoding="utf-8")
    with pytest.raises(UserError, match="d_modle") as e:
        load_config(wrong)
    assert f"wrong{suffix}" in str(e.value)


@pytest.mark.parametrize(
    "text",
    ["train: {max_steps: 1, max_steps: 5}\n", "model: {n_layers: 1}\nmodel: {d_model: 32}\n"],
)
def test_a_yaml_key_given_twice_is_refused(tmp_path, text: str) -> None:
    # PyYAML keeps the last in silence; TOML refuses it, and so does transduce for YAML
    path = tmp_path / "twice.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=r"twice.yaml: not valid YAML: line \d+, .* is given twice"):
        load_config(path)


@pytest.mark.parametrize("text", ["model:\n  ? [a, b]\n  : 1\n", "? {a: 1}\n: 2\n", "[a]: 1\n"])
def test_a_yaml_key_that_is_a_list_or_mapping_is_refused(tmp_path, text: str) -> None:
    path = tmp_path / "key.yaml"  # was a TypeError (unhashable) out of the duplicate-key check
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=r"key.yaml: not valid YAML: line \d+, .* not a list or"):
        load_config(path)


def test_yaml_merge_keys_work(tmp_path) -> None:
    # `<<:` merges a mapping in, and a key given beside it overrides it: not "given twice"
    path = tmp_path / "merge.yaml"
    text = "model: &m {n_layers: 1, d_model: 32}\ntrain:\n  <<: {max_steps: 3, warmup: 7}\n"
    path.write_text(text + "  max_steps: 5\n", encoding="utf-8")
    cfg = load_config(path)
    assert (cfg.train.max_steps, cfg.train.warmup, cfg.model.d_model) == (5, 7, 32)


def test_parsing_word_slots_are_named_once() -> None:
    from transduce.config import ParsingTaskConfig

    with pytest.raises(UserError, match="keep_tags and slot_pieces"):
        ParsingTaskConfig(keep_tags=True, slot_pieces=True)
    assert ParsingTaskConfig(slot_pieces=True).slot_pieces
    with pytest.raises(UserError, match="slot_pieces .* bpe_dropout"):
        ParsingTaskConfig(slot_pieces=True, bpe_dropout=0.1)


def test_keys_a_run_would_ignore_are_refused() -> None:
    """What an audit found doing nothing: another synthetic task's keys, exact match targets
    and valid_beam where the task has none, early stopping without validation during the run
    or without validation files."""
    for values, words in (
        ({"n_symbols": 40}, "task.n_symbols is not read by task addition"),
        ({"name": "copy", "max_digits": 5}, "task.max_digits is not read by task copy"),
        ({"eval_every": 0, "patience": 2}, "patience stops a run at a validation"),
        ({"eval_every": 0, "target_seq_accuracy": 0.9}, "eval_every 0 validates only"),
        ({"name": "translation", "target_seq_accuracy": 0.5}, "translation validates by BLEU"),
        ({"valid_beam": 4}, "a synthetic task's validation decodes greedily"),
        ({"name": "translation", "patience": 3}, "train.patience needs validation"),
        ({"name": "translation", "max_valid_sentences": 9}, "task.max_valid_sentences needs"),
    ):
        with pytest.raises(UserError, match=words):
            update(Config(), values)
    # a task changed by name starts its own keys from their defaults, the other task's too
    changed = update(update(Config(), {"max_digits": 5}), {"name": "reverse"})
    assert changed.task.max_digits == 3 and changed.task.name == "reverse"
    both = {"name": "translation", "valid_src": "a", "valid_tgt": "b", "patience": 3}
    assert update(Config(), both).train.patience == 3
    # a stored config keeps loading: the keys its task does not read are dropped there
    stored = Config().to_dict()
    stored["task"]["n_symbols"] = 40  # written before the check, read by no addition run
    assert from_dict(stored, stored=True).task.n_symbols == 10


@pytest.mark.parametrize("sample", [1, 50, 100])
def test_a_vocab_sample_sentencepiece_cannot_take_is_refused_naming_the_key(sample: int) -> None:
    """SentencePiece refuses a sample of 1 to 100 sentences with an empty reason, and only once
    the corpus has been read."""
    task = {"name": "translation", "train_src": "a", "train_tgt": "b", "vocab_sample": sample}
    with pytest.raises(UserError, match=rf"^config: vocab_sample must be 0 .* got {sample}$"):
        from_dict({"task": task})
    assert from_dict({"task": {**task, "vocab_sample": 101}}).task.vocab_sample == 101


def test_a_set_that_would_lose_settings_or_mean_two_values_is_refused(tmp_path) -> None:
    from transduce.config import load_config, parse_overrides, update

    translation = from_dict({"task": {"name": "translation", "train_src": "a", "train_tgt": "b"}})
    with pytest.raises(UserError, match=r"^task.name addition: the config's translation settings "):
        update(translation, {"name": "addition"})
    assert update(from_dict({}), {"name": "reverse"}).task.name == "reverse"  # nothing lost
    with pytest.raises(UserError, match="^--set train.max_steps and --set max_steps set one key"):
        parse_overrides(["max_steps=1", "train.max_steps=2"])
    with pytest.raises(UserError, match="^--set d_model and --set d_model"):
        parse_overrides(["d_model=1", "d_model=2"])
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(UserError, match="empty.yaml: holds no settings"):
        load_config(empty)
    marked = tmp_path / "marked.toml"
    marked.write_text('\ufeff[task]\nname = "reverse"\n', encoding="utf-8")
    assert load_config(marked).task.name == "reverse"


def test_a_stored_decode_section_with_sampling_settings_but_no_sampling_loads() -> None:
    """A checkpoint's config written before such settings were refused without sampling: they
    were unread, so they are dropped there (a config file with them is refused)."""
    decode = {"beam": 3, "temperature": 0.7, "top_k": 5}
    assert from_dict({"decode": decode}, stored=True).decode == DecodeConfig(beam=3)
    with pytest.raises(UserError, match="temperature, top_k go with sampling: true"):
        from_dict({"decode": decode})
    sampler = {**decode, "sampling": True}
    assert from_dict({"decode": sampler}, stored=True).decode.top_k == 5


def test_pad_multiple_past_max_len_is_refused() -> None:
    """pad_multiple 100000 padded every batch to 100k positions: a run that never got far and
    that only SIGKILL stopped (its signal handler never ran inside the long products)."""
    from transduce.config import TrainConfig

    assert TrainConfig(pad_multiple=8, max_len=256).pad_multiple == 8
    assert TrainConfig(pad_multiple=256, max_len=256).pad_multiple == 256
    with pytest.raises(UserError, match=r"pad_multiple must be at most max_len \(256\); got 257"):
        TrainConfig(pad_multiple=257, max_len=256)

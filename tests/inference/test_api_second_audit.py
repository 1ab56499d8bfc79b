"""The Python API's answers to what an audit of it fed it: each setting acts or is refused in one
line, and input that is not what a method takes is a TypeError or a UserError naming it, never an
error from deep inside or a silent misreading. (The command line's are in tests/cli.)"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from inference_testkit import (
    save_toy_parser,
    save_toy_synthetic,
    save_toy_translation_model,
)

import transduce.inference.translator as translator_module
from transduce.checkpoint import load_model
from transduce.checkpoint.runs import average
from transduce.config import DecodeConfig
from transduce.errors import SentenceError, UserError
from transduce.inference.attention_maps import attention_maps, draw_attention
from transduce.inference.evaluation import evaluate_files
from transduce.inference.translator import Translator
from transduce.parsing.parser import Parser
from transduce.training.run import train

DECODE = {"beam": 2, "max_len_offset": 5}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("api_audit")
    learned = {"positional": "learned", "max_positions": 30}
    return {
        "shared": save_toy_translation_model(d / "shared.pt", DECODE),
        "sampler": save_toy_translation_model(
            d / "sampler.pt", {**DECODE, "sampling": True, "sampling_seed": 5, "top_k": 3}
        ),
        "parser": save_toy_parser(d / "parser.pt", DECODE),
        "synthetic": save_toy_synthetic(d / "synthetic.pt", DECODE, learned),
        "reversed": _reversed(d),
    }


def _reversed(d: Path) -> Path:
    """An addition model that reads its sources reversed (task.reverse_input)."""
    from transduce import checkpoint

    path = save_toy_synthetic(d / "plain.pt", DECODE)
    data = checkpoint.load(path)
    data["config"]["task"]["reverse_input"] = True
    checkpoint.save(data, d / "reversed.pt")
    return d / "reversed.pt"


# --- decoding settings ------------------------------------------------------------------------


def test_sampling_settings_without_sampling_are_refused_naming_them() -> None:
    for key, value in (("temperature", 0.5), ("top_k", 5), ("top_p", 0.5), ("sampling_seed", 3)):
        with pytest.raises(UserError, match=rf"^{key} goes with sampling: true"):
            DecodeConfig(**{key: value})
    with pytest.raises(UserError, match="^temperature, top_k go with"):
        DecodeConfig(temperature=0.5, top_k=2)
    sampler = DecodeConfig(sampling=True, temperature=0.5, top_k=2, sampling_seed=9, beam=3)
    assert sampler.searching() == DecodeConfig(beam=3)


def test_a_beam_asked_of_a_model_that_samples_is_a_search(models) -> None:
    t = Translator.load(models["sampler"])
    assert t.decode_config().sampling and t.decode_config(alpha=0.2).sampling
    search = t.decode_config(beam=2)
    assert search == DecodeConfig(beam=2, max_len_offset=5)  # the checkpoint's, searching
    sentences = ["the dog runs", "a cat"]
    with pytest.raises(UserError, match="must not exceed the beam size"):  # not 10 samples
        t.translate_nbest(sentences, 10, search)


def test_decode_batch_caps_the_sentences_of_each_search(models, monkeypatch) -> None:
    t = Translator.load(models["shared"])
    sentences = ["the dog", "a cat runs", "dog", "the red ball", "a man"]
    calls: list[int] = []
    generate = translator_module.generate

    def counting(decoding, src, cfg, nbest):  # noqa: ANN001, ANN202
        calls.append(src.size(0))
        return generate(decoding, src, cfg, nbest)

    monkeypatch.setattr(translator_module, "generate", counting)
    whole = t.translate(sentences)
    assert calls == [5]
    calls.clear()
    two = t.translate(sentences, replace(t.decode_config(), decode_batch=2))
    assert calls == [2, 2, 1] and two == whole


def test_score_checks_no_beam_and_takes_what_the_positions_hold(models) -> None:
    t = Translator.load(models["synthetic"])  # 30 learned positions, 13 tokens
    big_beam = replace(t.decode_config(), beam=1000)  # scoring searches nothing
    assert len(t.score(["1+2"], ["3"], big_beam)) == 1
    # n tokens + EOS (source) and BOS + n tokens (target): 29 fit in 30 positions
    pair = t.score(["1" * 29], ["2" * 29])[0]
    assert torch.isfinite(torch.tensor(pair.log_prob))
    with pytest.raises(SentenceError, match="^target 1 has 30 subword tokens.* at most 29"):
        t.score(["1"], ["2" * 30])
    with pytest.raises(SentenceError, match="^sentence 1 has 30 subword tokens"):
        t.score(["1" * 30], ["2"])


# --- text in ----------------------------------------------------------------------------------


def test_text_that_is_not_characters_is_refused_naming_the_sentence(models) -> None:
    t = Translator.load(models["shared"])
    with pytest.raises(SentenceError, match=r"^sentence 2 holds '\\ud800'"):
        t.translate(["the dog", "a \ud800 cat"])
    with pytest.raises(SentenceError, match="^target 1 holds"):
        t.score(["the dog"], ["\udfff"])


def test_a_line_the_tokenizer_reads_as_nothing_is_answered_as_an_empty_one(models) -> None:
    t = Translator.load(models["shared"])
    zero_width = "\u200b"
    assert t.vocab.encode(zero_width) == []  # what makes the case
    nbest = t.translate_nbest([zero_width, "", "the dog"], 1)
    assert [(h[0].text, h[0].score) for h in nbest[:2]] == [("", 0.0), ("", 0.0)]
    with pytest.raises(SentenceError, match="^prefix 1: a prefix for an empty input line"):
        t.translate([zero_width], prefixes=["der"])


# --- a model's wrapper and its results --------------------------------------------------------


def test_of_model_converts_a_copy(models) -> None:
    model, vocab, cfg = load_model(models["shared"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = Translator.of_model(model, vocab, cfg, "bf16")
    assert next(t.model.parameters()).dtype == torch.bfloat16
    after = model.state_dict()
    assert all(
        after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items()
    )
    same = Translator.of_model(model, vocab, cfg)  # nothing to convert: no copy
    assert same.model is model


def test_evaluate_files_refuses_a_parser_and_a_stray_lowercase(models, tmp_path) -> None:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the dog\n")
    ref.write_text("(S (NP XX))\n")
    with pytest.raises(UserError, match="^a parsing model is evaluated with EVALB"):
        evaluate_files(Translator.load(models["parser"]), src, ref)
    with pytest.raises(TypeError, match="lowercase must be True or False"):
        evaluate_files(Translator.load(models["shared"]), src, ref, lowercase="no")  # type: ignore[arg-type]


def test_align_and_attention_take_only_what_they_name(models, tmp_path) -> None:
    t = Translator.load(models["shared"])
    for layer in (0.5, "0", True):
        with pytest.raises(TypeError, match="layer must be an int"):
            t.align(["the dog"], ["der hund"], layer=layer)  # type: ignore[arg-type]
    maps = attention_maps(t.model, t.vocab, "the dog", "der hund")
    with pytest.raises(UserError, match="^attention kind 'bogus': one of cross, encoder, decoder"):
        maps.of("bogus")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="^attention kind 'bogus'"):
        draw_attention(t.model, t.vocab, "the dog", tmp_path / "a.png", kind="bogus")  # type: ignore[arg-type]
    assert not (tmp_path / "a.png").exists()
    with pytest.raises(TypeError, match="the source must be a str"):
        attention_maps(t.model, t.vocab, None)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="max_len_offset must be at least 0"):
        attention_maps(t.model, t.vocab, "the dog", max_len_offset=-1)


def test_ensembles_and_averages_take_lists_and_one_task(models) -> None:
    paths = (p for p in [models["shared"], models["shared"]])  # any iterable of paths
    assert len(Translator.load_ensemble(paths).translate(["the dog"])) == 1
    with pytest.raises(UserError, match="^average takes a list of checkpoints, not one"):
        average(str(models["shared"]))  # type: ignore[arg-type]
    plain = models["reversed"].parent / "plain.pt"
    with pytest.raises(
        UserError, match=r"its task differs .*\(task.reverse_input: True, not False"
    ):
        average([plain, models["reversed"]])


def test_train_wants_a_config(tmp_path) -> None:
    with pytest.raises(TypeError, match="^cfg must be a Config"):
        train({"model": {}}, tmp_path / "run")  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


# --- the parser -------------------------------------------------------------------------------


def test_the_parser_wants_sentences_of_words(models) -> None:
    p = Parser.load(models["parser"])
    with pytest.raises(TypeError, match="not one str"):
        p.parse("dog")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^sentence 1 is a str, not a list of words"):
        p.parse(["dog"])  # type: ignore[list-item]
    with pytest.raises(SentenceError, match="^sentence 1: word 'a b' is empty or holds whitespace"):
        p.parse([["a b"]])
    with pytest.raises(TypeError, match="^decode must be a DecodeConfig"):
        p.parse([["dog"]], {"beam": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="constrained must be True, False or None"):
        p.parse([["dog"]], constrained="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^tree 1 is a str, not a Tree"):
        p.score([["dog"]], ["(S (NP dog))"])  # type: ignore[list-item]


@pytest.mark.parametrize("word", ["\u200b", "a▁b"])
def test_constrained_parsing_refuses_a_word_it_cannot_count(models, word) -> None:
    p = Parser.load(models["parser"])
    with pytest.raises(SentenceError, match=rf"^sentence 1: word {re.escape(repr(word))} is not"):
        p.parse([["dog", word]], constrained=True)
    assert len(p.parse([["dog", word]], constrained=False)) == 1  # unconstrained: repaired


# --- export -----------------------------------------------------------------------------------


def test_ctranslate2_refuses_a_model_that_reads_its_sources_reversed(models, tmp_path) -> None:
    pytest.importorskip("ctranslate2")
    from transduce.export.ctranslate2 import export_checkpoint, translate_with_ctranslate2

    with pytest.raises(UserError, match="reads its sources reversed"):
        export_checkpoint(models["reversed"], tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
    export_checkpoint(models["reversed"].parent / "plain.pt", tmp_path / "plain")
    with pytest.raises(TypeError, match="a list of sentences is wanted, not one str"):
        translate_with_ctranslate2(tmp_path / "plain", "1+2")  # type: ignore[arg-type]


def test_average_takes_a_task_stored_before_the_split_beside_a_new_one(models, tmp_path) -> None:
    """Configs stored before the task section was split hold reverse_input for every task; a
    run resumed across that version averaged its two kinds of checkpoint (review finding)."""
    from transduce import checkpoint

    old = checkpoint.load(models["shared"])
    old["config"]["task"]["reverse_input"] = False  # as those configs hold it
    checkpoint.save(old, tmp_path / "old.pt")
    assert "reverse_input" not in checkpoint.load(models["shared"])["config"]["task"]
    assert average([tmp_path / "old.pt", models["shared"]])["model"]

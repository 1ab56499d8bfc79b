"""Translator: raw text in, detokenized text out, in order, whatever the batching.

These tests need no corpus: an untrained tiny model with a SentencePiece vocabulary learned on
generated sentences gives deterministic (meaningless) translations, which is all that order,
batching and format checks need. Learning to translate is tested in tests/cli.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from inference_testkit import save_toy_translation_model, toy_sentences  # noqa: I001

from transduce.config import DecodeConfig
from transduce.errors import UserError
from transduce.inference.translator import (
    Translation,
    Translator,
    length_batches,
)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A checkpoint file holding an untrained tiny model and its vocabulary, alone in a folder
    (no vocab.model next to it: the checkpoint must be enough)."""
    return save_toy_translation_model(
        tmp_path_factory.mktemp("model") / "model.pt", {"max_len_offset": 4}
    )


@pytest.fixture(scope="module")
def translator(model_file) -> Translator:
    return Translator.load(model_file)


def test_import_from_package() -> None:
    from transduce import Translator as Exported

    assert Exported is Translator


def test_load_missing_file_is_user_error(tmp_path) -> None:
    with pytest.raises(UserError, match="not found"):
        Translator.load(tmp_path / "nope.pt")
    with pytest.raises(UserError, match="not found"):
        Translator.load(tmp_path)  # a folder without model.pt
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="bad.pt"):
        Translator.load(bad)


def test_load_run_folder_and_defaults(model_file, tmp_path) -> None:
    shutil.copy(model_file, tmp_path / "model.pt")
    t = Translator.load(tmp_path)
    assert not t.model.training
    assert (t.cfg.decode.beam, t.cfg.decode.alpha) == (4, 0.6)
    assert t.device == torch.device("cpu")


def test_empty_lines_order_and_one_output_per_line(translator) -> None:
    sentences = toy_sentences(12, seed=1)
    lines = sentences[:4] + ["", "   "] + sentences[4:] + [""]
    out = translator.translate(lines, translator.decode_config(beam=2))
    assert len(out) == len(lines)
    assert [o for line, o in zip(lines, out, strict=True) if not line.strip()] == ["", "", ""]
    alone = [translator.translate([s], translator.decode_config(beam=2))[0] for s in sentences]
    assert [o for line, o in zip(lines, out, strict=True) if line.strip()] == alone
    assert len(set(alone)) > 1  # different inputs, different outputs: order is really checked
    assert all("\n" not in o for o in out)


@pytest.mark.parametrize("beam", [1, 3])
def test_batching_does_not_change_translations(translator, beam) -> None:
    sentences = toy_sentences(25, seed=2)

    def translate(sentences: list[str], batch_tokens: int) -> list[str]:
        return translator.translate(
            sentences, translator.decode_config(beam=beam, batch_tokens=batch_tokens)
        )

    big = translate(sentences, 100_000)
    small = translate(sentences, 12)
    reversed_back = translate(sentences[::-1], 30)[::-1]
    assert big == small == reversed_back


def test_nbest(translator) -> None:
    sentences = ["the dog runs", "", "a big red ball in the park"]
    nbest = translator.translate_nbest(sentences, 3, translator.decode_config(beam=3))
    assert len(nbest) == 3
    assert nbest[1] == [Translation("", 0.0, 0.0)]
    for hyps in (nbest[0], nbest[2]):
        assert 1 <= len(hyps) <= 3
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert all(h.log_prob <= 0 for h in hyps)
    beam_3 = translator.decode_config(beam=3)
    assert [h[0].text for h in nbest] == translator.translate(sentences, beam_3)
    with pytest.raises(UserError, match="beam"):
        translator.translate_nbest(sentences, 4, translator.decode_config(beam=3))
    with pytest.raises(UserError, match="nbest"):
        translator.translate_nbest(sentences, 0)


def test_bad_options(translator) -> None:
    with pytest.raises(UserError, match="beam"):
        translator.decode_config(beam=0)
    with pytest.raises(UserError, match="alpha"):
        translator.decode_config(alpha=-1.0)
    with pytest.raises(UserError, match="batch_tokens"):
        translator.decode_config(batch_tokens=0)
    with pytest.raises(UserError, match=r"beam \(61\) must not exceed the vocabulary size \(60\)"):
        translator.decode_config(beam=61)
    with pytest.raises(UserError, match=r"beam \(61\) must not exceed the vocabulary size \(60\)"):
        translator.translate(["the dog"], DecodeConfig(beam=61))  # made without decode_config
    sampled = DecodeConfig(beam=61, sampling=True, sampling_seed=1)  # sampling has no beam
    assert translator.translate(["the dog"], sampled) == translator.translate(
        ["the dog"], DecodeConfig(sampling=True, sampling_seed=1)
    )
    for alpha in (float("nan"), float("inf"), 10.5):  # lp = ((5 + |Y|) / 6) ** alpha overflows
        with pytest.raises(UserError, match="alpha"):
            translator.decode_config(alpha=alpha)
    with pytest.raises(UserError, match="max_len_offset must be at most 10000"):
        translator.decode_config(max_len_offset=10_001)
    with pytest.raises(TypeError):
        translator.translate("the dog")  # type: ignore[arg-type]
    assert translator.translate([]) == []


def test_arguments_of_the_wrong_kind_are_refused_naming_them(translator) -> None:
    """What an audit found: one string where a list is wanted was read as a list of characters
    (score, align, prefixes), None in a list failed deep inside, and a few settings of the
    wrong type failed with Python's own messages."""
    bad = [
        (lambda: translator.score("ab", "cd"), TypeError, "a list of sources is wanted"),
        (lambda: translator.align("ab", "cd"), TypeError, "a list of sentences is wanted"),
        (
            lambda: translator.translate(["a", "b"], prefixes="ab"),  # type: ignore[arg-type]
            TypeError,
            "a list of prefixes is wanted",
        ),
        (lambda: translator.translate([b"the dog"]), TypeError, "sentence 1 is bytes"),
        (lambda: translator.translate(["a", None]), TypeError, "sentence 2 is NoneType"),
        (lambda: translator.score(["a"], [None]), TypeError, "target 1 is NoneType"),
        (lambda: translator.translate_nbest(["a"], 1.5), TypeError, "nbest must be an integer"),
        (lambda: translator.translate_nbest(["a"], True), TypeError, "nbest must be an integer"),
        (lambda: translator.translate(["a"], {"beam": 2}), TypeError, "a DecodeConfig"),
        (lambda: translator.decode_config(beam="3"), UserError, "decode.beam must be an integer"),
        (lambda: translator.align(["a", "b"], ["c"]), UserError, "2 sentences but 1 translations"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()


def test_a_prefix_the_target_vocabulary_cannot_write_is_refused(translator) -> None:
    # forced as <unk>, the output would not start with the text asked for
    with pytest.raises(UserError, match=r"prefix 2 \('ZZZ'\) holds what the model's target"):
        translator.translate(["the dog", "a cat"], prefixes=["", "ZZZ"])
    assert translator.translate(["the dog"], prefixes=["the"])[0].startswith("the")


def test_weights_name_a_dtype(model_file) -> None:
    assert next(Translator.load(model_file, weights="bf16").model.parameters()).dtype == (
        torch.bfloat16
    )
    with pytest.raises(UserError, match="weights must be one of fp32, bf16, fp16, int8; got 'fp8'"):
        Translator.load(model_file, weights="fp8")  # type: ignore[arg-type]


def test_learned_positions_refuse_a_source_they_cannot_place() -> None:
    # max_positions 16, max_len_offset 3: a source of 11 tokens (+ EOS) lets outputs reach
    # 12 + 3 = 15 tokens, whose decoder steps take positions 0-15 (BOS, then one per token, the
    # last forcing EOS); a 12-token source is a UserError naming it, not the model's ValueError
    # in the middle of a search.
    from transduce.config import from_dict
    from transduce.data.subword import train_sentencepiece
    from transduce.data.vocab import EOS
    from transduce.model.transformer import make_model

    vocab = train_sentencepiece(toy_sentences(300), 60)
    cfg = from_dict(
        {
            "model": {
                "n_layers": 1,
                "d_model": 32,
                "d_ff": 64,
                "n_heads": 2,
                "d_k": 16,
                "d_v": 16,
                "positional": "learned",
                "max_positions": 16,
            },
            "decode": {"max_len_offset": 3},
        }
    )
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=len(vocab)).eval()
    with torch.no_grad():  # EOS's logit 0 (tied output row): searches run to the longest output
        model.generator.weight[EOS] = 0.0
    translator = Translator(model, vocab, cfg)
    word = next(w for w in " ".join(toy_sentences(50)).split() if len(vocab.encode(w)) == 1)
    fits, too_long = " ".join([word] * 11), " ".join([word] * 12)
    assert [len(vocab.encode(s)) for s in (fits, too_long)] == [11, 12]
    from transduce.data.batching import collate
    from transduce.inference import greedy_search

    src = collate([(vocab.encode(fits), [])]).src
    assert len(greedy_search(model, src, max_len_offset=3)[0]) == 15  # the longest output
    for beam in (1, 2):
        decode = translator.decode_config(beam=beam)
        assert translator.translate([fits], decode)[0]  # position 15 was there
        with pytest.raises(UserError, match="sentence 2 has 12 subword tokens.*at most 11"):
            translator.translate(["", too_long, fits], decode)


def test_an_ensemble_takes_the_position_limit_of_its_tightest_member(tmp_path) -> None:
    # a sinusoidal model first and a learned-position one second: the second's table bounds
    # the search (the first's config alone let the member fail with a traceback)
    from transduce import checkpoint
    from transduce.config import from_dict
    from transduce.data.subword import train_sentencepiece
    from transduce.model.transformer import make_model

    vocab = train_sentencepiece(toy_sentences(300), 60)
    paths = []
    for positional in ("sinusoidal", "learned"):
        small = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8}
        model_cfg = {**small, "positional": positional, "max_positions": 16}
        cfg = from_dict({"model": model_cfg, "decode": {"max_len_offset": 3}})
        model = make_model(cfg.model, src_vocab_size=len(vocab)).eval()
        paths.append(tmp_path / f"{positional}.pt")
        state = {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()}
        checkpoint.save(state, paths[-1])
    word = next(w for w in " ".join(toy_sentences(50)).split() if len(vocab.encode(w)) == 1)
    ensemble = Translator.load_ensemble(paths)
    assert ensemble.max_positions == 16
    assert len(ensemble.translate([" ".join([word] * 11)])) == 1
    with pytest.raises(UserError, match="sentence 1 has 12 subword tokens.*at most 11"):
        ensemble.translate([" ".join([word] * 12)])
    assert Translator.load_ensemble(paths[:1] * 2).max_positions is None


def test_length_batches() -> None:
    lengths = [3, 9, 1, 4, 4, 12, 2, 7]
    batches = length_batches(lengths, 10)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 10
    firsts = [lengths[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)  # longest batch first
    assert batches[0] == [5]  # 12 tokens > budget: a batch of its own
    assert length_batches([], 10) == []


@pytest.mark.parametrize("architecture", ["transformer", "rnn"])
def test_a_sentence_past_the_cap_is_refused_where_positions_set_no_limit(
    tmp_path, monkeypatch, architecture
) -> None:
    """Sinusoidal positions and the rnn set no length limit: a whole text on one line (600,000
    tokens) ran for minutes without an end. Past MAX_SENTENCE_TOKENS a sentence is refused,
    naming it, before anything is decoded; translate, score and evaluate alike."""
    import transduce.inference.text_inputs as text_inputs

    monkeypatch.setattr(text_inputs, "MAX_SENTENCE_TOKENS", 12)  # a short cap, same code
    path = save_toy_translation_model(
        tmp_path / "model.pt", {"max_len_offset": 2}, {"architecture": architecture}
    )
    translator = Translator.load(path)
    assert translator.max_positions is None
    short = "der hund"
    long = " ".join(["der hund rennt"] * 6)
    assert len(translator.vocab.encode(long)) > 12 >= len(translator.vocab.encode(short))
    translator.translate([short])  # under the cap: decoded
    with pytest.raises(UserError, match=r"sentence 2 has \d+ subword tokens; at most 12"):
        translator.translate([short, long])
    with pytest.raises(UserError, match=r"sentence 1 has \d+ subword tokens; at most 12"):
        translator.score([long], [short])

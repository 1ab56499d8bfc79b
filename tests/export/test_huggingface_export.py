"""transduce models out to Hugging Face Marian (transduce.export.huggingface.export_marian):
models made here (random seeded weights, SentencePiece vocabularies trained on a synthetic
corpus), loaded by the real ``transformers`` offline; greedy ``generate`` against transduce's
greedy search, one sentence at a time with transduce's limit (source pieces + EOS +
max_len_offset, then EOS forced); export then import gives the same translations."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing from a hub
transformers = pytest.importorskip("transformers")

import torch
from inference_testkit import train_upper_casing
from marian_testkit import corpus

from transduce.architectures import build_model
from transduce.checkpoint import save
from transduce.config import Config, DecodeConfig, ModelConfig, TranslationTaskConfig
from transduce.data.subword import train_sentencepiece
from transduce.data.vocab import BOS, EOS, Vocab, VocabPair, vocab_sizes
from transduce.errors import UserError
from transduce.export.huggingface import export_marian, import_marian
from transduce.inference.beam import beam_search
from transduce.inference.engine import DecodingModel
from transduce.inference.greedy import greedy_search
from transduce.inference.translator import Translator

SOURCES, TARGETS = corpus(300, seed=0)
TEXTS = corpus(10, seed=3)[0]
OFFSET = 4
SMALL = {"n_layers": 2, "d_model": 32, "d_ff": 64, "n_heads": 4, "d_k": 8, "d_v": 8, "dropout": 0.0}


def _model_file(path: Path, vocab: Vocab, seed: int = 0, **model: Any) -> Path:
    """A model file of random seeded weights."""
    sizes = {"n_layers": 2, "d_model": 32} if model.get("architecture") == "rnn" else SMALL
    cfg = Config(
        model=ModelConfig(**{**sizes, "dropout": 0.0, **model}),
        task=TranslationTaskConfig(shared_vocab=not isinstance(vocab, VocabPair)),
        decode=DecodeConfig(beam=3, alpha=0.8, max_len_offset=7),
    )
    src, tgt = vocab_sizes(vocab)
    torch.manual_seed(seed)
    net = build_model(cfg.model, src_vocab_size=src, tgt_vocab_size=tgt)
    with torch.no_grad():
        for name, p in net.named_parameters():  # nonzero biases: wiring mistakes show
            if p.dim() == 1:  # small, or the last norm's bias would pick every output
                p.normal_(1.0 if "norms" in name and name.endswith("weight") else 0.0, 0.05)
    save({"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": net.state_dict()}, path)
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Vocab:
    return train_sentencepiece(SOURCES + TARGETS, 60)


def _greedy_equal(model_file: Path, folder: Path) -> None:
    translator = Translator.load(model_file)
    ours = translator.translate(TEXTS, translator.decode_config(beam=1, max_len_offset=OFFSET))
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    for k, text in enumerate(TEXTS):
        enc = tok([text], return_tensors="pt")
        assert enc["input_ids"][0].tolist() == translator.vocab.encode(text) + [2]
        limit = enc["input_ids"].size(1) + OFFSET  # pieces + EOS + offset
        out = hf.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=limit + 1)
        assert tok.decode(out[0], skip_special_tokens=True) == ours[k]


@pytest.mark.parametrize(
    "model", [{}, {"activation": "gelu", "tie_embeddings": False}], ids=["paper", "gelu-untied"]
)
def test_export_greedy_equals_generate(shared: Vocab, tmp_path: Path, model: dict) -> None:
    path = _model_file(tmp_path / "m.pt", shared, **model)
    summary = export_marian(path, tmp_path / "hf")
    assert not summary["separate_vocabs"]
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text("utf-8"))
    assert (generation["num_beams"], generation["length_penalty"]) == (3, 0.8)
    assert generation["bad_words_ids"] == [[0], [1]]  # PAD and BOS never generated
    _greedy_equal(path, tmp_path / "hf")


def test_export_separate_vocabularies(tmp_path: Path) -> None:
    pair = VocabPair(train_sentencepiece(SOURCES, 40), train_sentencepiece(TARGETS, 50))
    path = _model_file(tmp_path / "pair.pt", pair)
    summary = export_marian(path, tmp_path / "hf")
    assert summary["separate_vocabs"] and (tmp_path / "hf" / "target_vocab.json").is_file()
    _greedy_equal(path, tmp_path / "hf")


@pytest.mark.parametrize(
    ("pair", "tie"),
    [(False, True), (False, False), (True, True), (True, False)],
    ids=["shared-tied", "shared-untied", "pair-tied", "pair-untied"],
)
def test_round_trip_gives_the_same_translations(
    shared: Vocab, tmp_path: Path, pair: bool, tie: bool
) -> None:
    # every kind of embedding sharing comes back (a pair's source vocab.json holds <s> too),
    # with the model's beam and alpha as its decoding defaults
    vocab = VocabPair(shared, train_sentencepiece(TARGETS, 50)) if pair else shared
    path = _model_file(tmp_path / "m.pt", vocab, activation="swish", tie_embeddings=tie)
    export_marian(path, tmp_path / "hf")
    summary = import_marian(tmp_path / "hf", tmp_path / "back.pt")
    assert not summary["added_bos"]  # the export starts from <s>: ids unchanged
    assert (summary["beam"], summary["alpha"]) == (3, 0.8)
    before, after = Translator.load(path), Translator.load(tmp_path / "back.pt")
    assert after.cfg.decode == before.cfg.decode
    # one vocabulary comes back as one (untied too), so the CTranslate2 export still takes it
    assert summary["shared_vocab"] == after.cfg.task.shared_vocab == (not pair)
    assert isinstance(after.vocab, VocabPair) == pair
    for beam in (1, 4):
        assert after.translate(TEXTS, after.decode_config(beam=beam)) == before.translate(
            TEXTS, before.decode_config(beam=beam)
        )


def test_tokens_in_their_object_form_import(tmp_path: Path) -> None:
    # older transformers wrote {"__type": "AddedToken", "content": ...} for the special tokens
    pair = VocabPair(train_sentencepiece(SOURCES, 40), train_sentencepiece(TARGETS, 50))
    export_marian(_model_file(tmp_path / "pair.pt", pair), tmp_path / "hf")
    config = tmp_path / "hf" / "tokenizer_config.json"
    tok = json.loads(config.read_text(encoding="utf-8"))
    for key in ("unk_token", "eos_token", "pad_token"):
        tok[key] = {"__type": "AddedToken", "content": tok[key], "normalized": True}
    config.write_text(json.dumps(tok), encoding="utf-8")
    import_marian(tmp_path / "hf", tmp_path / "back.pt")
    before, after = Translator.load(tmp_path / "pair.pt"), Translator.load(tmp_path / "back.pt")
    assert after.translate(TEXTS) == before.translate(TEXTS)


def test_export_refuses_what_marian_cannot_represent(shared: Vocab, tmp_path: Path) -> None:
    for field, model in (
        ("model.norm", {"norm": "pre"}),
        ("model.positional", {"positional": "learned"}),
        ("model.architecture", {"architecture": "rnn"}),
        ("model.d_k", {"d_k": 5, "d_v": 5}),
    ):
        path = _model_file(tmp_path / "x.pt", shared, **model)
        with pytest.raises(UserError, match=field) as e:
            export_marian(path, tmp_path / "out")
        assert "\n" not in str(e.value)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(UserError, match="already exists"):
        export_marian(_model_file(tmp_path / "ok.pt", shared), tmp_path / "run")
    with pytest.raises(UserError, match="holds no Marian model"):
        export_marian(tmp_path / "ok.pt", tmp_path / "run", force=True)
    assert (tmp_path / "run" / "notes.txt").is_file()
    # a Marian folder of another tool (a downloaded OPUS-MT model) is not replaced; an export is
    export_marian(tmp_path / "ok.pt", tmp_path / "hf")
    export_marian(tmp_path / "ok.pt", tmp_path / "hf", force=True)
    (tmp_path / "hf" / "generation_config.json").write_text('{"num_beams": 4}', encoding="utf-8")
    with pytest.raises(UserError, match="Marian model that transduce did not export"):
        export_marian(tmp_path / "ok.pt", tmp_path / "hf", force=True)
    assert (tmp_path / "hf" / "config.json").is_file()
    # nor the model being exported, nor other files kept in an export's folder
    export_marian(tmp_path / "ok.pt", tmp_path / "ex")
    shutil.copyfile(tmp_path / "ok.pt", tmp_path / "ex" / "ok.pt")
    with pytest.raises(UserError, match="lies in the output folder"):
        export_marian(tmp_path / "ex" / "ok.pt", tmp_path / "ex", force=True)
    with pytest.raises(UserError, match="holds 'ok.pt', which no export writes"):
        export_marian(tmp_path / "ok.pt", tmp_path / "ex", force=True)
    assert (tmp_path / "ex" / "ok.pt").is_file()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained here to upper-case the words (about 10 s on one CPU thread), with
    Marian's swish activation."""
    root = tmp_path_factory.mktemp("trained")
    return train_upper_casing(root, corpus(400, seed=0)[0], {"activation": "swish"})


def _log_prob_ours(model: Any, src: list[int], out: list[int]) -> float:
    """log P(out + EOS | src) under a transduce model (teacher forcing)."""
    with torch.no_grad():
        lp = model(torch.tensor([src]), torch.tensor([[BOS, *out]])).log_softmax(-1)[0]
    return float(sum(lp[t, tok] for t, tok in enumerate([*out, EOS])))


def _log_prob_hf(hf: Any, src: list[int], out: list[int]) -> float:
    """The same under a Marian model with transduce's ids (an export)."""
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([[BOS, *out]]))
    lp = logits.logits.log_softmax(-1)[0]
    return float(sum(lp[t, tok] for t, tok in enumerate([*out, EOS])))


def _until_eos(row: list[int]) -> list[int]:
    """A generated row without its start token, EOS and padding."""
    out = row[1:]
    return out[: out.index(EOS)] if EOS in out else out


def test_trained_model_translates_the_same_in_generate(trained: Path, tmp_path: Path) -> None:
    """A padded batch through ``generate``: every line as ``Translator`` greedy gives it (a line
    that transduce's limit ended, source pieces + EOS + 20, generated alone with that limit).
    Beam 4 without length penalty on both sides: at least 90% of the lines alike, and each
    other one a choice of the search (the two beams differ, see test_huggingface.py), not of
    the model: both models give both outputs the same log-probability."""
    export_marian(trained, tmp_path / "hf")
    hf = transformers.MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    translator = Translator.load(trained)
    texts = corpus(40, seed=11)[0]
    batch = tok(texts, return_tensors="pt", padding=True)
    ours = translator.translate(
        texts, translator.decode_config(beam=1)
    )  # max_len_offset 20, the model's
    # it learned: 11 or more of 40 right on AVX-512 CPUs, 9 on an AVX2 one (other rounding)
    assert sum(o == t.upper() for o, t in zip(ours, texts, strict=True)) >= 8
    sources = [translator.vocab.encode(t) + [EOS] for t in texts]
    model = translator.model
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(x) for x in sources], batch_first=True)
    ids = greedy_search(DecodingModel(model), src, max_len_offset=20)
    rows = hf.generate(**batch, num_beams=1, max_new_tokens=200).tolist()
    for k, row in enumerate(rows):
        limit = len(sources[k]) + 20
        if len(ids[k]) == limit:  # ended by transduce's limit: generate with the same alone
            enc = tok([texts[k]], return_tensors="pt")
            row = hf.generate(**enc, num_beams=1, max_new_tokens=limit + 1)[0].tolist()
        assert _until_eos(row) == ids[k]
        assert tok.decode(row, skip_special_tokens=True) == ours[k]
    rows = hf.generate(**batch, num_beams=4, length_penalty=0.0, max_new_tokens=200).tolist()
    theirs = [_until_eos(row) for row in rows]
    hyps = beam_search(DecodingModel(model), src, beam=4, alpha=0.0, max_len_offset=20)
    alike = 0
    for k, (mine, other) in enumerate(zip((h[0].tokens for h in hyps), theirs, strict=True)):
        alike += mine == other
        for out in (mine, other):
            assert (
                abs(_log_prob_ours(model, sources[k], out) - _log_prob_hf(hf, sources[k], out))
                < 1e-4
            )
    assert alike >= 0.9 * len(texts)

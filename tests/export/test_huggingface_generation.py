"""What a Marian folder's generation_config.json says, in and out
(transduce.export.marian_config.decode_config, generation_config): the settings ``generate``
uses are the import's (the start token, sampling with Hugging Face's defaults), those transduce
has no counterpart for are refused in one line, a sampling model exports as one, and an export's
position table is not the model's ``max_positions`` when that is short (transduce's grows)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing from a hub
transformers = pytest.importorskip("transformers")

import torch
from marian_testkit import corpus, marian_folder

from transduce.checkpoint import load_model, save
from transduce.config import Config, DecodeConfig, ModelConfig, TranslationTaskConfig
from transduce.data.subword import train_sentencepiece
from transduce.data.vocab import vocab_sizes
from transduce.errors import UserError
from transduce.export.huggingface import export_marian, import_marian
from transduce.inference.translator import Translator
from transduce.model.transformer import make_model

TEXTS = corpus(8, seed=7)[0]


def _with_generation(folder: Path, **values: Any) -> dict[str, Any]:
    """generation_config.json of ``folder`` with ``values`` written over it (None: removed)."""
    path = folder / "generation_config.json"
    generation = json.loads(path.read_text(encoding="utf-8"))
    for key, value in values.items():
        if value is None:
            generation.pop(key, None)
        else:
            generation[key] = value
    path.write_text(json.dumps(generation), encoding="utf-8")
    return generation


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return marian_folder(tmp_path_factory.mktemp("gen") / "opus")


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("no_repeat_ngram_size", 3),
        ("repetition_penalty", 1.2),
        ("min_length", 5),
        ("forced_bos_token_id", 4),
        ("num_beam_groups", 2),
        ("bad_words_ids", [[3]]),
        ("eos_token_id", 5),
    ],
)
def test_settings_transduce_has_none_of_are_refused_naming_them(
    folder: Path, tmp_path: Path, key: str, value: Any
) -> None:
    damaged = _copy(folder, tmp_path / "f")
    _with_generation(damaged, **{key: value})
    with pytest.raises(UserError, match=rf"generation_config.json: {key}") as e:
        import_marian(damaged, tmp_path / "x.pt")
    assert "\n" not in str(e.value) and not (tmp_path / "x.pt").exists()


def test_opus_mt_settings_that_change_nothing_import(folder: Path, tmp_path: Path) -> None:
    # what OPUS-MT folders carry: the padding banned, renormalised logits, a long max_length
    copy = _copy(folder, tmp_path / "f")
    vocab = json.loads((copy / "vocab.json").read_text(encoding="utf-8"))
    pad = vocab["<pad>"]
    _with_generation(
        copy, bad_words_ids=[[pad]], renormalize_logits=True, max_length=512, eos_token_id=[0]
    )
    assert import_marian(copy, tmp_path / "x.pt")["beam"] == 4


def _generate_equal(folder: Path, model_file: Path, *, sample: bool) -> None:
    """transduce's translations (greedy, or its sampling) equal generate's one by one."""
    translator = Translator.load(model_file)
    cfg = translator.decode_config(max_len_offset=5)
    ours = translator.translate(TEXTS, cfg if sample else translator.decode_config(beam=1))
    hf = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    for k, text in enumerate(TEXTS):
        enc = tok([text], return_tensors="pt")
        limit = enc["input_ids"].size(1) + (5 if sample else translator.cfg.decode.max_len_offset)
        out = hf.generate(**enc, max_new_tokens=limit + 1)  # generation_config.json's settings
        assert tok.decode(out[0], skip_special_tokens=True) == ours[k], k


def test_sampling_is_imported_with_hugging_faces_defaults(folder: Path, tmp_path: Path) -> None:
    copy = _copy(folder, tmp_path / "f")
    _with_generation(copy, do_sample=True, num_beams=1, temperature=0.7, top_p=0.9)
    import_marian(copy, tmp_path / "x.pt")
    d = load_model(tmp_path / "x.pt")[2].decode
    assert (d.sampling, d.temperature, d.top_k, d.top_p) == (True, 0.7, 50, 0.9)  # top_k unset
    # top_k 1: sampling is the argmax, on both sides: generate's output, which greedy is
    _with_generation(copy, top_k=1)
    import_marian(copy, tmp_path / "k1.pt")
    assert load_model(tmp_path / "k1.pt")[2].decode.top_k == 1
    _generate_equal(copy, tmp_path / "k1.pt", sample=True)
    _with_generation(copy, num_beams=4)  # Hugging Face's beam sampling: none here
    with pytest.raises(UserError, match="do_sample with num_beams 4"):
        import_marian(copy, tmp_path / "b.pt")


def test_the_start_token_is_generation_configs_as_generate_takes_it(
    folder: Path, tmp_path: Path
) -> None:
    copy = _copy(folder, tmp_path / "f")
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    del config["decoder_start_token_id"]  # config.json's would be the padding
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    _with_generation(copy, decoder_start_token_id=0, num_beams=1)  # BART's way: from </s>
    import_marian(copy, tmp_path / "x.pt")
    _generate_equal(copy, tmp_path / "x.pt", sample=False)


def _transduce_model(path: Path, decode: DecodeConfig, max_positions: int = 1024) -> Path:
    sources, targets = corpus(300, seed=0)
    vocab = train_sentencepiece(sources + targets, 60)
    model_cfg = ModelConfig(
        n_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        d_k=8,
        d_v=8,
        dropout=0.0,
        max_positions=max_positions,
    )
    cfg = Config(model=model_cfg, task=TranslationTaskConfig(), decode=decode)
    torch.manual_seed(0)
    src, tgt = vocab_sizes(vocab)
    net = make_model(cfg.model, src_vocab_size=src, tgt_vocab_size=tgt)
    save({"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": net.state_dict()}, path)
    return path


def test_a_sampling_model_exports_sampling_and_comes_back(tmp_path: Path) -> None:
    decode = DecodeConfig(sampling=True, temperature=0.8, top_k=7, top_p=0.95, sampling_seed=3)
    model = _transduce_model(tmp_path / "m.pt", decode)
    summary = export_marian(model, tmp_path / "hf")
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text("utf-8"))
    assert generation["do_sample"] is True and generation["num_beams"] == 1
    assert (summary["num_beams"], summary["do_sample"]) == (1, True)  # what the file says
    assert (generation["temperature"], generation["top_k"], generation["top_p"]) == (0.8, 7, 0.95)
    assert "length_penalty" not in generation
    import_marian(tmp_path / "hf", tmp_path / "back.pt")
    d = load_model(tmp_path / "back.pt")[2].decode
    assert (d.sampling, d.temperature, d.top_k, d.top_p, d.sampling_seed) == (
        True,
        0.8,
        7,
        0.95,
        3,
    )
    # the same samples from the same seed, through either file
    first, back = Translator.load(model), Translator.load(tmp_path / "back.pt")
    assert back.translate(TEXTS) == first.translate(TEXTS)


def test_a_short_max_positions_exports_a_table_of_1024(tmp_path: Path) -> None:
    # transduce's sinusoids grow with the input: the export's table must not stop at 64
    model = _transduce_model(tmp_path / "m.pt", DecodeConfig(beam=1), max_positions=64)
    export_marian(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text("utf-8"))
    assert config["max_position_embeddings"] == 1024
    hf = transformers.MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    net, _, _ = load_model(model)
    src = torch.randint(4, 20, (1, 100))
    tgt = torch.randint(4, 20, (1, 90))
    with torch.no_grad():
        theirs = hf(input_ids=src, decoder_input_ids=tgt).logits
        ours = net(src, tgt)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_beam_is_one_where_generation_config_leaves_it_out(
    folder: Path, tmp_path: Path
) -> None:
    # transformers saves only what differs from its defaults: a greedy or sampling folder has no
    # num_beams, and generate then takes 1, not config.json's
    copy = _copy(folder, tmp_path / "f")
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    (copy / "config.json").write_text(json.dumps({**config, "num_beams": 6}), encoding="utf-8")
    _with_generation(copy, num_beams=None)
    assert import_marian(copy, tmp_path / "greedy.pt")["beam"] == 1
    _with_generation(copy, do_sample=True, top_k=1)
    import_marian(copy, tmp_path / "sample.pt")
    assert load_model(tmp_path / "sample.pt")[2].decode.sampling
    (copy / "generation_config.json").unlink()  # no file: config.json's, as before
    assert import_marian(copy, tmp_path / "six.pt")["beam"] == 6


def _without_generation_file(folder: Path, to: Path, **config: Any) -> Path:
    """A copy of ``folder`` with no generation_config.json, ``config`` written into config.json
    (None: removed), as older OPUS-MT folders keep their generation settings."""
    copy = _copy(folder, to)
    (copy / "generation_config.json").unlink()
    path = copy / "config.json"
    c = json.loads(path.read_text(encoding="utf-8"))
    for key, value in config.items():
        c.pop(key, None) if value is None else c.__setitem__(key, value)
    path.write_text(json.dumps(c), encoding="utf-8")
    return copy


def test_without_generation_config_the_settings_are_config_json_s(
    folder: Path, tmp_path: Path
) -> None:
    """generate takes config.json's generation settings where the file is missing: so does the
    import (the beam 1 where config.json has none, sampling, refusals naming config.json)."""
    plain = _without_generation_file(folder, tmp_path / "plain", num_beams=None)
    hf = transformers.MarianMTModel.from_pretrained(str(plain))
    beams = hf.generation_config.num_beams or 1  # None: generate's default, 1
    assert import_marian(plain, tmp_path / "plain.pt")["beam"] == beams == 1
    sample = _without_generation_file(folder, tmp_path / "sample", do_sample=True, top_k=5)
    import_marian(sample, tmp_path / "sample.pt")
    decode = load_model(tmp_path / "sample.pt")[2].decode
    assert (decode.sampling, decode.top_k, decode.beam) == (True, 5, 1)
    for key, value in (("no_repeat_ngram_size", 2), ("bad_words_ids", 5), ("max_new_tokens", 9)):
        damaged = _without_generation_file(folder, tmp_path / key, **{key: value})
        with pytest.raises(UserError, match=rf"config.json: {key}") as e:
            import_marian(damaged, tmp_path / "x.pt")
        assert "\n" not in str(e.value) and not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("banned", [5, [[[75]]], [["a"]], [[True]]])
def test_malformed_bad_words_ids_are_one_line(folder: Path, tmp_path: Path, banned: Any) -> None:
    damaged = _copy(folder, tmp_path / "f")
    _with_generation(damaged, bad_words_ids=banned)
    with pytest.raises(UserError, match=r"generation_config.json: bad_words_ids .*token ids"):
        import_marian(damaged, tmp_path / "x.pt")

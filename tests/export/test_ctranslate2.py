"""Export to CTranslate2 (transduce.export.ctranslate2, ``transduce export ctranslate2``).

Two kinds of evidence that the exported model is our model:

* per-token log-probabilities: CTranslate2's ``score_batch`` on random tiny models of every
  supported shape (post-/pre-norm, sinusoidal/learned positions, d_k != d_model / h, untied
  embeddings) equals our teacher-forced ``log_softmax``;
* translations: a tiny model trained here (toy corpus: the source words upper-cased) translates
  the same under CTranslate2 greedy search as under ``Translator`` greedy search.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from inference_testkit import train_upper_casing, upper_casing_pairs  # noqa: E402

from transduce.cli.main import main  # noqa: E402
from transduce.config import from_dict  # noqa: E402
from transduce.data.vocab import BOS, EOS, SPECIALS  # noqa: E402
from transduce.errors import UserError  # noqa: E402
from transduce.export.ctranslate2 import (  # noqa: E402
    build_spec,
    export_checkpoint,
    export_model,
    translate_with_ctranslate2,
)
from transduce.inference.translator import Translator  # noqa: E402
from transduce.model.transformer import make_model  # noqa: E402

corpus = upper_casing_pairs


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run folder whose model.pt has learned to upper-case (about 10 s on one CPU thread)."""
    return train_upper_casing(tmp_path_factory.mktemp("ct2"), corpus(400, seed=0)[0])


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "ct2"
    assert (
        main(
            [
                "--no-malloc-tuning",
                "export",
                "ctranslate2",
                "--model",
                str(trained),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_folder_contents(exported, trained, capsys) -> None:
    names = {p.name for p in exported.iterdir()}
    assert {
        "model.bin",
        "config.json",
        "shared_vocabulary.json",
        "sentencepiece.model",
        "transduce.json",
    } <= names
    vocab = json.loads((exported / "shared_vocabulary.json").read_text())
    assert vocab[:4] == list(SPECIALS) and len(vocab) == 60
    config = json.loads((exported / "config.json").read_text())
    assert config["add_source_eos"] is True and config["add_source_bos"] is False
    assert config["decoder_start_token"] == "<s>" and config["eos_token"] == "</s>"
    assert config["layer_norm_epsilon"] == pytest.approx(1e-5)
    info = json.loads((exported / "transduce.json").read_text())
    assert info["source_checkpoint"] == str(trained) and info["decode"]["max_len_offset"] == 20


def test_greedy_translations_equal_ours(exported, trained) -> None:
    translator = Translator.load(trained)
    sentences = corpus(40, seed=7)[0] + ["", "the small dog runs in the park", "ball ball"]
    ours = translator.translate(sentences, translator.decode_config(beam=1))
    theirs = translate_with_ctranslate2(exported, sentences, beam_size=1, intra_threads=1)
    assert theirs == ours
    # it has really learned something, so equal outputs are not equal garbage
    src, tgt = corpus(40, seed=7)
    assert sum(o == t for o, t in zip(ours, tgt, strict=False)) >= 10


def test_beam_search_runs(exported, trained) -> None:
    sentences = corpus(5, seed=3)[0]
    out = translate_with_ctranslate2(exported, sentences, beam_size=4, intra_threads=1)
    assert len(out) == 5 and all(isinstance(o, str) and o for o in out)


@pytest.mark.parametrize("intra_threads", [0, 2])
def test_torchs_thread_count_is_left_as_it_was(exported, intra_threads) -> None:
    """CTranslate2 sets OpenMP's thread count for the calling thread, which is torch's too: a
    later torch product would run on its threads (and round differently from the same product
    elsewhere in the process)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        translate_with_ctranslate2(exported, corpus(3, seed=5)[0], intra_threads=intra_threads)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_int8_export(trained, tmp_path) -> None:
    info = export_checkpoint(trained, tmp_path / "int8", quantization="int8")
    assert info["quantization"] == "int8" and "model.bin" in info["files"]
    sentences = corpus(20, seed=9)[0]
    out = translate_with_ctranslate2(tmp_path / "int8", sentences, beam_size=1, intra_threads=1)
    translator = Translator.load(trained)
    ours = translator.translate(sentences, translator.decode_config(beam=1))
    assert sum(o == t for o, t in zip(out, ours, strict=True)) >= 10  # int8: mostly the same


def test_existing_output_needs_force(exported, trained, capsys) -> None:
    argv = [
        "--no-malloc-tuning",
        "export",
        "ctranslate2",
        "--model",
        str(trained),
        "--output",
        str(exported),
    ]
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["output"] == str(exported)
    assert (
        main(
            [
                "--no-malloc-tuning",
                "export",
                "ctranslate2",
                "--model",
                str(exported / "nope.pt"),
                "--output",
                str(exported / "x"),
            ]
        )
        == 2
    )
    # --force replaces a previous export, never a folder of anything else (".", a run folder)
    other = exported.parent / "not_an_export"
    other.mkdir(exist_ok=True)
    (other / "keep.txt").write_text("mine")
    assert main([*argv[:-1], str(other), "--force"]) == 2
    assert "holds no CTranslate2 model" in capsys.readouterr().err
    assert (other / "keep.txt").read_text() == "mine"


def test_force_replaces_an_export_holding_nothing_else(exported, trained, tmp_path, capsys) -> None:
    """--force never deletes the model being exported, other files, or another tool's model."""
    out = tmp_path / "ct2"
    shutil.copytree(exported, out)
    model = out / "mine.pt"
    shutil.copyfile(trained, model)
    base = ["--no-malloc-tuning", "export", "ctranslate2", "--output", str(out), "--force"]
    assert main([*base, "--model", str(model)]) == 2
    assert "lies in the output folder" in capsys.readouterr().err and model.is_file()
    assert main([*base, "--model", str(trained)]) == 2
    assert "holds 'mine.pt', which no export writes" in capsys.readouterr().err
    assert model.is_file()
    model.unlink()
    (out / "transduce.json").unlink()  # as CTranslate2's own converters write it
    assert main([*base, "--model", str(trained)]) == 2
    assert "that transduce did not export" in capsys.readouterr().err
    assert (out / "model.bin").is_file()
    shutil.copyfile(exported / "transduce.json", out / "transduce.json")
    assert main([*base, "--model", str(trained)]) == 0


TOKENS = [*SPECIALS, *(f"w{i}" for i in range(46))]  # 50


def random_model(n_tokens: int = len(TOKENS), **model_overrides):
    cfg = from_dict(
        {
            "model": {
                "n_layers": 2,
                "d_model": 32,
                "d_ff": 64,
                "n_heads": 2,
                "d_k": 16,
                "d_v": 16,
                "dropout": 0.0,
                **model_overrides,
            }
        }
    )
    torch.manual_seed(0)
    model = make_model(cfg.model, src_vocab_size=n_tokens).eval()
    with torch.no_grad():  # non-trivial layer norms, so that a mixed-up norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm": "pre"},
        {"positional": "learned"},
        {"d_k": 8, "d_v": 8},
        {"tie_embeddings": False},
    ],
    ids=["post-norm", "pre-norm", "learned-positions", "head-dim", "untied"],
)
def test_log_probs_equal_ours(overrides, tmp_path) -> None:
    model = random_model(**overrides)
    export_model(model, TOKENS, tmp_path / "m")
    scorer = ctranslate2.Translator(str(tmp_path / "m"), intra_threads=1)
    rng = random.Random(1)
    for length_s, length_t in [(7, 9), (1, 1), (30, 25)]:
        s = [rng.randrange(4, len(TOKENS)) for _ in range(length_s)]
        t = [rng.randrange(4, len(TOKENS)) for _ in range(length_t)]
        with torch.no_grad():
            logits = model(torch.tensor([[*s, EOS]]), torch.tensor([[BOS, *t]]))[0]
        ours = logits.log_softmax(-1)[torch.arange(length_t + 1), torch.tensor([*t, EOS])]
        res = scorer.score_batch([[TOKENS[i] for i in s]], [[TOKENS[i] for i in t]])[0]
        np.testing.assert_allclose(res.log_probs, ours.numpy(), atol=1e-4)


def test_unsupported_shapes_are_user_errors() -> None:
    with pytest.raises(UserError, match="d_k = d_v"):
        build_spec(random_model(d_k=16, d_v=8), TOKENS)
    with pytest.raises(UserError, match="token 1"):
        build_spec(random_model(), ["<pad>", "<bos>", *TOKENS[2:]])
    with pytest.raises(UserError, match="50"):
        build_spec(random_model(), TOKENS[:-1])
    with pytest.raises(UserError, match="twice"):
        build_spec(random_model(), [*TOKENS[:-1], "w0"])
    with pytest.raises(UserError, match="counts them in words"):
        cfg = dataclasses.replace(random_model().config, position_unit="word")
        build_spec(make_model(cfg, src_vocab_size=len(TOKENS)), TOKENS)


@pytest.mark.parametrize("eos_boost", [0.0, 60.0])
def test_a_characters_model_translates_as_ours_even_when_eos_comes_first(
    tmp_path: Path, eos_boost: float
) -> None:
    # a synthetic task's model (one token per character, no SentencePiece model in the folder)
    # through translate_with_ctranslate2, against our greedy search; with </s> boosted to the
    # most probable first token both give "" (CTranslate2's min_decoding_length 1 would not)
    from transduce.inference.greedy import greedy_search

    symbols = "0123456789+"
    tokens = [*SPECIALS, *symbols]
    model = random_model(len(tokens), output_bias=True)
    with torch.no_grad():
        model.generator.bias.copy_(torch.randn(len(tokens)))
        model.generator.bias[EOS] += eos_boost
    export_model(model, tokens, tmp_path / "m")
    info = json.loads((tmp_path / "m" / "transduce.json").read_text())
    assert info["tokenizer"] == "characters"
    sentences = ["12+34", "7", "999+1", ""]
    theirs = translate_with_ctranslate2(
        tmp_path / "m", sentences, beam_size=1, intra_threads=1, max_len_offset=4
    )
    index = {s: i for i, s in enumerate(tokens)}
    ours = [""]
    for s in sentences[:-1]:
        src = torch.tensor([[index[c] for c in s] + [EOS]])
        with torch.no_grad():
            out = greedy_search(model, src, max_len_offset=4)[0]
        ours.insert(-1, "".join(tokens[i] for i in out))
    assert theirs == ours
    if eos_boost:
        assert theirs == ["", "", "", ""]
    else:
        assert any(theirs)  # not all empty: the comparison means something


def test_a_folder_without_tokenizer_or_record_is_refused(tmp_path: Path) -> None:
    export_model(random_model(), TOKENS, tmp_path / "m")
    (tmp_path / "m" / "transduce.json").unlink()
    with pytest.raises(UserError, match="no sentencepiece.model and no transduce.json"):
        translate_with_ctranslate2(tmp_path / "m", ["w4 w5"])


@pytest.mark.parametrize(("max_positions", "rows"), [(2048, 2048), (64, 1024)])
def test_the_position_table_is_the_models_and_at_least_1024(
    tmp_path: Path, max_positions: int, rows: int
) -> None:
    # ours grows with the input: the export's table is the model's max_positions, at least 1024,
    # so that a 1,200-token source scores as ours (CTranslate2 would cut it to 1,024 in silence)
    model = random_model(max_positions=max_positions)
    info = export_model(model, TOKENS, tmp_path / "m")
    assert info["max_positions"] == rows
    if rows < 1200:
        return
    scorer = ctranslate2.Translator(str(tmp_path / "m"), intra_threads=1)
    s = [4 + i % 46 for i in range(1200)]
    with torch.no_grad():
        logits = model(torch.tensor([[*s, EOS]]), torch.tensor([[BOS, 7, 8]]))[0]
    ours = logits.log_softmax(-1)[torch.arange(3), torch.tensor([7, 8, EOS])]
    res = scorer.score_batch(
        [[TOKENS[i] for i in s]], [[TOKENS[7], TOKENS[8]]], max_input_length=0
    )[0]
    np.testing.assert_allclose(res.log_probs, ours.numpy(), atol=1e-4)


def test_a_source_longer_than_the_table_is_refused_not_cut(trained, tmp_path: Path) -> None:
    export_checkpoint(trained, tmp_path / "short", max_positions=12)
    sentence = " ".join(["the dog runs"] * 6)
    with pytest.raises(UserError, match=r"sentence 2 has \d+ pieces .* position table holds 12"):
        translate_with_ctranslate2(tmp_path / "short", ["a dog", sentence])


def test_the_folder_s_decoding_is_the_default(exported, trained, tmp_path: Path) -> None:
    """transduce.json keeps the checkpoint's decoding, sampling settings included, and
    translate_with_ctranslate2 decodes with them unless the call names its own."""
    from transduce.checkpoint import load, save

    sentences = corpus(20, seed=11)[0]
    beam = json.loads((exported / "transduce.json").read_text())["decode"]["beam"]
    assert beam > 1
    by_default = translate_with_ctranslate2(exported, sentences, intra_threads=1)
    assert by_default == translate_with_ctranslate2(
        exported, sentences, beam_size=beam, intra_threads=1
    )
    raw = load(trained)
    sampling = {"sampling": True, "beam": 1, "temperature": 3.0, "top_k": 0, "top_p": 0.95}
    raw["config"]["decode"] = {**raw["config"]["decode"], **sampling, "sampling_seed": 7}
    save(raw, tmp_path / "sample.pt")
    export_checkpoint(tmp_path / "sample.pt", tmp_path / "s")
    decode = json.loads((tmp_path / "s" / "transduce.json").read_text())["decode"]
    assert decode == {**decode, **sampling, "sampling_seed": 7}
    drawn = translate_with_ctranslate2(tmp_path / "s", sentences, intra_threads=1)
    assert drawn == translate_with_ctranslate2(tmp_path / "s", sentences, intra_threads=1)
    greedy = translate_with_ctranslate2(tmp_path / "s", sentences, beam_size=1, intra_threads=1)
    assert drawn != greedy  # sampled, at temperature 3

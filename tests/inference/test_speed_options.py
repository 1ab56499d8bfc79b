"""Speed options change how fast a model decodes, not what it outputs: greedy translations of a
trained tiny model are identical with and without each of them (bfloat16 weights: all but near
ties)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from inference_testkit import naive_greedy

from transduce import checkpoint
from transduce.config import Config, update
from transduce.data.synthetic import make_task
from transduce.data.vocab import PAD
from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.kernels import KernelOptions
from transduce.kernels.matmul import onednn_available
from transduce.model import make_model
from transduce.training.run import train_synthetic


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - (model, sources)
    """A model trained to copy strings of 1-5 symbols (at least 95% exact on held-out ones;
    the recipe of tests/training/test_trainer.py, ~6 s on an idle core), and its held-out
    sources as a right-padded batch."""
    cfg = update(
        Config(),
        {
            "n_layers": 1,
            "d_model": 64,
            "d_ff": 64,
            "n_heads": 4,
            "d_k": 16,
            "d_v": 16,
            "dropout": 0.0,
            "label_smoothing": 0.0,
            "warmup": 100,
            "clip_norm": 1.0,
            "max_tokens": 512,
            "max_steps": 1000,
            "eval_every": 25,
            "save_every": 1000,
            "log_every": 100,
            "target_seq_accuracy": 0.95,
            "tensorboard": False,
            "name": "copy",
            "train_size": 2000,
            "valid_size": 100,
            "max_length": 5,
            "n_symbols": 8,
            "beam": 1,
        },
    )
    run = tmp_path_factory.mktemp("reverse")
    summary = train_synthetic(cfg, run, show_progress=False)
    assert summary["seq_accuracy"] >= 0.95, summary
    model, vocab, _ = checkpoint.load_model(Path(run) / "model.pt")
    ids = [vocab.encode(s) for s, _ in make_task(cfg.task).valid]
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD, dtype=torch.long)
    for i, x in enumerate(ids):
        src[i, : len(x) + 1] = torch.tensor([*x, 2])  # + EOS, as collate does
    return model, src


def test_trained_outputs_are_not_trivial(trained) -> None:
    model, src = trained
    outs = greedy_search(model, src, max_len_offset=5)
    assert len({tuple(o) for o in outs}) > 50  # the model really maps inputs to outputs


def test_formula_attention_equals_fused_kernel(trained) -> None:
    model, src = trained
    fast = greedy_search(model, src, max_len_offset=5)
    slow_model = make_model(
        model.config,
        src_vocab_size=model.generator.out_features,
        options=KernelOptions(attention="formula"),
    ).eval()
    slow_model.load_state_dict(model.state_dict())
    assert greedy_search(slow_model, src, max_len_offset=5) == fast
    formula = DecodingModel(model, attention="formula")
    assert greedy_search(formula, src, max_len_offset=5) == fast


def test_cache_equals_full_recomputation(trained) -> None:
    model, src = trained
    cached = greedy_search(model, src[:25], max_len_offset=5)
    naive = [naive_greedy(model, row, max_len=int((row != PAD).sum()) + 5) for row in src[:25]]
    assert cached == naive


def test_batch_equals_one_at_a_time(trained) -> None:
    model, src = trained
    batched = greedy_search(model, src, max_len_offset=5)
    single = [greedy_search(model, row[row != PAD][None], max_len_offset=5)[0] for row in src]
    assert batched == single


def test_bf16_weights_give_the_same_translations(trained) -> None:
    model, src = trained
    ref = greedy_search(model, src, max_len_offset=5)
    low = copy.deepcopy(model).to(torch.bfloat16)
    # bfloat16 keeps 8 bits of mantissa: a near tie between two tokens may flip (1 of the 100
    # sentences on an AMD Zen 5, none on Intel with AMX); anything more is a real change
    greedy = greedy_search(low, src, max_len_offset=5)
    assert sum(g == r for g, r in zip(greedy, ref, strict=True)) >= 0.97 * len(ref)
    beams = beam_search(low, src, beam=4, max_len_offset=5)
    assert sum(h[0].tokens == r for h, r in zip(beams, ref, strict=True)) >= 0.95 * len(ref)


def _assert_same_translations(mine, ref, src: torch.Tensor) -> None:
    """Greedy, and beam 4 with 2-best (hypotheses and scores), of two decoders agree on src."""
    assert greedy_search(mine, src, max_len_offset=5) == greedy_search(ref, src, max_len_offset=5)
    got = beam_search(mine, src, beam=4, max_len_offset=5, nbest=2)
    expected = beam_search(ref, src, beam=4, max_len_offset=5, nbest=2)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in expected]
    scores = [torch.tensor([[h.score for h in hs] for hs in b]) for b in (got, expected)]
    # the fold and the column blocks reassociate float32 sums: scores of a few tokens' log-
    # probabilities may part by ~1e-5 (seen: 3.4e-5 on one model of the fixture's recipe)
    torch.testing.assert_close(*scores, rtol=2e-5, atol=1e-4)


def test_decoding_model_gives_the_same_translations(trained) -> None:
    model, src = trained
    _assert_same_translations(DecodingModel(model), model, src)


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN")
def test_onednn_and_mkl_products_give_the_same_translations(trained) -> None:
    model, src = trained
    onednn, mkl = (DecodingModel(model, matmul=m) for m in ("onednn", "mkl"))
    _assert_same_translations(onednn, mkl, src)


@pytest.mark.parametrize("parts", [2, 3])
def test_one_sentence_options_give_the_same_translations(trained, parts: int) -> None:
    # one sentence at a time: the folded encoder-decoder attention and the one-row products in
    # column blocks, against neither, and the native step (native_row.py, the default)
    model, src = trained
    fast = DecodingModel(model, one_row_parts=parts, fold_one_sentence=True, native_row_step=False)
    plain = DecodingModel(model, one_row_parts=1, fold_one_sentence=False, native_row_step=False)
    native = DecodingModel(model)
    for row in src[:30]:
        _assert_same_translations(fast, plain, row[row != PAD][None])
        _assert_same_translations(native, plain, row[row != PAD][None])


def test_searches_inside_a_callers_inference_mode_give_the_same_translations(trained) -> None:
    model, src = trained
    fast = DecodingModel(model)
    ref = greedy_search(fast, src, max_len_offset=5)
    ref_beam = beam_search(fast, src, beam=4, max_len_offset=5)
    with torch.inference_mode():  # src and every tensor the searches make: inference tensors
        inf_src = src.clone()
        assert greedy_search(fast, inf_src, max_len_offset=5) == ref
        assert greedy_search(model, inf_src, max_len_offset=5) == ref
        beams = beam_search(fast, inf_src, beam=4, max_len_offset=5)
    assert [h[0].tokens for h in beams] == [h[0].tokens for h in ref_beam]

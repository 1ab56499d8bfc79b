"""A batch's decoder step in one native call (``native_batch_step``, engine/batch_step.py): the
same operators as the engine's Python layers, so the same numbers bit for bit, and refused in
one line where it cannot run."""

from __future__ import annotations

import pytest
import torch
from model_testkit import PAD, V, tiny_model

from transduce.data.vocab import BOS
from transduce.inference import beam_search, greedy_search
from transduce.inference.engine import DecodingModel
from transduce.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels did not build")

_SIZE = {"d_model": 64, "d_k": 32, "d_v": 32, "d_ff": 64}


@pytest.fixture(autouse=True)
def _panels_on_any_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our float32 kernel's panels ("auto") are Intel's rule: taken on any CPU with AVX-512."""
    monkeypatch.setattr("transduce.kernels.matmul._cpu_vendor", lambda: "GenuineIntel")


def _sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    src = torch.randint(3, V, (6, 7), generator=g)
    src[1, 4:] = PAD  # a mask
    src[4, 2:] = PAD
    return src


@pytest.mark.parametrize(
    ("norm", "matmul", "activation"),
    [
        ("post", "auto", "relu"),
        ("pre", "auto", "relu"),
        ("post", "mkl", "swish"),
        ("pre", "onednn", "gelu"),
    ],
)
def test_searches_give_the_python_layers_numbers(
    norm: str, matmul: str, activation: str, monkeypatch
) -> None:
    """Beams (n-best 2, sentences finishing at different steps and leaving the batch) and
    greedy search, the products on each library (our panels where the CPU has AVX-512, else
    MKL; MKL; oneDNN), each activation: the same outputs and the same scores to the bit, the
    step called; a pre-softmax bias and a target vocabulary of its own (post-norm)."""
    extra = {"output_bias": True} if norm == "post" else {}
    model = tiny_model(
        norm=norm,
        tgt_vocab=23 if norm == "post" else None,
        activation=activation,
        **_SIZE,
        **extra,
    )
    engines = [
        DecodingModel(model, matmul=matmul, native_batch_step=on)  # type: ignore[arg-type]
        for on in (True, False)
    ]
    calls: list[int] = []
    real = native.decoder_batch_step
    monkeypatch.setattr(native, "decoder_batch_step", lambda *a: calls.append(1) or real(*a))
    src = _sources()
    beams = [beam_search(e, src, beam=3, max_len=12, nbest=2) for e in engines]
    assert calls, "the native step did not run"
    assert [[(h.tokens, h.score) for h in s] for s in beams[0]] == [
        [(h.tokens, h.score) for h in s] for s in beams[1]
    ]
    assert greedy_search(engines[0], src, max_len=12) == greedy_search(engines[1], src, max_len=12)


def test_steps_give_the_same_logits_and_cache() -> None:
    """Steps with a beam's moves between them (rows tripled, shuffled, a sentence dropped):
    logits equal, and the buffers and the table hold the same numbers."""
    model = tiny_model(**_SIZE)
    src = _sources()[:3]
    out = []
    with torch.no_grad():
        for on in (True, False):
            engine = DecodingModel(model, native_batch_step=on)
            memory, valid = engine.encode(src)
            cache = engine.new_cache()
            logits = [engine.decode(torch.full((3, 1), BOS), memory, valid, cache)]
            cache.reorder(torch.arange(3).repeat_interleave(3))  # 3 hypotheses a sentence
            g = torch.Generator().manual_seed(2)
            for _ in range(4):
                tokens = torch.randint(3, V, (9, 1), generator=g)
                logits.append(engine.decode(tokens, memory, valid, cache))
                cache.reorder(torch.randint(0, 9, (9,), generator=g))
            # position 0 was written in the 3 first rows only (new_empty elsewhere)
            written = [
                (b[:3, :1], b[:, 1 : cache.length])
                for layer in cache.layers
                for b in layer._buffers[0]
            ]
            buffers = [part.clone() for pair in written for part in pair]
            out.append((torch.cat(logits[1:], 1), logits[0], buffers, cache.lineage.clone()))
    assert all(torch.equal(a, b) for a, b in zip(out[0][:2], out[1][:2], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(out[0][2], out[1][2], strict=True))
    assert torch.equal(out[0][3], out[1][3])


def test_where_it_cannot_run_it_is_refused_or_off() -> None:
    model = tiny_model(**_SIZE)
    assert DecodingModel(model).batch_plan is not None  # on by default where it runs
    for kwargs in ({"int8": True}, {"lineage_steps": False}):
        with pytest.raises(ValueError, match="native_batch_step needs"):
            DecodingModel(model, native_batch_step=True, **kwargs)
        assert DecodingModel(model, **kwargs).batch_plan is None
    other_sizes = tiny_model(**{**_SIZE, "d_v": 16})  # K != Dv
    with pytest.raises(ValueError, match="native_batch_step needs"):
        DecodingModel(other_sizes, native_batch_step=True)
    assert DecodingModel(model, native_batch_step=False).batch_plan is None


def test_steps_it_does_not_take_go_through_python(monkeypatch) -> None:
    """More hypotheses a sentence than the attention kernel takes (a beam of 10), and one
    sentence alone (its own native step): the Python layers, the same outputs."""
    model = tiny_model(**_SIZE)
    engines = [DecodingModel(model, native_batch_step=on) for on in (True, False)]
    per_sentence: list[int] = []  # the rows of each sentence in each step it took
    real = native.decoder_batch_step

    def spy(x, *a):
        per_sentence.append(x.size(0) // a[8][0].size(0))  # N // B (cross keys (B, H, S, K))
        return real(x, *a)

    monkeypatch.setattr(native, "decoder_batch_step", spy)
    src = _sources()
    wide = [beam_search(e, src, beam=10, max_len=8) for e in engines]
    assert per_sentence == [1]  # the first step only, one row a sentence; then 10: Python
    alone = [greedy_search(e, src[:1], max_len=8) for e in engines]
    assert per_sentence == [1]  # a sentence alone: its own native step
    assert [[h.tokens for h in s] for s in wide[0]] == [[h.tokens for h in s] for s in wide[1]]
    assert alone[0] == alone[1]

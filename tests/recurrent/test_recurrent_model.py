"""The recurrent encoder-decoder: cached decoding, batching, padding, grouped hypotheses, the
cache's row selections, gradients and weight tying."""

from __future__ import annotations

import pytest
import torch
from recurrent_testkit import KIND_IDS, KINDS, V, step_by_step, tiny_batch, tiny_model
from torch import nn

from transduce.data.vocab import PAD
from transduce.recurrent import AttentionKind, RecurrentCache, parameter_count

# --------------------------------------------------------------------------------------------
# cached decoding


@pytest.mark.parametrize("attention,feeding", KINDS, ids=KIND_IDS)
def test_cached_step_by_step_equals_teacher_forcing(
    attention: AttentionKind, feeding: bool
) -> None:
    model = tiny_model(attention=attention, input_feeding=feeding)
    src, tgt = tiny_batch()
    with torch.no_grad():
        full = model(src, tgt)
    assert full.shape == (3, 5, V)
    torch.testing.assert_close(step_by_step(model, src, tgt, [1] * 5), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("feeding", [False, True])
@pytest.mark.parametrize("chunks", [[2, 3], [1, 3, 1], [5]])
def test_cached_chunks_equal_teacher_forcing(chunks: list[int], feeding: bool) -> None:
    model = tiny_model(input_feeding=feeding)
    src, tgt = tiny_batch()
    with torch.no_grad():
        full = model(src, tgt)
    torch.testing.assert_close(step_by_step(model, src, tgt, chunks), full, atol=1e-5, rtol=1e-5)


def test_cache_holds_hypothesis_and_source_rows() -> None:
    model = tiny_model(n_layers=2, hidden_size=12)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        assert isinstance(cache, RecurrentCache) and cache.length == 0
        model.decode(tgt[:, :1], memory, valid, cache)
    assert cache.h.shape == cache.c.shape == (2, 3, 12)  # (L, N, H)
    assert cache.feed.shape == (3, 12)
    assert cache.keys.shape == (3, 6, 12)  # (B, S, H)
    assert tiny_model(input_feeding=False).new_cache().feed is None


# --------------------------------------------------------------------------------------------
# batching and padding


@pytest.mark.parametrize("attention,feeding", KINDS, ids=KIND_IDS)
def test_batch_equals_single_sentences(attention: AttentionKind, feeding: bool) -> None:
    model = tiny_model(attention=attention, input_feeding=feeding)
    src, tgt = tiny_batch()
    src_len, tgt_len = (src != PAD).sum(1), (tgt != PAD).sum(1)
    with torch.no_grad():
        batched = model(src, tgt)
        for i in range(3):
            alone = model(src[i : i + 1, : src_len[i]], tgt[i : i + 1, : tgt_len[i]])
            torch.testing.assert_close(batched[i, : tgt_len[i]], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention,feeding", KINDS, ids=KIND_IDS)
def test_source_padding_does_not_change_outputs(attention: AttentionKind, feeding: bool) -> None:
    model = tiny_model(attention=attention, input_feeding=feeding)
    src, tgt = tiny_batch()
    padded = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    with torch.no_grad():
        mem, valid = model.encode(src)
        mem_padded, _ = model.encode(padded)
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mem_padded[:, :6][valid], mem[valid], atol=1e-5, rtol=1e-5)
    assert mem_padded[:, :6][~valid].abs().sum() == 0 and mem_padded[:, 6:].abs().sum() == 0


def test_source_tokens_matter_padded_positions_do_not() -> None:
    """Guards the padding test: a real source token changes the output, a token hidden by
    ``src_valid`` does not."""
    model = tiny_model()
    src, tgt = tiny_batch()
    changed = src.clone()
    changed[1, 3] = changed[1, 3] % (V - 1) + 1  # the last real token of sentence 1
    hidden = src.clone()
    hidden[2, 3] = 5  # position 3 of sentence 2 is padding
    with torch.no_grad():
        base = model(src, tgt)
        assert not torch.allclose(model(changed, tgt)[1], base[1])
        memory, valid = model.encode(hidden, src != PAD)
        torch.testing.assert_close(model.decode(tgt, memory, valid), base, atol=1e-5, rtol=1e-5)


def test_empty_source_gives_finite_padding_invariant_outputs() -> None:
    model = tiny_model()
    _, tgt = tiny_batch()
    with torch.no_grad():
        short = model(torch.full((3, 1), PAD), tgt)
        long = model(torch.full((3, 4), PAD), tgt)
    assert torch.isfinite(short).all()
    torch.testing.assert_close(short, long, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# the decoding contract: G hypotheses per sentence, reorder, select_sources


@pytest.mark.parametrize("attention,feeding", KINDS, ids=KIND_IDS)
def test_grouped_hypotheses_equal_expanded_memory(attention: AttentionKind, feeding: bool) -> None:
    model = tiny_model(attention=attention, input_feeding=feeding)
    src, _ = tiny_batch()
    g = 3
    gen = torch.Generator().manual_seed(5)
    tgt = torch.randint(4, V, (src.size(0) * g, 5), generator=gen)  # (B*G, T)
    with torch.no_grad():
        memory, valid = model.encode(src)
        rows = torch.arange(src.size(0)).repeat_interleave(g)  # sentence of each hypothesis
        expected = model.decode(tgt, memory[rows], valid[rows])
        torch.testing.assert_close(model.decode(tgt, memory, valid), expected, atol=1e-5, rtol=1e-5)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, valid, cache) for t in range(5)]
    assert cache.keys.size(0) == src.size(0)  # never copied per hypothesis
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_rows_must_divide() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        with pytest.raises(ValueError, match="not a multiple"):
            model.decode(tgt[:2].repeat(2, 1), memory, valid)  # 4 rows for 3 sentences


@pytest.mark.parametrize("feeding", [False, True])
def test_reorder_and_select_sources_equal_decoding_the_selected_batch(feeding: bool) -> None:
    """Two steps, then keep sentences [2, 0] and hypothesis rows as beam search would (B -> B*2
    beams, permuted and duplicated), then three more steps."""
    model = tiny_model(input_feeding=feeding)
    src, tgt = tiny_batch()
    keep = torch.tensor([2, 0])
    rows = torch.tensor([2, 2, 0, 0])  # hypotheses of sentences 2 and 0, two each
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        for t in range(2):
            model.decode(tgt[:, t : t + 1], memory, valid, cache)
        cache.reorder(rows)
        cache.select_sources(keep)
        memory, valid, tgt_r = memory[keep], valid[keep], tgt[rows]
        rest = [model.decode(tgt_r[:, t : t + 1], memory, valid, cache) for t in range(2, 5)]
        expected = model(src[rows], tgt_r)[:, 2:]
    assert cache.length == 5 and cache.keys.size(0) == 2 and cache.h.size(1) == 4
    torch.testing.assert_close(torch.cat(rest, dim=1), expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# gradients, dropout, tying


@pytest.mark.parametrize(
    "attention,feeding,tie,tgt_vocab,embed",
    [
        ("general", True, True, None, 8),
        ("additive", False, True, 11, 12),
        ("general", False, False, None, 8),
        ("additive", True, False, 11, 8),
    ],
)
def test_every_parameter_gets_a_finite_gradient(
    attention: AttentionKind, feeding: bool, tie: bool, tgt_vocab: int | None, embed: int
) -> None:
    model = tiny_model(
        attention=attention,
        input_feeding=feeding,
        tie_embeddings=tie,
        tgt_vocab_size=tgt_vocab,
        embed_dim=embed,
        dropout=0.1,
    )
    model.train()
    src, tgt = tiny_batch()
    logits = model(src, tgt)
    gold = torch.randint(0, logits.size(-1), logits.shape[:2])
    nn.functional.cross_entropy(logits.flatten(0, 1), gold.flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_dropout_in_training_only() -> None:
    model = tiny_model(dropout=0.3)
    src, tgt = tiny_batch()
    model.train()
    with torch.no_grad():
        assert not torch.allclose(model(src, tgt), model(src, tgt))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(src, tgt), model(src, tgt))


def test_tying() -> None:
    shared = tiny_model(embed_dim=8, hidden_size=12)
    assert shared.encoder.embed.weight is shared.decoder.embed.weight is shared.generator.weight
    assert isinstance(shared.bridge, nn.Linear) and shared.bridge.weight.shape == (8, 12)
    same_size = tiny_model(embed_dim=12, hidden_size=12)
    assert isinstance(same_size.bridge, nn.Identity)
    two_way = tiny_model(tgt_vocab_size=11)
    assert two_way.decoder.embed.weight is two_way.generator.weight
    assert two_way.encoder.embed.weight is not two_way.decoder.embed.weight
    assert two_way(*tiny_batch()).shape == (3, 5, 11)
    untied = tiny_model(tie_embeddings=False)
    weights = [untied.encoder.embed.weight, untied.decoder.embed.weight, untied.generator.weight]
    assert len({id(w) for w in weights}) == 3 and untied.generator.weight.shape == (V, 12)


def test_parameter_count_counts_tied_tensors_once() -> None:
    e, h, v = 8, 12, V
    model = tiny_model(embed_dim=e, hidden_size=h, n_layers=1, input_feeding=False)
    lstm = lambda i: 4 * h * (i + h) + 8 * h  # noqa: E731 - W_ih, W_hh and two biases
    expected = (
        v * e  # the one embedding matrix (encoder, decoder, output)
        + 2 * lstm(e)
        + 2 * h * h  # encoder: two directions and the projection
        + lstm(e)
        + h * h
        + 2 * h * h
        + h * h
        + h  # decoder: LSTM, W, W_c, W_init and b
        + h * e  # the bridge from H to E
    )
    assert parameter_count(model) == expected

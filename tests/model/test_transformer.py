"""The full encoder-decoder (section 3.1): against torch.nn.Transformer, causality, padding,
cached decoding, batching, gradients and weight tying."""

from __future__ import annotations

import pytest
import torch
from model_testkit import PAD, V, decode_reordered, tiny_batch, tiny_config, tiny_model
from torch import nn

from transduce.kernels import KernelOptions
from transduce.model.attention import MultiHeadAttention
from transduce.model.transformer import (
    Transformer,
    parameter_breakdown,
    source_mask,
)

# --------------------------------------------------------------------------------------------
# torch.nn.Transformer reference


def _copy_mha(ref: nn.MultiheadAttention, ours: MultiHeadAttention) -> None:
    ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    ref.out_proj.weight.copy_(ours.w_o.weight)
    ref.out_proj.bias.copy_(ours.w_o.bias)


def _copy_ln(ref: nn.LayerNorm, ours: nn.LayerNorm) -> None:
    ref.weight.copy_(ours.weight)
    ref.bias.copy_(ours.bias)


def _copy_lin(ref: nn.Linear, ours: nn.Linear) -> None:
    ref.weight.copy_(ours.weight)
    ref.bias.copy_(ours.bias)


def _reference(model: Transformer) -> nn.Transformer:
    cfg = model.config
    pre = cfg.norm == "pre"
    common = dict(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=pre,
    )
    enc_layer = nn.TransformerEncoderLayer(**common)
    dec_layer = nn.TransformerDecoderLayer(**common)
    # nn.Transformer's own encoder/decoder always end in a LayerNorm; the paper's (post-norm) don't.
    enc_norm = nn.LayerNorm(cfg.d_model) if pre else None
    dec_norm = nn.LayerNorm(cfg.d_model) if pre else None
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        dim_feedforward=cfg.d_ff,
        dropout=0.0,
        batch_first=True,
        norm_first=pre,
        custom_encoder=nn.TransformerEncoder(
            enc_layer, cfg.n_layers, norm=enc_norm, enable_nested_tensor=False
        ),
        custom_decoder=nn.TransformerDecoder(dec_layer, cfg.n_layers, norm=dec_norm),
    )
    with torch.no_grad():
        for r, o in zip(ref.encoder.layers, model.encoder.layers, strict=True):
            _copy_mha(r.self_attn, o.self_attn)
            _copy_lin(r.linear1, o.ffn.w_1)
            _copy_lin(r.linear2, o.ffn.w_2)
            _copy_ln(r.norm1, o.norms[0])
            _copy_ln(r.norm2, o.norms[1])
        for r, o in zip(ref.decoder.layers, model.decoder.layers, strict=True):
            _copy_mha(r.self_attn, o.self_attn)
            _copy_mha(r.multihead_attn, o.cross_attn)
            _copy_lin(r.linear1, o.ffn.w_1)
            _copy_lin(r.linear2, o.ffn.w_2)
            _copy_ln(r.norm1, o.norms[0])
            _copy_ln(r.norm2, o.norms[1])
            _copy_ln(r.norm3, o.norms[2])
        if pre:
            _copy_ln(ref.encoder.norm, model.encoder.final_norm)
            _copy_ln(ref.decoder.norm, model.decoder.final_norm)
    return ref.eval()


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_equals_torch_transformer(norm: str, fast: bool) -> None:
    model = tiny_model(norm=norm, options=KernelOptions(attention="auto" if fast else "formula"))
    ref = _reference(model)
    if norm == "post":
        assert isinstance(model.encoder.final_norm, nn.Identity)
        assert isinstance(model.decoder.final_norm, nn.Identity)
    src, tgt = tiny_batch()
    src_valid = src != PAD
    t = tgt.size(1)
    with torch.no_grad():
        src_in = model.encoder.positions(model.encoder.embed(src))  # (B, S, D)
        tgt_in = model.decoder.positions(model.decoder.embed(tgt))  # (B, T, D)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)  # True = blocked
        ref_memory = ref.encoder(src_in, src_key_padding_mask=~src_valid)
        ref_hidden = ref(
            src_in,
            tgt_in,
            tgt_mask=causal,
            src_key_padding_mask=~src_valid,
            memory_key_padding_mask=~src_valid,
        )
        ref_logits = ref_hidden @ model.generator.weight.T

        memory, valid = model.encode(src)
        hidden = model.decoder(tgt, memory, valid)
        logits = model(src, tgt)
    assert torch.equal(valid, src_valid)
    torch.testing.assert_close(memory, ref_memory, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden, ref_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert logits.shape == (3, 5, V)


def test_forward_is_encode_then_decode() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        torch.testing.assert_close(model(src, tgt), model.decode(tgt, memory, valid))


# --------------------------------------------------------------------------------------------
# causality, padding, batching


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_is_causal(norm: str) -> None:
    model = tiny_model(norm=norm)
    src, tgt = tiny_batch()
    with torch.no_grad():
        base = model(src, tgt)
        for t in range(tgt.size(1)):
            changed = tgt.clone()
            changed[:, t] = changed[:, t] % 10 + 1  # a different non-pad token below 11
            out = model(src, changed)
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=1e-6)
            assert not torch.allclose(out[:, t], base[:, t])  # the changed position does change


def test_source_padding_does_not_change_outputs() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    padded = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    with torch.no_grad():
        out = model(src, tgt)
        out_padded = model(padded, tgt)
        mem, valid = model.encode(src)
        mem_padded, _ = model.encode(padded)
    torch.testing.assert_close(out_padded, out, atol=1e-5, rtol=1e-5)
    # encoder states of real tokens do not change either
    torch.testing.assert_close(mem_padded[:, :6][valid], mem[valid], atol=1e-5, rtol=1e-5)


def test_source_tokens_do_matter() -> None:
    """Guards the padding test: a real source token change does change the output."""
    model = tiny_model()
    src, tgt = tiny_batch()
    changed = src.clone()
    changed[0, 0] = changed[0, 0] % (V - 1) + 1
    with torch.no_grad():
        assert not torch.allclose(model(src, tgt)[0], model(changed, tgt)[0])
        # but changing a padded source position (with src_valid given) does not
        memory, valid = model.encode(src)
        hidden = src.clone()
        hidden[2, 3] = 5  # position 3 of sentence 2 is padding
        mem2, _ = model.encode(hidden, valid)
        torch.testing.assert_close(
            model.decode(tgt, mem2, valid), model.decode(tgt, memory, valid), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_batch_equals_single_sentences(norm: str) -> None:
    model = tiny_model(norm=norm)
    src, tgt = tiny_batch()
    src_len = (src != PAD).sum(1)
    tgt_len = (tgt != PAD).sum(1)
    with torch.no_grad():
        batched = model(src, tgt)
        for i in range(3):
            alone = model(src[i : i + 1, : src_len[i]], tgt[i : i + 1, : tgt_len[i]])
            torch.testing.assert_close(batched[i, : tgt_len[i]], alone[0], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# cached decoding


_VARIANTS = [
    {},
    {"norm": "pre"},
    {"positional": "learned"},
    {"d_k": 5, "d_v": 7, "n_heads": 3},
]


@pytest.mark.parametrize("kw", _VARIANTS, ids=lambda kw: ",".join(kw) or "base")
def test_cached_step_by_step_equals_full_pass(kw: dict) -> None:
    model = tiny_model(**kw)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        full = model.decode(tgt, memory, valid)
        cache = model.new_cache()
        steps = []
        for t in range(tgt.size(1)):
            steps.append(model.decode(tgt[:, t : t + 1], memory, valid, cache))
            assert cache.length == t + 1
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    layer = cache.layers[0]
    assert layer.self_k is not None and layer.self_k.shape[:3] == (3, model.config.n_heads, 5)
    assert layer.cross_k is not None and layer.cross_k.shape[2] == src.size(1)


@pytest.mark.parametrize("chunks", [[2, 3], [1, 3, 1], [3, 2], [5]])
def test_cached_chunks_equal_full_pass(chunks: list[int]) -> None:
    model = tiny_model(norm="pre")
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        full = model.decode(tgt, memory, valid)
        cache = model.new_cache()
        outs, start = [], 0
        for n in chunks:
            outs.append(model.decode(tgt[:, start : start + n], memory, valid, cache))
            start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cached_decoding_beyond_sinusoid_table() -> None:
    model = tiny_model(max_positions=2)
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        full = model.decode(tgt, memory, valid)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, valid, cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cache_reorder_equals_decoding_reordered_batch() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    index = torch.tensor([2, 0, 0, 1])  # permute and duplicate rows, as beam search does
    rest, cache = decode_reordered(model, src, tgt, index)
    with torch.no_grad():
        expected = model(src[index], tgt[index])[:, 2:]
    assert cache.length == 5
    assert cache.layers[0].self_k.size(0) == 4
    torch.testing.assert_close(rest, expected, atol=1e-5, rtol=1e-5)


def test_grouped_hypotheses_equal_expanded_memory() -> None:
    # G = 3 hypotheses per sentence on one row of memory each (as beam search decodes) give the
    # logits of the same rows decoded against memory copied per hypothesis.
    model = tiny_model()
    src, _ = tiny_batch()
    g = 3
    gen = torch.Generator().manual_seed(5)
    tgt = torch.randint(4, 11, (src.size(0) * g, 5), generator=gen)  # (B*G, T), all distinct
    with torch.no_grad():
        memory, valid = model.encode(src)
        rows = torch.arange(src.size(0)).repeat_interleave(g)  # sentence of each hypothesis
        expected = model.decode(tgt, memory[rows], valid[rows])
        torch.testing.assert_close(model.decode(tgt, memory, valid), expected, atol=1e-5, rtol=1e-5)
        cache = model.new_cache()
        steps = []
        for t in range(tgt.size(1)):
            steps.append(model.decode(tgt[:, t : t + 1], memory, valid, cache))
        assert cache.layers[0].cross_k.size(0) == src.size(0)  # never copied per hypothesis
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


def test_grouped_rows_must_divide() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    with torch.no_grad():
        memory, valid = model.encode(src)
        with pytest.raises(ValueError, match="not a multiple"):
            model.decode(tgt[:2].repeat(2, 1), memory, valid)  # 4 rows for 3 sentences


# --------------------------------------------------------------------------------------------
# gradients and tying


@pytest.mark.parametrize(
    "tgt_vocab,tie,positional",
    [
        (None, True, "sinusoidal"),
        (None, False, "learned"),
        (11, True, "learned"),
        (11, False, "sinusoidal"),
    ],
)
def test_every_parameter_gets_a_finite_gradient(
    tgt_vocab: int | None, tie: bool, positional: str
) -> None:
    model = tiny_model(tgt_vocab=tgt_vocab, tie_embeddings=tie, positional=positional, norm="pre")
    model.train()
    src, tgt = tiny_batch()
    logits = model(src, tgt)
    gold = torch.randint(0, logits.size(-1), logits.shape[:2])
    nn.functional.cross_entropy(logits.flatten(0, 1), gold.flatten()).backward()
    names = [n for n, _ in model.named_parameters()]
    assert names, "model has no parameters"
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_post_norm_gradients_with_explicit_attention() -> None:
    model = tiny_model(options=KernelOptions(attention="formula"))
    model.train()
    src, tgt = tiny_batch()
    model(src, tgt).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_shared_vocab_ties_three_ways() -> None:
    model = tiny_model(tie_embeddings=True)
    assert model.encoder.embed.weight is model.decoder.embed.weight
    assert model.decoder.embed.weight is model.generator.weight
    assert model.generator.bias is None


def test_separate_vocab_ties_two_ways() -> None:
    model = tiny_model(tgt_vocab=11, tie_embeddings=True)
    assert model.decoder.embed.weight is model.generator.weight
    assert model.encoder.embed.weight is not model.decoder.embed.weight
    assert model.encoder.embed.weight.shape == (V, 16)
    assert model.generator.weight.shape == (11, 16)
    assert model(*tiny_batch()).shape == (3, 5, 11)


def test_untied_embeddings_are_separate() -> None:
    model = tiny_model(tie_embeddings=False)
    ws = [model.encoder.embed.weight, model.decoder.embed.weight, model.generator.weight]
    assert len({id(w) for w in ws}) == 3


def test_shared_vocab_with_different_sizes_is_rejected() -> None:
    with pytest.raises(ValueError, match="shared"):
        Transformer(tiny_config(), src_vocab_size=5, tgt_vocab_size=6, shared_vocab=True)


def test_parameter_breakdown_counts_shared_tensors_once() -> None:
    d, f, n = 16, 32, 2
    model = tiny_model()
    parts = parameter_breakdown(model)
    attn = 4 * (d * 8 * 2 + 8 * 2)  # 4 linears of (D, H*K) + bias with H*K = D = 16
    ffn = d * f + f + f * d + d
    enc_layer = attn + ffn + 2 * 2 * d
    dec_layer = 2 * attn + ffn + 3 * 2 * d
    assert parts["embeddings"] == V * d
    assert parts["positions"] == 0
    assert parts["encoder"] == n * enc_layer
    assert parts["decoder"] == n * dec_layer
    assert parts["total"] == sum(p.numel() for p in model.parameters())
    pre = parameter_breakdown(
        tiny_model(norm="pre", positional="learned", tgt_vocab=11, tie_embeddings=False)
    )
    assert pre["embeddings"] == V * d + 2 * 11 * d
    assert pre["positions"] == 2 * 64 * d
    assert pre["encoder"] == n * enc_layer + 2 * d


# --------------------------------------------------------------------------------------------
# dropout


@pytest.mark.parametrize("which", ["dropout", "attention_dropout", "activation_dropout"])
def test_dropout_train_differs_eval_identical(which: str) -> None:
    model = tiny_model(**{which: 0.3})
    src, tgt = tiny_batch()
    model.train()
    with torch.no_grad():
        assert not torch.allclose(model(src, tgt), model(src, tgt))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(src, tgt), model(src, tgt))


def test_source_mask_is_none_without_padding() -> None:
    valid = torch.ones(2, 4, dtype=torch.bool)
    assert source_mask(valid) is None
    valid[1, 3] = False
    assert torch.equal(source_mask(valid), valid[:, None, None, :])


def test_bf16_autocast_training_step_is_close_to_float32() -> None:
    model = tiny_model(dropout=0.0)
    model.train()
    src, tgt = tiny_batch()
    ref = model(src, tgt)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(src, tgt)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, atol=0.1, rtol=0.05)
    low.float().square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name

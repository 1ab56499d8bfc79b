"""Tiny random Transformers and batches for the model tests."""

from __future__ import annotations

import torch
from torch import Tensor

from transduce.config import ModelConfig
from transduce.kernels import KernelOptions
from transduce.model.transformer import Transformer, make_model

PAD = 0
V = 13


def tiny_config(**kw) -> ModelConfig:
    base = dict(
        n_layers=2, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8, dropout=0.0, max_positions=64
    )
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(
    seed: int = 0, tgt_vocab: int | None = None, options: KernelOptions = KernelOptions(), **kw
) -> Transformer:
    torch.manual_seed(seed)
    model = make_model(
        tiny_config(**kw), src_vocab_size=V, tgt_vocab_size=tgt_vocab, pad_id=PAD, options=options
    )
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # non-trivial biases and norms, so that wiring mistakes show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
    if model.config.position_unit == "word":  # every other id starts a word / is a word slot
        src_ids = torch.arange(V)
        tgt_ids = torch.arange(V if tgt_vocab is None else tgt_vocab)
        model.set_word_units(src_ids % 2 == 1, tgt_ids % 3 == 1)
    return model.eval()


def tiny_batch(seed: int = 0) -> tuple[Tensor, Tensor]:
    """Right-padded source (B=3, S=6) and target (B=3, T=5), no pad in the first column."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, V, (3, 6), generator=g)
    src[1, 4:] = PAD
    src[2, 2:] = PAD
    tgt = torch.randint(1, 11, (3, 5), generator=g)  # fits a target vocabulary of 11
    tgt[2, 3:] = PAD
    return src, tgt


def decode_reordered(
    decoder, src: Tensor, tgt: Tensor, index: Tensor, at_once: bool = False
) -> tuple[Tensor, object]:
    """Decode two positions of ``tgt`` step by step, reorder the cache to the rows ``index`` (as
    beam search does), decode positions 2-4 of the reordered rows (``at_once``: in one call).
    ``decoder`` has the decoding contract (a Transformer or a DecodingModel). Returns (logits
    of positions 2-4, cache)."""
    with torch.no_grad():
        memory, valid = decoder.encode(src)
        cache = decoder.new_cache()
        for t in range(2):
            decoder.decode(tgt[:, t : t + 1], memory, valid, cache)
        cache.reorder(index)
        cache.select_sources(index)
        memory_r, valid_r, tgt_r = memory[index], valid[index], tgt[index]
        if at_once:
            return decoder.decode(tgt_r[:, 2:5], memory_r, valid_r, cache), cache
        rest = [decoder.decode(tgt_r[:, t : t + 1], memory_r, valid_r, cache) for t in range(2, 5)]
    return torch.cat(rest, dim=1), cache

"""Tiny random recurrent models and batches for the tests of this folder (not collected)."""

from __future__ import annotations

import torch
from torch import Tensor

from transduce.data.vocab import PAD
from transduce.recurrent import AttentionKind, RecurrentSeq2Seq

V = 13
ATTENTIONS: tuple[AttentionKind, ...] = ("general", "additive")
KINDS = [(a, f) for a in ATTENTIONS for f in (False, True)]  # (attention, input_feeding)
KIND_IDS = [f"{a}-{'feed' if f else 'nofeed'}" for a, f in KINDS]


def tiny_model(
    seed: int = 0,
    *,
    attention: AttentionKind = "general",
    input_feeding: bool = True,
    n_layers: int = 2,
    embed_dim: int = 8,
    hidden_size: int = 12,
    tie_embeddings: bool = True,
    tgt_vocab_size: int | None = None,
    dropout: float = 0.0,
    scale: float = 0.5,
) -> RecurrentSeq2Seq:
    """A small model in eval mode, its parameters N(0, scale): larger than the default
    initialisation so that outputs are peaky and depend on source and prefix."""
    torch.manual_seed(seed)
    model = RecurrentSeq2Seq(
        vocab_size=V,
        embed_dim=embed_dim,
        hidden_size=hidden_size,
        n_layers=n_layers,
        dropout=dropout,
        attention=attention,
        input_feeding=input_feeding,
        tie_embeddings=tie_embeddings,
        tgt_vocab_size=tgt_vocab_size,
    )
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen))
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


def step_by_step(model: RecurrentSeq2Seq, src: Tensor, tgt: Tensor, chunks: list[int]) -> Tensor:
    """Logits (N, T, V) of decoding ``tgt`` on a cache, ``chunks`` positions per call."""
    with torch.no_grad():
        memory, valid = model.encode(src)
        cache = model.new_cache()
        outs, start = [], 0
        for n in chunks:
            outs.append(model.decode(tgt[:, start : start + n], memory, valid, cache))
            start += n
            assert cache.length == start
    return torch.cat(outs, dim=1)

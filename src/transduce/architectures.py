"""The sequence-to-sequence models a config can name (``model.architecture``), built alike.

Both keep the decoding contract (``transduce.inference.contract``) and train with the same data,
loss, optimizer, checkpoints and searches: ``transformer``, the paper's model, and ``rnn``, the
recurrent baseline (``transduce.recurrent``).
"""

from __future__ import annotations

import torch

from transduce.config import ModelConfig
from transduce.data.vocab import PAD
from transduce.model.transformer import Transformer, make_model, parameter_breakdown
from transduce.recurrent import RecurrentSeq2Seq, parameter_count

Seq2Seq = Transformer | RecurrentSeq2Seq


def build_model(
    cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int | None = None, pad_id: int = PAD
) -> Seq2Seq:
    """The model of ``cfg.architecture``; ``tgt_vocab_size`` None: one shared vocabulary."""
    if cfg.architecture == "rnn":
        return RecurrentSeq2Seq(
            vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            embed_dim=cfg.d_model,
            hidden_size=cfg.d_model,
            n_layers=cfg.n_layers,
            dropout=cfg.dropout,
            attention=cfg.rnn_attention,
            input_feeding=cfg.input_feeding,
            tie_embeddings=cfg.tie_embeddings,
            pad_id=pad_id,
        )
    return make_model(
        cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, pad_id=pad_id
    )


def parameter_counts(cfg: ModelConfig, vocab_size: int) -> dict[str, int]:
    """Parameters of the model of ``cfg`` with a shared vocabulary: ``total``, and for a
    Transformer by part (``parameter_breakdown``). Built on the meta device: shapes only."""
    with torch.device("meta"):  # no memory, no initialisation time
        model = build_model(cfg, src_vocab_size=vocab_size)
    if isinstance(model, Transformer):
        return parameter_breakdown(model)
    return {"total": parameter_count(model)}


__all__ = ["Seq2Seq", "build_model", "parameter_counts"]

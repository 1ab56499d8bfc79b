"""The encoder-decoder Transformer (section 3.1, Figure 1) and ``make_model``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from transduce import kernels
from transduce.config import ModelConfig
from transduce.kernels import KernelOptions
from transduce.model.attention import AttentionRecord
from transduce.model.cache import DecoderCache
from transduce.model.embedding import Embeddings
from transduce.model.layers import DecoderLayer, EncoderLayer, LayerNorm
from transduce.model.masks import key_padding_mask
from transduce.model.positions import make_positions, slot_positions, word_positions


def source_mask(src_valid: Tensor) -> Tensor | None:
    """(B, S) bool -> the (B, 1, 1, S) key-padding mask, or None where ``kernels`` finds no
    source position is padding (``kernels.all_attendable``: where that check is cheap)."""
    if kernels.all_attendable(src_valid):
        return None
    return key_padding_mask(src_valid)


def _layer_kwargs(cfg: ModelConfig, options: KernelOptions) -> dict[str, Any]:
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_k": cfg.d_k,
        "d_v": cfg.d_v,
        "d_ff": cfg.d_ff,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "pre_norm": cfg.norm == "pre",
        "activation": cfg.activation,
        "options": options,
    }


class Encoder(nn.Module):
    """Embedding + positions + dropout, then N encoder layers (plus a final norm if pre-norm).

    With ``position_unit: word`` a token's position is its word's index; ``word_start`` (V,) bool
    says which token ids begin a word (``Transformer.set_word_units``)."""

    def __init__(self, cfg: ModelConfig, embed: Embeddings, options: KernelOptions) -> None:
        super().__init__()
        self.embed = embed
        self.positions = make_positions(
            cfg.positional, d_model=cfg.d_model, max_positions=cfg.max_positions
        )
        self.word_start: Tensor | None  # (V,) bool; None: positions count tokens
        units = torch.zeros(embed.weight.size(0), dtype=torch.bool)
        self.register_buffer("word_start", units if cfg.position_unit == "word" else None)
        self.dropout = cfg.dropout  # P_drop on the sums of embeddings and positions
        self.layers = nn.ModuleList(
            EncoderLayer(**_layer_kwargs(cfg, options)) for _ in range(cfg.n_layers)
        )
        self.final_norm = LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()

    def forward(
        self, src: Tensor, src_valid: Tensor, record: AttentionRecord | None = None
    ) -> Tensor:
        """src (B, S) token ids, src_valid (B, S) bool -> memory (B, S, D)."""
        x = kernels.dropout(self.inputs(src), self.dropout, self.training)
        mask = source_mask(src_valid)  # (B, 1, 1, S) or None
        for layer in self.layers:
            x = layer(x, mask, record)
        return self.final_norm(x)

    def inputs(self, src: Tensor) -> Tensor:
        """src (B, S) -> the embeddings plus positions (B, S, D), before dropout."""
        x = self.embed(src)  # (B, S, D)
        if self.word_start is None:
            return self.positions(x)
        index = word_positions(self.word_start[src])  # (B, S), each below S
        return x + self.positions.at(index, src.size(1)).to(x.dtype)


class Decoder(nn.Module):
    """Embedding + positions + dropout, then N decoder layers (plus a final norm if pre-norm).

    With ``position_unit: word`` an input's position is the number of word slots among the inputs
    so far (``slot_positions``): the index of the source word the next slot holds, so that query
    and key positions meet where a slot aligns. ``word_slot`` (V,) bool says which token ids are
    word slots (``Transformer.set_word_units``)."""

    def __init__(self, cfg: ModelConfig, embed: Embeddings, options: KernelOptions) -> None:
        super().__init__()
        self.embed = embed
        self.positions = make_positions(
            cfg.positional, d_model=cfg.d_model, max_positions=cfg.max_positions
        )
        self.word_slot: Tensor | None  # (V,) bool; None: positions count tokens
        units = torch.zeros(embed.weight.size(0), dtype=torch.bool)
        self.register_buffer("word_slot", units if cfg.position_unit == "word" else None)
        self.dropout = cfg.dropout  # P_drop on the sums of embeddings and positions
        self.layers = nn.ModuleList(
            DecoderLayer(**_layer_kwargs(cfg, options)) for _ in range(cfg.n_layers)
        )
        self.final_norm = LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_valid: Tensor,
        cache: DecoderCache | None = None,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        """tgt (N, T) shifted-right target ids (right-padded), memory (B, S, D) -> (N, T, D).

        N = B, or N = B*G for G hypotheses per source sentence (rows sentence-major: row i*G + g
        belongs to sentence i), which beam search uses so that memory is never copied per beam.
        With a cache, ``tgt`` holds only the positions after ``cache.length``; the cache grows.
        """
        x = kernels.dropout(self.inputs(tgt, cache), self.dropout, self.training)
        mask = source_mask(src_valid)  # (B, 1, 1, S) or None
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, mask, None if cache is None else cache.layers[i], record)
        if cache is not None:
            self.advance(cache, tgt)
        return self.final_norm(x)

    def inputs(self, tgt: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """tgt (N, T), the inputs after those in ``cache`` -> embeddings plus positions
        (N, T, D), before dropout."""
        x = self.embed(tgt)  # (N, T, D)
        if self.word_slot is None:
            return self.positions(x, 0 if cache is None else cache.length)
        before = 0 if cache is None else cache.length  # slots among them: at most that many
        index = slot_positions(self.word_slot[tgt], None if cache is None else cache.slots)
        return x + self.positions.at(index, before + tgt.size(1) + 1).to(x.dtype)  # (N, T, D)

    def advance(self, cache: DecoderCache, tgt: Tensor) -> None:
        """Count the inputs tgt (N, T) into ``cache`` once they are decoded."""
        cache.length += tgt.size(1)
        if self.word_slot is not None:
            slots = self.word_slot[tgt].sum(1)  # (N,)
            cache.slots = slots if cache.slots is None else cache.slots + slots


class Transformer(nn.Module):
    """Encoder, decoder and the pre-softmax projection (generator), with the decoding contract:

    - ``encode(src) -> (memory, src_valid)``
    - ``decode(tgt, memory, src_valid, cache) -> logits``, one step at a time on a cache
    - ``new_cache()``; ``DecoderCache.reorder(index)`` selects hypothesis rows (beams),
      ``DecoderCache.select_sources(index)`` source-sentence rows.

    ``decode`` takes N = B*G target rows for B source sentences (G hypotheses each, rows
    sentence-major), so memory and the cross-attention cache stay one row per sentence.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        src_vocab_size: int,
        tgt_vocab_size: int,
        shared_vocab: bool,
        pad_id: int = 0,
        options: KernelOptions = KernelOptions(),
    ) -> None:
        """``options``: how to compute (matrix library, attention path), not what."""
        super().__init__()
        if cfg.architecture != "transformer":
            raise ValueError(f"a Transformer of architecture {cfg.architecture!r}")
        if shared_vocab and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"a shared vocabulary needs equal sizes, got {src_vocab_size} and {tgt_vocab_size}"
            )
        self.config = cfg
        self.pad_id = pad_id
        self.shared_vocab = shared_vocab
        src_embed = Embeddings(vocab_size=src_vocab_size, d_model=cfg.d_model)
        if shared_vocab and cfg.tie_embeddings:
            tgt_embed = src_embed  # three-way sharing (section 3.4)
        else:
            tgt_embed = Embeddings(vocab_size=tgt_vocab_size, d_model=cfg.d_model)
        self.encoder = Encoder(cfg, src_embed, options)
        self.decoder = Decoder(cfg, tgt_embed, options)
        # with output_bias, logits = h E^T + b (Marian's final_logits_bias)
        self.generator = kernels.Linear(
            cfg.d_model, tgt_vocab_size, cfg.output_bias, options.matmul
        )
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name and "positions" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        if cfg.tie_embeddings:
            self.generator.weight = tgt_embed.weight  # pre-softmax projection = target embedding

    def set_word_units(self, word_start: Tensor, word_slot: Tensor) -> None:
        """For ``position_unit: word``: which source ids begin a word, (V_src,) bool, and which
        target ids are word slots, (V_tgt,) bool. Kept in the state dict."""
        enc, dec = self.encoder.word_start, self.decoder.word_slot
        if enc is None or dec is None:
            raise ValueError("word units are for a model with position_unit: word")
        if word_start.shape != enc.shape or word_slot.shape != dec.shape:
            raise ValueError(
                f"word units of shapes {tuple(word_start.shape)} and {tuple(word_slot.shape)} "
                f"for vocabularies of {enc.numel()} and {dec.numel()}"
            )
        enc.copy_(word_start)
        dec.copy_(word_slot)

    def encode(
        self,
        src: Tensor,
        src_valid: Tensor | None = None,
        *,
        record: AttentionRecord | None = None,
    ) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_valid (B, S) (True on non-pad tokens). ``record``
        keeps every layer's attention weights (``AttentionRecord.encoder``)."""
        if src_valid is None:
            src_valid = src != self.pad_id
        return self.encoder(src, src_valid, record), src_valid

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_valid: Tensor,
        cache: DecoderCache | None = None,
        *,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        """tgt (N, T), memory (B, S, D), src_valid (B, S) -> logits (N, T, V) over the next
        token at each position; N = B*G, G hypotheses per sentence (see ``Decoder.forward``).
        ``record`` keeps every layer's attention weights (``.decoder`` and ``.cross``)."""
        hidden = self.decoder(tgt, memory, src_valid, cache, record)  # (N, T, D)
        return self.generator(hidden)  # (N, T, V)

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for ``decode``."""
        return DecoderCache(len(self.decoder.layers))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher forcing: src (B, S), tgt (B, T) shifted right -> logits (B, T, V)."""
        memory, src_valid = self.encode(src)
        return self.decode(tgt, memory, src_valid)


def make_model(
    cfg: ModelConfig,
    *,
    src_vocab_size: int,
    tgt_vocab_size: int | None = None,
    pad_id: int = 0,
    options: KernelOptions = KernelOptions(),
) -> Transformer:
    """Build a Transformer. With ``tgt_vocab_size`` None the vocabulary is shared and source
    embedding, target embedding and pre-softmax projection are one matrix (``tie_embeddings``)."""
    return Transformer(
        cfg,
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=src_vocab_size if tgt_vocab_size is None else tgt_vocab_size,
        shared_vocab=tgt_vocab_size is None,
        pad_id=pad_id,
        options=options,
    )


def parameter_breakdown(model: Transformer) -> dict[str, int]:
    """Parameters by part, each shared tensor counted once (under the first part that owns it)."""
    seen: set[int] = set()
    parts: dict[str, int] = {}
    groups: dict[str, list[nn.Module]] = {
        "embeddings": [model.encoder.embed, model.decoder.embed, model.generator],
        "positions": [model.encoder.positions, model.decoder.positions],
        "encoder": [model.encoder.layers, model.encoder.final_norm],
        "decoder": [model.decoder.layers, model.decoder.final_norm],
    }
    for part, modules in groups.items():
        n = 0
        for m in modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
        parts[part] = n
    parts["total"] = sum(parts.values())
    return parts

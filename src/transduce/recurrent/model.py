"""The recurrent encoder-decoder with the decoding contract of ``transduce.model.Transformer``."""

from __future__ import annotations

from dataclasses import asdict

from torch import Tensor, nn

from transduce.data.vocab import PAD
from transduce.recurrent.cache import RecurrentCache
from transduce.recurrent.config import AttentionKind, RecurrentConfig
from transduce.recurrent.decoder import RecurrentDecoder
from transduce.recurrent.encoder import RecurrentEncoder

INIT_RANGE = 0.1  # every parameter starts uniform in [-0.1, 0.1] (Luong et al. 2015, 4.1)


class RecurrentSeq2Seq(nn.Module):
    """biLSTM encoder, attentional LSTM decoder and output projection, with the contract the
    searches in ``transduce.inference`` use:

    - ``encode(src) -> (memory (B, S, H), src_valid (B, S))``: memory is one tensor, so a search
      can ``index_select`` it; the decoder's initial state is made from it on the first decode.
    - ``decode(tgt, memory, src_valid, cache) -> logits (N, T, V)`` with N = B*G hypothesis
      rows (sentence-major) against B rows of memory, never copied per hypothesis.
    - ``new_cache() -> RecurrentCache``: ``reorder`` hypothesis rows (LSTM state and h~),
      ``select_sources`` sentence rows (attention keys).
    - ``forward(src, tgt)``: teacher forcing.

    Output: logits = G(dropout(h~)); with ``tie_embeddings`` G is the target embedding
    matrix, after a bias-free projection of h~ from H to E when the two sizes differ.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        embed_dim: int,
        hidden_size: int,
        n_layers: int,
        dropout: float,
        attention: AttentionKind,
        input_feeding: bool,
        tie_embeddings: bool,
        pad_id: int = PAD,
        tgt_vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        cfg = RecurrentConfig(
            vocab_size=vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            embed_dim=embed_dim,
            hidden_size=hidden_size,
            n_layers=n_layers,
            dropout=dropout,
            attention=attention,
            input_feeding=input_feeding,
            tie_embeddings=tie_embeddings,
            pad_id=pad_id,
        )  # checks every value
        self.config = cfg
        self.pad_id = pad_id
        src_embed = nn.Embedding(vocab_size, embed_dim)
        if cfg.shared_vocab and tie_embeddings:
            tgt_embed = src_embed  # three-way sharing, as the Transformer's
        else:
            tgt_embed = nn.Embedding(cfg.target_vocab_size, embed_dim)
        self.encoder = RecurrentEncoder(src_embed, hidden_size, n_layers, dropout)
        self.decoder = RecurrentDecoder(
            tgt_embed,
            hidden_size=hidden_size,
            n_layers=n_layers,
            dropout=dropout,
            attention=attention,
            input_feeding=input_feeding,
        )
        self.bridge: nn.Module = nn.Identity()
        if tie_embeddings and embed_dim != hidden_size:  # h~ (H) to the embedding size (E)
            self.bridge = nn.Linear(hidden_size, embed_dim, bias=False)
        out_dim = embed_dim if tie_embeddings else hidden_size
        self.generator = nn.Linear(out_dim, cfg.target_vocab_size, bias=False)
        for p in self.parameters():
            nn.init.uniform_(p, -INIT_RANGE, INIT_RANGE)
        if tie_embeddings:
            self.generator.weight = tgt_embed.weight

    @classmethod
    def from_config(cls, cfg: RecurrentConfig) -> RecurrentSeq2Seq:
        """The model of a (checked) RecurrentConfig."""
        return cls(**asdict(cfg))

    def encode(self, src: Tensor, src_valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """src (B, S) right-padded ids -> memory (B, S, H), src_valid (B, S) (True on non-pad)."""
        if src_valid is None:
            src_valid = src != self.pad_id
        return self.encoder(src, src_valid), src_valid

    def decode(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: RecurrentCache | None = None
    ) -> Tensor:
        """tgt (N, T), memory (B, S, H), src_valid (B, S) -> logits (N, T, V) of the next token at
        each position; N = B*G, G hypotheses per sentence (``RecurrentDecoder.forward``)."""
        hidden = self.decoder(tgt, memory, src_valid, cache)  # (N, T, H)
        return self.generator(self.bridge(hidden))  # (N, T, H) -> (N, T, E or H) -> (N, T, V)

    def new_cache(self) -> RecurrentCache:
        """An empty cache: the first ``decode`` on it starts the state from memory."""
        return RecurrentCache()

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher forcing: src (B, S), tgt (B, T) shifted right -> logits (B, T, V)."""
        memory, src_valid = self.encode(src)
        return self.decode(tgt, memory, src_valid)


def parameter_count(model: nn.Module) -> int:
    """Trainable numbers, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


__all__ = ["INIT_RANGE", "RecurrentSeq2Seq", "parameter_count"]

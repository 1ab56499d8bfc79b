"""The settings of the recurrent encoder-decoder, checked once when they are made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from transduce.data.vocab import PAD, SPECIALS

AttentionKind = Literal["general", "additive"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = ("general", "additive")


def _check_int(name: str, value: object, low: int) -> None:
    # bool is an int subclass: True must not pass for a size
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer of at least {low}; got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")


@dataclass(frozen=True)
class RecurrentConfig:
    """An LSTM encoder-decoder with attention (Luong et al. 2015, Bahdanau et al. 2015).

    vocab_size      source vocabulary, and the target one when ``tgt_vocab_size`` is None
                    (a shared vocabulary); at least the special tokens (PAD, BOS, EOS, UNK)
    tgt_vocab_size  target vocabulary when it is not shared
    embed_dim       E, token embedding size (source and target)
    hidden_size     H, the LSTM size of each encoder direction and of the decoder, and the size
                    of the encoder output (memory) and the attentional state h~
    n_layers        L, LSTM layers of the encoder (each bidirectional) and of the decoder
    dropout         on the embeddings, between LSTM layers and on h~ before the output
    attention       "general" (Luong: score = h_t^T W h_s) or "additive" (Bahdanau:
                    score = v^T tanh(W1 h_t + W2 h_s))
    input_feeding   Luong's input feeding: h~_{t-1} is concatenated to the next decoder input
    tie_embeddings  the output projection is the target embedding (with a shared vocabulary
                    also the source embedding: three-way, as the Transformer's)
    pad_id          the padding id of the source (``PAD``)
    """

    vocab_size: int
    tgt_vocab_size: int | None = None
    embed_dim: int = 256
    hidden_size: int = 256
    n_layers: int = 1
    dropout: float = 0.1
    attention: AttentionKind = "general"
    input_feeding: bool = True
    tie_embeddings: bool = True
    pad_id: int = PAD

    def __post_init__(self) -> None:
        _check_int("vocab_size", self.vocab_size, len(SPECIALS))
        if self.tgt_vocab_size is not None:
            _check_int("tgt_vocab_size", self.tgt_vocab_size, len(SPECIALS))
        _check_int("embed_dim", self.embed_dim, 1)
        _check_int("hidden_size", self.hidden_size, 1)
        _check_int("n_layers", self.n_layers, 1)
        _check_int("pad_id", self.pad_id, 0)
        if self.pad_id >= self.vocab_size:
            raise ValueError(
                f"pad_id must be below vocab_size ({self.vocab_size}); got {self.pad_id}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"dropout must be a number in [0, 1); got {self.dropout!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {self.attention!r}"
            )
        _check_bool("input_feeding", self.input_feeding)
        _check_bool("tie_embeddings", self.tie_embeddings)

    @property
    def target_vocab_size(self) -> int:
        """V, the size of the output distribution."""
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def shared_vocab(self) -> bool:
        return self.tgt_vocab_size is None


__all__ = ["ATTENTION_KINDS", "AttentionKind", "RecurrentConfig"]

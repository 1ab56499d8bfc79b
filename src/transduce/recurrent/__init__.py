"""The recurrent baseline the Transformer paper argues against: an LSTM encoder-decoder with
attention (Luong et al. 2015; Bahdanau et al. 2015), with the Transformer's decoding contract so
that ``transduce.inference`` (greedy, beam) decodes it unchanged.

Shape legend, used in every docstring and shape comment of this package (tensors batch-first,
except LSTM states, which keep ``nn.LSTM``'s layers-first layout):

    B  source sentences
    G  hypotheses per sentence (the beam width W in beam search; 1 in teacher forcing)
    N  target rows, B*G, sentence-major: row i*G + g is hypothesis g of sentence i
    S  source length
    T  target length (positions decoded in one call)
    E  embedding size
    H  hidden size: LSTM size (per direction in the encoder), memory, attention and h~
    L  LSTM layers
    V  target vocabulary size

Masks follow the package-wide convention: True = may attend / real token; ``src_valid`` (B, S)
is True on real source tokens (right padding only).

Imports only torch and ``transduce.data.vocab``.
"""

from transduce.recurrent.attention import (
    Attention,
    additive_scores,
    general_scores,
    group_rows,
    masked_softmax,
)
from transduce.recurrent.cache import RecurrentCache
from transduce.recurrent.config import ATTENTION_KINDS, AttentionKind, RecurrentConfig
from transduce.recurrent.decoder import RecurrentDecoder, masked_mean
from transduce.recurrent.encoder import RecurrentEncoder
from transduce.recurrent.model import RecurrentSeq2Seq, parameter_count

__all__ = [
    "ATTENTION_KINDS",
    "Attention",
    "AttentionKind",
    "RecurrentCache",
    "RecurrentConfig",
    "RecurrentDecoder",
    "RecurrentEncoder",
    "RecurrentSeq2Seq",
    "additive_scores",
    "general_scores",
    "group_rows",
    "masked_mean",
    "masked_softmax",
    "parameter_count",
]

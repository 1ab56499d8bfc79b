"""The Transformer of Vaswani et al. (2017), section 3.

Shape legend, used in every docstring and shape comment of this package (tensors are batch-first):

    B  batch size (sentences; B*W rows during beam search)
    S  source length
    T  target length (queries); T' is the key length when it differs (cached decoding)
    D  d_model
    H  number of heads
    K  d_k (query/key size per head)
    Dv d_v (value size per head)
    F  d_ff
    V  vocabulary size
    W  beam width

Masks follow one convention everywhere: a boolean tensor where True means "may attend" (the
convention of ``torch.nn.functional.scaled_dot_product_attention``). ``src_valid`` / ``tgt_valid``
are (B, S) / (B, T) booleans, True on real tokens and False on padding.
"""

from transduce.model.attention import MultiHeadAttention, attention
from transduce.model.cache import DecoderCache
from transduce.model.embedding import Embeddings, positional_table
from transduce.model.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward
from transduce.model.masks import causal_mask, key_padding_mask
from transduce.model.transformer import Decoder, Encoder, Transformer, make_model

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Embeddings",
    "Encoder",
    "EncoderLayer",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "Transformer",
    "attention",
    "causal_mask",
    "key_padding_mask",
    "make_model",
    "positional_table",
]

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


How each function is computed (which CPU matrix library, fused attention kernel or formula) is
``transduce.kernels``' business; a model takes those choices as one ``KernelOptions`` value.

One file per concept, named as the paper names it: ``attention`` (eq. 1, multi-head attention),
``feed_forward`` (eq. 2), ``embedding`` (3.4), ``positions`` (3.5; and, beyond the paper for
parsing, positions counted in words), ``masks``, ``layers`` (3.1,
the residual connections), ``transformer`` (Figure 1), ``cache`` (keys and values kept between
decoding steps).
"""

from transduce.model.attention import AttentionRecord, MultiHeadAttention, attention
from transduce.model.cache import DecoderCache
from transduce.model.embedding import Embeddings
from transduce.model.feed_forward import PositionwiseFeedForward
from transduce.model.layers import DecoderLayer, EncoderLayer
from transduce.model.masks import causal_mask, key_padding_mask
from transduce.model.positions import positional_table
from transduce.model.transformer import Decoder, Encoder, Transformer, make_model

__all__ = [
    "AttentionRecord",
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

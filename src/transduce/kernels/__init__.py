"""Low-level kernels: the fastest way to compute a few functions on the device and dtype at hand.

Everything here computes a plain function (``x W^T + b``, dropout, softmax(QK^T/sqrt(d_k))V) and
chooses how: which CPU matrix library (MKL or oneDNN), which attention path (PyTorch's fused
kernel or the explicit formula), when low-precision inputs run in float32, and how the inference
engine lays out its weights for each row count (``Projection``, ``ProjectionLayout``; in int8:
``Int8Projection``, ``kernels.quantized``). Every
such rule lives in this package, so the paper's model (``transduce.model``) and the inference
engine (``transduce.inference.engine``) only name the function they need
(tests/kernels/test_vendor_rules_live_in_kernels.py).
Each choice is a typed option passed explicitly (``KernelOptions``), "auto" by default; there is
no process-wide switch but one, for the length of a training run (``training_attention``).
Measured figures behind the rules are in benchmarks/RESULTS.md.
"""

from transduce.kernels.attention import (
    all_attendable,
    attention,
    attention_input,
    attention_weights,
    cached_attention_runs,
    cached_self_attention,
    grouped_queries_path,
    training_attention,
)
from transduce.kernels.beam_select import BeamChoice, beam_select
from transduce.kernels.beam_select import runs as beam_select_runs
from transduce.kernels.device import (
    graphs_capture,
    kept_graph_bytes,
    reads_are_cheap,
    topk_by_chunks_pays,
)
from transduce.kernels.dropout import dropout, dropout_add
from transduce.kernels.matmul import (
    Linear,
    fp16_refusal,
    linear,
    stacked_linear,
    stacked_weights,
)
from transduce.kernels.norm import layer_norm, total_norm
from transduce.kernels.options import AttentionPath, KernelOptions, Matmul
from transduce.kernels.projection import (
    Int8Projection,
    Projection,
    ProjectionLayout,
    one_row_is_read_bound,
)
from transduce.kernels.quantized import int8_refusal
from transduce.kernels.recurrent import fp16_lstm_runs, lstm
from transduce.kernels.topk_tiles import best_pays as log_softmax_best_pays
from transduce.kernels.topk_tiles import log_softmax_topk
from transduce.kernels.topk_tiles import pays as log_softmax_topk_pays

__all__ = [
    "BeamChoice",
    "beam_select",
    "beam_select_runs",
    "cached_attention_runs",
    "cached_self_attention",
    "graphs_capture",
    "AttentionPath",
    "Int8Projection",
    "KernelOptions",
    "Linear",
    "Matmul",
    "Projection",
    "ProjectionLayout",
    "all_attendable",
    "attention",
    "attention_input",
    "attention_weights",
    "training_attention",
    "dropout",
    "dropout_add",
    "fp16_refusal",
    "grouped_queries_path",
    "int8_refusal",
    "fp16_lstm_runs",
    "layer_norm",
    "lstm",
    "kept_graph_bytes",
    "linear",
    "log_softmax_best_pays",
    "log_softmax_topk",
    "log_softmax_topk_pays",
    "one_row_is_read_bound",
    "reads_are_cheap",
    "topk_by_chunks_pays",
    "total_norm",
    "stacked_linear",
    "stacked_weights",
]

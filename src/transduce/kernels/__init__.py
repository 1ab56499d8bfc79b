"""Low-level kernels: the fastest way to compute a few functions on the device and dtype at hand.

Everything here computes a plain function (``x W^T + b``, dropout, softmax(QK^T/sqrt(d_k))V) and
chooses how: which CPU matrix library (MKL or oneDNN), which attention path (PyTorch's fused
kernel or the explicit formula), when low-precision inputs run in float32. Every such rule lives
in this package, so the paper's model (``transduce.model``) only names the function it needs.
Each choice is a typed option passed explicitly (``KernelOptions``), "auto" by default; there is
no process-wide switch. Measured figures behind the rules are in benchmarks/RESULTS.md.
"""

from transduce.kernels.attention import attention, attention_input, attention_weights
from transduce.kernels.dropout import dropout, dropout_add
from transduce.kernels.matmul import Linear, linear, stacked_linear
from transduce.kernels.options import AttentionPath, KernelOptions, Matmul

__all__ = [
    "AttentionPath",
    "KernelOptions",
    "Linear",
    "Matmul",
    "attention",
    "attention_input",
    "attention_weights",
    "dropout",
    "dropout_add",
    "linear",
    "stacked_linear",
]

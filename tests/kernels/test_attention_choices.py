"""The attention rules asked by the model and the engine: when a mask can be left out, and which
path the queries of a beam take."""

from __future__ import annotations

import importlib

import torch

from transduce.kernels import all_attendable, grouped_queries_path


def test_a_mask_is_left_out_only_where_every_key_may_be_attended_on_the_cpu() -> None:
    assert all_attendable(torch.ones(2, 3, dtype=torch.bool))
    assert not all_attendable(torch.tensor([[True, False]]))
    # elsewhere the check would wait for the device: masked anyway ("meta" stands in for a GPU)
    assert not all_attendable(torch.ones(2, 3, dtype=torch.bool, device="meta"))


def test_beams_take_the_formula_on_the_cpu_unless_a_path_is_asked_for() -> None:
    query = torch.zeros(1, 2, 4, 8)  # (B, H, G, K)
    assert grouped_queries_path(query) == "formula"
    assert grouped_queries_path(query, "fused") == "fused"
    assert grouped_queries_path(query.to("meta")) == "auto"


class _OnCuda:
    """A stand-in for a (B, H, T, K) CUDA tensor: its device and sizes are all the rule reads."""

    def __init__(self, length: int) -> None:
        self.device = torch.device("cuda")
        self.shape = (2, 4, length, 8)

    def size(self, dim: int) -> int:
        return self.shape[dim]


def test_training_on_a_gpu_with_a_mask_and_short_keys_asks_for_the_efficient_kernel_first() -> None:
    from torch.nn.attention import SDPBackend

    att = importlib.import_module("transduce.kernels.attention")  # the package's name is a function

    short, long, mask = _OnCuda(24), _OnCuda(att.CUDA_SHORT_KEYS + 1), _OnCuda(24)
    chosen = att.cuda_training_backends(short, short, mask)  # type: ignore[arg-type]
    assert chosen is not None and chosen[0] == SDPBackend.EFFICIENT_ATTENTION
    assert att.cuda_training_backends(short, short, None) is None  # type: ignore[arg-type]
    assert att.cuda_training_backends(short, long, mask) is None  # type: ignore[arg-type]
    with torch.no_grad():  # decoding: PyTorch's own choice
        assert att.cuda_training_backends(short, short, mask) is None  # type: ignore[arg-type]
    cpu = torch.zeros(2, 4, 24, 8)
    assert att.cuda_training_backends(cpu, cpu, cpu.bool()) is None


def test_the_preferred_order_is_one_pytorch_accepts_and_computes_the_same_function() -> None:
    from torch.nn.attention import sdpa_kernel

    att = importlib.import_module("transduce.kernels.attention")  # the package's name is a function

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    assert att.CUDA_TRAINING_PRIORITY is not None
    with sdpa_kernel(list(att.CUDA_TRAINING_PRIORITY), set_priority=True):
        inside = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    outside = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(inside, outside)

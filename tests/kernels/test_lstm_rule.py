"""kernels.lstm: an LSTM under CPU bfloat16 autocast runs on every CPU (oneDNN's bfloat16 LSTM,
which autocast takes, needs AVX-512; elsewhere the LSTM runs in float32, exactly as outside
autocast)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from transduce import kernels
from transduce.kernels import recurrent


def _lstm() -> torch.nn.LSTM:
    torch.manual_seed(0)
    return torch.nn.LSTM(8, 8, num_layers=2, batch_first=True)


def test_under_bf16_autocast_an_lstm_runs_and_learns_on_this_cpu() -> None:
    module, x = _lstm(), torch.randn(3, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = kernels.lstm(module, x)
        out.float().sum().backward()
    plain, _ = module(x)
    torch.testing.assert_close(out.float(), plain, atol=0.05, rtol=0.05)  # bf16 or float32
    assert all(p.grad is not None for p in module.parameters())


def test_where_onednn_cannot_the_lstm_runs_in_float32_as_outside_autocast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recurrent, "bf16_lstm_runs", lambda device: False)
    module, x = _lstm(), torch.randn(3, 5, 8)
    state = (torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    packed = pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, _) = kernels.lstm(module, x, (state[0].bfloat16(), state[1].bfloat16()))
        packed_out, _ = kernels.lstm(module, packed)
    assert out.dtype == h.dtype == torch.float32
    want, _ = module(x, (state[0].bfloat16().float(), state[1].bfloat16().float()))
    assert torch.equal(out, want)
    assert torch.equal(packed_out.data, module(packed)[0].data)


def test_the_rule_asks_for_avx512_on_cpus_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not recurrent.bf16_lstm_runs(torch.device("cpu"))
    assert recurrent.bf16_lstm_runs(torch.device("cuda", 0))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert recurrent.bf16_lstm_runs(torch.device("cpu"))

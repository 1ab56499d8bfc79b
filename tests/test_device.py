"""Device names checked before any work: a clear error, not a traceback."""

from __future__ import annotations

import pytest
import torch

from transduce.device import resolve_device
from transduce.errors import UserError


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu:0").type == "cpu"
    with pytest.raises(UserError, match="the CPU takes no index"):
        resolve_device("cpu:1")  # torch would take it and ignore the 1
    with pytest.raises(UserError, match="unknown device"):
        resolve_device("toaster")
    for other in ("meta", "xla", "ipu", "hpu"):  # device types transduce does not run on
        with pytest.raises(UserError, match="transduce runs on cpu, cuda"):
            resolve_device(other)
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            resolve_device("cuda")


def test_resolve_device_refuses_a_gpu_index_past_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(UserError, match=r"'cuda:2' requested but this machine has 2 GPU\(s\)"):
        resolve_device("cuda:2")

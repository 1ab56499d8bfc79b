"""training_attention: on a CUDA device a run trains without cuDNN's attention (measured slower,
benchmarks/RESULTS.md), the setting restored after; nothing changes elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from training_testkit import tiny_trainer

from transduce.kernels import training_attention
from transduce.training import trainer as trainer_module

CUDA = torch.device("cuda")  # the setting is process-wide: a CPU-only build holds it too


@pytest.fixture(autouse=True)
def _cudnn_attention_on() -> Iterator[None]:
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(was)


def test_a_cuda_run_leaves_cudnn_out_and_puts_it_back() -> None:
    with training_attention(CUDA):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        # the others stay as they were
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_put_back_after_an_error_too() -> None:
    with pytest.raises(RuntimeError, match="boom"), training_attention(CUDA):
        raise RuntimeError("boom")
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_user_who_turned_it_off_finds_it_off() -> None:
    torch.backends.cuda.enable_cudnn_sdp(False)
    with training_attention(CUDA):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_nothing_changes_on_a_cpu() -> None:
    with training_attention(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()


def test_the_trainer_trains_inside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    @contextmanager
    def recording(device: torch.device) -> Iterator[None]:
        seen.append(("enter", device.type))
        yield
        seen.append(("leave", device.type))

    monkeypatch.setattr(trainer_module, "training_attention", recording)
    trainer = tiny_trainer(tmp_path / "run", max_steps=2)
    steps: list[int] = []
    trainer.callbacks = (lambda p: steps.append(len(seen)),)  # inside: entered, not left
    trainer.train()
    assert seen == [("enter", "cpu"), ("leave", "cpu")] and steps == [1, 1]

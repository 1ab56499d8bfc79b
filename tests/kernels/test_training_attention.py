"""training_attention: on a CUDA device a run trains without cuDNN's attention and the flash
kernel (both measured slower than the memory-efficient kernel, benchmarks/RESULTS.md), the
settings restored after; nothing changes elsewhere."""

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


BACKENDS = ("cudnn", "flash", "mem_efficient", "math")


def enabled() -> dict[str, bool]:
    return {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in BACKENDS}


@pytest.fixture(autouse=True)
def _every_backend_on() -> Iterator[None]:
    was = enabled()
    for name in BACKENDS:
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(True)
    yield
    for name, on in was.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


def test_a_cuda_run_leaves_cudnn_and_flash_out_and_puts_them_back() -> None:
    with training_attention(CUDA):
        # the memory-efficient kernel and the math fallback stay
        assert enabled() == {"cudnn": False, "flash": False, "mem_efficient": True, "math": True}
    assert all(enabled().values())


def test_flash_kept_when_asked_or_when_the_efficient_kernel_is_off() -> None:
    with training_attention(CUDA, flash=True):
        assert enabled() == {"cudnn": False, "flash": True, "mem_efficient": True, "math": True}
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    with training_attention(CUDA):
        assert enabled() == {"cudnn": False, "flash": True, "mem_efficient": False, "math": True}
    assert enabled() == {"cudnn": True, "flash": True, "mem_efficient": False, "math": True}


def test_put_back_after_an_error_too() -> None:
    with pytest.raises(RuntimeError, match="boom"), training_attention(CUDA):
        raise RuntimeError("boom")
    assert all(enabled().values())


def test_a_user_who_turned_them_off_finds_them_off() -> None:
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_flash_sdp(False)
    with training_attention(CUDA):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert not torch.backends.cuda.flash_sdp_enabled()


def test_nothing_changes_on_a_cpu() -> None:
    with training_attention(torch.device("cpu")):
        assert all(enabled().values())


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

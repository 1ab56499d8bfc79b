"""When the Trainer reads the next update's batches: on every device but CUDA as it hands out the
current ones (``EpochReader.early``); on CUDA only once the update's work is launched
(``Trainer.reading``, called by the updater just before it waits for the device), so that the
reading thread's Python work does not compete with the launching of the update's kernels. Either
way the same batches in the same order, and the same run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from training_testkit import tiny_trainer

from transduce.training import feed as feed_module
from transduce.training.feed import EpochReader
from transduce.training.loss_window import LossWindow
from transduce.training.progress import Progress


def reader(early: bool, log: list[str]) -> EpochReader:
    def read(first: int) -> list[Any]:
        log.append(f"read {first}")
        return [first]

    batches = [np.arange(i, i + 1) for i in range(5)]
    return EpochReader(batches, read, update_freq=2, early=early)  # groups at 0, 2, 4


def groups(epoch: EpochReader, log: list[str]) -> list[Any]:
    p, window, out = Progress(), LossWindow(), []
    while (group := epoch.next(p, window)) is not None:
        epoch._reader._pending and epoch._reader._pending[1].result()  # let a started read end
        log.append(f"got {group[0]}")
        out.append(group)
        epoch.read_ahead()
    return out


def test_early_reads_the_next_group_as_it_hands_out_this_one() -> None:
    log: list[str] = []
    with reader(True, log) as epoch:
        assert groups(epoch, log) == [[0], [2], [4]]
    assert log == ["read 0", "read 2", "got 0", "read 4", "got 2", "got 4"]


def test_late_reads_the_next_group_only_when_asked() -> None:
    log: list[str] = []
    with reader(False, log) as epoch:
        p, window = Progress(), LossWindow()
        assert epoch.next(p, window) == [0]
        assert log == ["read 0"]  # nothing more until read_ahead
        epoch.read_ahead()
        epoch._reader._pending[1].result()
        assert log == ["read 0", "read 2"]
        epoch.read_ahead()  # once only
        assert epoch.next(p, window) == [2]
        assert epoch.next(p, window) == [4]  # not started: read when asked, all the same
        assert epoch.next(p, window) is None
    assert log == ["read 0", "read 2", "read 4"]
    epoch.read_ahead()  # closed: nothing


def test_the_feed_reads_late_on_cuda_only(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path / "run", max_steps=1)
    assert trainer.feed.epoch(0, torch.device("cpu")).early
    assert not trainer.feed.epoch(0, torch.device("cuda")).early


def _run(run_dir: Path, monkeypatch: pytest.MonkeyPatch, early: bool) -> tuple[list, list]:
    calls: list[int] = []
    epoch = feed_module.BatchFeed.epoch

    def forced(self: Any, n: int, device: torch.device, early_: bool | None = None) -> Any:
        reader = epoch(self, n, device, early)
        read_ahead = reader.read_ahead
        reader.read_ahead = lambda: (calls.append(n), read_ahead())[-1]  # type: ignore[method-assign]
        return reader

    monkeypatch.setattr(feed_module.BatchFeed, "epoch", forced)
    trainer = tiny_trainer(run_dir, max_steps=12, log_every=1)
    trainer.train()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r]
    return losses, calls


@pytest.mark.parametrize("reads_late", [False, True])
def test_the_run_is_the_same_read_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_late: bool
) -> None:
    from transduce.training import trainer as trainer_module

    monkeypatch.setattr(trainer_module.Trainer, "_reads_late", lambda self: reads_late)
    early, early_calls = _run(tmp_path / "early", monkeypatch, True)
    late, late_calls = _run(tmp_path / "late", monkeypatch, False)
    assert len(early) == 12 and late == early
    assert len(late_calls) == 12  # the reader asked once an update (each update launched)

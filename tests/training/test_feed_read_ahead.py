"""When the Trainer reads the next update's batches: as it hands out the current ones
(``EpochReader.early``, the default everywhere for now: ``READ_EARLY_ON_CUDA``), or only once the
update's gradient work is launched (``Trainer.reading``, called by the updater just before it
waits for the device; after the launch when reading late). Either way the same batches in the
same order, and the same run."""

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


def test_read_ahead_after_the_epoch_closed_does_nothing() -> None:
    log: list[str] = []
    with reader(False, log) as epoch:
        assert epoch.next(Progress(), LossWindow()) == [0]  # group 2 left to read_ahead
    epoch.read_ahead()  # closed: no read, no error from the closed thread pool
    epoch._reader.start(2)
    assert log == ["read 0"]


def test_the_feed_reads_early_by_default_and_late_when_asked(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path / "run", max_steps=1)
    assert feed_module.READ_EARLY_ON_CUDA  # until a GPU measures the other way faster
    for device in ("cpu", "cuda"):
        with trainer.feed.epoch(0, torch.device(device)) as epoch:
            assert epoch.early
    with trainer.feed.epoch(0, torch.device("cpu"), early=False) as epoch:
        assert not epoch.early


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
def test_the_next_read_starts_once_the_gradient_work_is_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_late: bool
) -> None:
    """Reading at once: gradients launched, the read started, then the device read (totals);
    reading late: the update launched, then the read started."""
    from transduce.training import late_read, updater
    from transduce.training import trainer as trainer_module

    events: list[str] = []

    def logged(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            events.append(name)
            return out

        return wrapper

    monkeypatch.setattr(trainer_module.Trainer, "_reads_late", lambda self: reads_late)
    monkeypatch.setattr(
        updater.Updater, "gradients", logged("gradients", updater.Updater.gradients)
    )
    monkeypatch.setattr(updater.Updater, "launch", logged("launch", updater.Updater.launch))
    monkeypatch.setattr(late_read, "totals", logged("totals", late_read.totals))
    monkeypatch.setattr(EpochReader, "read_ahead", logged("read_ahead", EpochReader.read_ahead))
    epoch = feed_module.BatchFeed.epoch

    def late(self: Any, n: int, device: torch.device, early: bool | None = None) -> Any:
        return epoch(self, n, device, False)

    monkeypatch.setattr(feed_module.BatchFeed, "epoch", late)
    tiny_trainer(tmp_path / "run", max_steps=3).train()
    if reads_late:  # the gradients are launched within launch; the read follows it
        assert [e for e in events if e in ("launch", "read_ahead")] == ["launch", "read_ahead"] * 3
    else:
        updates = [e for e in events if e in ("gradients", "read_ahead", "totals")]
        assert updates[:9] == ["gradients", "read_ahead", "totals"] * 3


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

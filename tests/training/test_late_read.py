"""Updates read one update late (training/late_read.py), where the trainer would if
``late_read.pays`` (nowhere now, as measured): forced here on the CPU. The same run as reading
at once, bit for bit, while no update is skipped; a non-finite update skipped on the device
(weights, Adam's moments and step count untouched); exact resume; a stop signal's checkpoint;
divergence's exit code 3."""

from __future__ import annotations

import itertools
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from training_testkit import cli, records, tiny_trainer, train_args, write_config

import transduce.training.trainer as trainer_module
import transduce.training.updater as updater_module
from transduce import checkpoint
from transduce.training import late_read
from transduce.training.trainer import Trainer

# what metrics.jsonl's records hold that depends on the clock, not on the training
CLOCK_KEYS = {"elapsed", "tokens_per_s", "data_share", "seconds", "time", "valid_seconds"}


class Reads:
    """What the trainer did, in order: "step" for an update queued, "read" for one read."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def queued_two_before_a_read(self) -> bool:
        """Whether some update was read only after the next one was queued."""
        return any(
            self.events[i : i + 3] == ["step", "step", "read"] for i in range(len(self.events))
        )


@pytest.fixture
def late(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Reading late on the CPU, each queued update and each read recorded."""
    reads = Reads()
    step, read = late_read.step, late_read.read

    def recorded_step(*args: Any, **kwargs: Any) -> late_read.Pending:
        reads.events.append("step")
        return step(*args, **kwargs)

    def recorded_read(pending: late_read.Pending) -> tuple[float, float, float]:
        reads.events.append("read")
        return read(pending)

    monkeypatch.setattr(late_read, "pays", lambda device: True)
    monkeypatch.setattr(late_read, "step", recorded_step)
    monkeypatch.setattr(late_read, "read", recorded_read)
    yield reads


def _trainer(run_dir: Path, **values: Any) -> Trainer:
    """TINY's Trainer with its validation pairs, ``values`` its config keys and Trainer's."""
    return tiny_trainer(run_dir, valid=True, **values)


def _without_clock(run_dir: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in CLOCK_KEYS} for r in records(run_dir)]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_adam(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two Adam state dicts hold the same moments, step counts and groups."""
    states = a["state"].keys() == b["state"].keys() and all(
        _same(state, b["state"][key]) for key, state in a["state"].items()
    )
    return states and a["param_groups"] == b["param_groups"]


def _poison(monkeypatch: pytest.MonkeyPatch, calls: set[int]) -> None:
    """The loss of the batches numbered ``calls`` (1-based) NaN: a bad batch."""
    real = updater_module.label_smoothed_nll
    counter = itertools.count(1)

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        sums = real(*args, **kwargs)
        return sums._replace(loss=sums.loss * math.nan) if next(counter) in calls else sums

    monkeypatch.setattr(updater_module, "label_smoothed_nll", poisoned)


# max_steps 13 with checkpoints every 4 and validations every 6: steps due for something
# (4, 6, 8, 12, 13) and steps left queued between them; dropout on, two parameter groups
RUN = {"max_steps": 13, "save_every": 4, "eval_every": 6, "log_every": 1, "weight_decay": 0.1}


@pytest.mark.parametrize("more", [{}, {"cooldown": 0.5, "update_freq": 2}])
def test_reading_late_trains_as_reading_at_once_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, more: dict[str, Any]
) -> None:
    run = {**RUN, **more}  # the cool-down over steps: each rate from the step before it
    at_once = _trainer(tmp_path / "a", **run)
    at_once.train()
    assert not at_once.reads_late
    with monkeypatch.context() as m:
        reads = Reads()
        m.setattr(late_read, "pays", lambda device: True)
        real_step = late_read.step
        m.setattr(
            late_read, "step", lambda *a, **k: reads.events.append("step") or real_step(*a, **k)
        )
        real_read = late_read.read
        m.setattr(late_read, "read", lambda p: reads.events.append("read") or real_read(p))
        late = _trainer(tmp_path / "b", **run)
        late.train()
    assert late.reads_late and reads.queued_two_before_a_read()
    assert reads.events.count("step") == reads.events.count("read") == 13
    assert _same(at_once.model.state_dict(), late.model.state_dict())
    assert _without_clock(tmp_path / "a") == _without_clock(tmp_path / "b")
    names = [p.name for p in checkpoint.step_checkpoints(tmp_path / "b" / "checkpoints")]
    assert names == ["step_00000004.pt", "step_00000008.pt", "step_00000012.pt", "step_00000013.pt"]
    for name in names:
        a = checkpoint.load(tmp_path / "a" / "checkpoints" / name)
        b = checkpoint.load(tmp_path / "b" / "checkpoints" / name)
        assert _same(a["model"], b["model"]) and _same_adam(a["optimizer"], b["optimizer"])
        assert {**a["progress"], "elapsed": 0} == {**b["progress"], "elapsed": 0}


def test_step_callbacks_fp16_and_cpus_read_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not late_read.pays(torch.device("cpu"))
    monkeypatch.setattr(late_read, "pays", lambda device: True)
    trainer = _trainer(tmp_path / "cb", max_steps=2, callbacks=(lambda p: None,))
    trainer.train()
    assert not trainer.reads_late
    fp16 = _trainer(tmp_path / "fp16", max_steps=2, precision="fp16")
    fp16.train()  # its loss scaler reads its own flags
    assert not fp16.reads_late
    plain = _trainer(tmp_path / "plain", max_steps=2)
    plain.train()
    assert plain.reads_late
    sgd = torch.optim.SGD(plain.model.parameters(), lr=0.1)
    assert late_read.applies(plain.optimizer) and not late_read.applies(sgd)


@pytest.mark.parametrize("bad", [3, 4])  # update 4 would make step 4, due for a checkpoint
def test_a_nan_update_is_skipped_on_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late: Reads, bad: int
) -> None:
    # at a constant rate reading late changes nothing even across a skip: the same run as
    # reading at once, whose skip leaves weights, Adam's moments and step count as they were
    monkeypatch.setattr(trainer_module, "scheduled_rate", lambda step, cfg, done: 1e-3)
    run = {"max_steps": 6, "save_every": 4, "log_every": 1}
    _poison(monkeypatch, calls={bad})
    late_run = _trainer(tmp_path / "late", **run)
    late_run.train()
    assert late_run.reads_late and late.queued_two_before_a_read()
    monkeypatch.setattr(late_read, "pays", lambda device: False)
    _poison(monkeypatch, calls={bad})
    at_once = _trainer(tmp_path / "once", **run)
    at_once.train()
    assert not at_once.reads_late
    assert _same(at_once.model.state_dict(), late_run.model.state_dict())
    adam = at_once.optimizer.state_dict()
    assert _same_adam(adam, late_run.optimizer.state_dict())
    assert {int(state["step"]) for state in adam["state"].values()} == {6}  # 6 applied of 7
    logged = _without_clock(tmp_path / "late")
    assert logged == _without_clock(tmp_path / "once")
    skipped = [r for r in logged if r.get("split") == "skipped"]
    assert [(r["step"], r["skipped"]) for r in skipped] == [(bad, "non-finite loss (nan)")]
    assert late_run.progress.skipped_updates == 1 and late_run.progress.step == 6
    for name in ("step_00000004.pt", "step_00000006.pt"):  # step 4 made by update 5 if bad is 4
        a = checkpoint.load(tmp_path / "once" / "checkpoints" / name)
        b = checkpoint.load(tmp_path / "late" / "checkpoints" / name)
        assert _same(a["model"], b["model"]) and _same_adam(a["optimizer"], b["optimizer"])


def test_the_rate_after_a_skip_read_late_is_one_step_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late: Reads
) -> None:
    _poison(monkeypatch, calls={3})
    trainer = _trainer(tmp_path, max_steps=5, save_every=100, log_every=1)
    trainer.train()
    rates = {r["step"]: r["lr"] for r in records(tmp_path) if "split" not in r}
    schedule = [trainer_module.scheduled_rate(s, trainer.cfg, 0.0) for s in range(1, 6)]
    # steps 1, 2 at their rates; update 3 skipped; the update that made step 3 was queued
    # before the skip was read, at step 4's rate; then on schedule again
    assert rates == {1: schedule[0], 2: schedule[1], 3: schedule[3], 4: schedule[3], 5: schedule[4]}


def test_a_run_read_late_resumes_exactly(tmp_path: Path, late: Reads) -> None:
    straight = _trainer(tmp_path / "a", max_steps=12, save_every=4)
    straight.train()
    _trainer(tmp_path / "b", max_steps=6, save_every=4).train()  # checkpoints 4 and 6
    second = _trainer(tmp_path / "b", max_steps=12, save_every=4, resume=True)
    assert second.progress.step == 6
    second.train()
    assert second.reads_late and late.queued_two_before_a_read()
    assert _same(straight.model.state_dict(), second.model.state_dict())


@pytest.mark.parametrize("reads_late", [True, False])
def test_a_stop_signal_in_an_update_stops_the_run_after_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    reads_late: bool,
) -> None:
    monkeypatch.setattr(late_read, "pays", lambda device: reads_late)
    real = updater_module.label_smoothed_nll
    counter = itertools.count(1)

    def signalled_at_the_fifth(*args: Any, **kwargs: Any) -> Any:
        if next(counter) == 5:  # in the fifth update's forward pass
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(updater_module, "label_smoothed_nll", signalled_at_the_fifth)
    config = write_config(tmp_path / "c.yaml", max_steps=20, save_every=100)
    run = tmp_path / "run"
    code, err = cli(capsys, *train_args(config, run))
    assert code != 0 and "Traceback" not in err
    (saved,) = checkpoint.step_checkpoints(run / "checkpoints")
    assert saved.name == "step_00000005.pt"  # the update under way when the signal came
    assert checkpoint.load(saved)["progress"]["step"] == 5
    assert max(r["step"] for r in records(run) if "split" not in r) == 5
    monkeypatch.setattr(updater_module, "label_smoothed_nll", real)
    code, err = cli(capsys, *train_args(config, run, "--resume"))
    assert code == 0, err
    steps = [r["step"] for r in records(run) if "split" not in r]
    assert steps == list(range(1, 21))  # each step once


def test_divergence_read_late_stops_with_exit_code_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], late: Reads
) -> None:
    _poison(monkeypatch, calls=set(range(5, 100)))  # updates 5, 6, 7 ... all bad
    config = write_config(
        tmp_path / "c.yaml", max_bad_updates=3, save_every=2, max_steps=20, max_minutes=1
    )
    run = tmp_path / "run"
    code, err = cli(capsys, *train_args(config, run))
    assert code == 3, err
    assert late.queued_two_before_a_read()
    skips = [line for line in err.splitlines() if "was skipped" in line]
    assert len(skips) == 3 and all("the update after step 4 was skipped" in s for s in skips)
    assert [p.name for p in checkpoint.step_checkpoints(run / "checkpoints")] == [
        "step_00000002.pt",
        "step_00000004.pt",
    ]
    assert not (run / "model.pt").exists()

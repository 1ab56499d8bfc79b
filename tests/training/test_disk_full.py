"""A full disk while saving (ENOSPC, simulated): the last good checkpoint stays intact and
loadable, no partial file is left under a checkpoint's name, the error names the file, and the
run stops cleanly (exit code 74, no traceback)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from training_testkit import at_step, cli, train_args, with_callbacks, write_config

from transduce import checkpoint


@pytest.mark.parametrize("where", ["torch.save", "os.replace"])
def test_a_full_disk_stops_the_run_and_keeps_the_last_checkpoint(
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real_save, real_replace = torch.save, os.replace

    def full_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 half an archive")  # some bytes made it to the disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))

    def fill_the_disk() -> None:  # after the step-2 checkpoint
        if where == "torch.save":
            monkeypatch.setattr(torch, "save", full_save)
        else:
            monkeypatch.setattr(os, "replace", full_replace)

    config = write_config(tmp_path / "c.yaml", max_steps=8, save_every=2)
    run = tmp_path / "run"
    with_callbacks(monkeypatch, at_step(2, fill_the_disk))
    code, err = cli(capsys, *train_args(config, run))
    monkeypatch.setattr(torch, "save", real_save)
    monkeypatch.setattr(os, "replace", real_replace)

    assert code == 74, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    good, failed = (run / "checkpoints" / f"step_0000000{n}.pt" for n in (2, 4))
    assert line == (
        f"transduce: stopped: cannot write {failed}: No space left on device (errno "
        f"{errno.ENOSPC}); the last good checkpoint, {good}, is intact. Free some "
        "space, then resume with --resume"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [good.name]  # no .tmp
    assert checkpoint.load(good)["progress"]["step"] == 2
    assert not (run / "model.pt").exists()
    code, err = cli(capsys, *train_args(config, run, "--resume"))  # space again: it goes on
    assert code == 0, err
    assert checkpoint.load(run / "model.pt")["config"]["train"]["max_steps"] == 8


def test_metrics_that_cannot_be_written_stop_the_run_at_its_next_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """metrics.jsonl on a full disk (/dev/full): training goes on to its next checkpoint, which is
    written, then stops with 74 naming the file; the records wait, and once the disk has room
    the resumed run's metrics.jsonl holds every step's record."""
    config = write_config(tmp_path / "c.yaml", max_steps=8, save_every=4, log_every=1)
    run = tmp_path / "run"

    def fill_the_disk() -> None:  # after step 1 was logged
        (run / "metrics.jsonl").unlink()
        (run / "metrics.jsonl").symlink_to("/dev/full")

    with_callbacks(monkeypatch, at_step(1, fill_the_disk))
    code, err = cli(capsys, *train_args(config, run))
    assert code == 74, err
    saved = run / "checkpoints" / "step_00000004.pt"
    assert err.strip().splitlines()[-1] == (
        f"transduce: stopped: cannot write {run / 'metrics.jsonl'}: No space left on device "
        f"(errno {errno.ENOSPC}); {saved} holds the run (3 records of its metrics unwritten). "
        "Mend that, then resume with --resume"
    )
    assert err.count("transduce: warning: cannot write") == 1 and "Traceback" not in err
    assert checkpoint.load(saved)["progress"]["step"] == 4
    (run / "metrics.jsonl").unlink()  # room again (the records of steps 2 to 4 are gone)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # cut short
    code, err = cli(capsys, *train_args(config, run, "--resume"))
    assert code == 0, err
    assert f"{run / 'metrics.jsonl'}: line 2 is not a record (a write cut short?): dropped" in err
    steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").open()]
    assert steps[0] == 1 and {5, 6, 7, 8} <= set(steps) and 2 not in steps


def test_a_record_written_in_part_is_cut_back_and_written_whole_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk can take part of a write and then fail; the retry wrote the whole text after
    that part (a line that is not JSON, a record lost on resume)."""
    from transduce.training.metrics_log import MetricsLog

    log = MetricsLog(tmp_path, tensorboard=False)
    log.reset()
    log.write({"step": 1})
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def short_then_full(fd: int, data: bytes) -> int:
        monkeypatch.setattr(os, "write", full)
        return real_write(fd, data[:5])  # 5 bytes in, then the disk is full

    monkeypatch.setattr(os, "write", short_then_full)
    log.write({"step": 2})  # warned, kept
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'
    monkeypatch.setattr(os, "write", real_write)
    log.write({"step": 3})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]

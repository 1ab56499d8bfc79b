"""Preemption: SIGTERM or SIGINT while training writes a resumable checkpoint at the next step
boundary and exits with code 143, naming the checkpoint and the command that resumes it; the
resumed run's losses are those of an uninterrupted one; a second signal exits at once; the
previous handlers come back. (Two ranks agreeing: test_protections_distributed.py.)"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest
import torch
from training_testkit import (
    at_step,
    cli,
    records,
    sigterm,
    train_args,
    train_losses,
    with_callbacks,
    write_config,
)

from transduce import checkpoint
from transduce.training.preemption import SignalWatch, resume_command


def test_sigterm_checkpoints_exits_143_and_resumes_to_the_same_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "c.yaml", max_steps=10, save_every=4, eval_every=5, average_last=3
    )
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert cli(capsys, *train_args(config, straight))[0] == 0
    before = signal.getsignal(signal.SIGTERM)

    with monkeypatch.context() as m:
        with_callbacks(m, at_step(6, sigterm))  # the signal comes after update 6
        code, err = cli(capsys, *train_args(config, stopped))
    assert code == 143, err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler put back
    assert "Traceback" not in err
    step7 = stopped / "checkpoints" / "step_00000007.pt"  # the next step boundary
    lines = err.strip().splitlines()
    assert (
        lines[-2]
        == f"transduce: stopped: stopped by SIGTERM after step 7; resumable checkpoint {step7}"
    )
    resume = (
        f"transduce --no-malloc-tuning train --config {config} --out {stopped} --quiet --resume"
    )
    assert lines[-1] == f"transduce: resume with: {resume}"
    assert [p.name for p in checkpoint.step_checkpoints(stopped / "checkpoints")] == [
        "step_00000004.pt",
        "step_00000007.pt",
    ]
    assert not (stopped / "model.pt").exists()
    assert checkpoint.load(step7)["progress"]["step"] == 7

    code, err = cli(capsys, *resume.split()[1:])  # the command it printed
    assert code == 0, err
    want, got = train_losses(straight), train_losses(stopped)
    assert [s for s, _ in got] == list(range(1, 11))  # every step once
    assert got == want  # to the last bit: the same batches, dropout masks and updates
    assert [r["step"] for r in records(stopped) if r.get("split") == "valid"] == [5, 10]
    # the signal's checkpoint (step 7) is off the schedule: gone once step 8 is written, so the
    # average in model.pt is of the uninterrupted run's checkpoints (4, 8, 10)
    names = [p.name for p in checkpoint.step_checkpoints(stopped / "checkpoints")]
    assert names == [p.name for p in checkpoint.step_checkpoints(straight / "checkpoints")]
    assert checkpoint.load(stopped / "model.pt")["averaged"] == [
        str(stopped / "checkpoints" / name) for name in names
    ]
    want_model = checkpoint.load(straight / "model.pt")["model"]
    got_model = checkpoint.load(stopped / "model.pt")["model"]
    assert all(torch.equal(want_model[k], v) for k, v in got_model.items())


def test_a_signal_as_the_run_ends_lets_it_finish_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "c.yaml", max_steps=6, save_every=4)
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        with_callbacks(m, at_step(6, sigterm))  # after the last update: no step boundary left
        code, err = cli(capsys, *train_args(config, run))
    assert code == 0, err
    assert (run / "model.pt").exists()
    assert "SIGTERM came as the run was ending: it finished instead" in err


def test_a_second_signal_exits_at_once_unless_it_is_the_same_request() -> None:
    now = [100.0]
    exits: list[int] = []
    watch = SignalWatch(grace=1.0, clock=lambda: now[0], exit_now=exits.append)
    before = signal.getsignal(signal.SIGINT)
    with watch:
        assert signal.getsignal(signal.SIGINT) is not before
        assert not watch.received
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: no KeyboardInterrupt, a flag
        assert watch.received and watch.signal_name() == "SIGINT"
        now[0] += 0.5
        signal.raise_signal(signal.SIGTERM)  # torchrun forwarding the scheduler's: one request
        assert exits == []
        now[0] += 1.0
        signal.raise_signal(signal.SIGTERM)  # a second request: out at once, 128 + 15
        assert exits == [143]
    assert signal.getsignal(signal.SIGINT) is before


def test_no_handlers_outside_the_main_thread() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def in_a_thread() -> None:
        with SignalWatch():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [before]


def test_resume_command_adds_resume_once() -> None:
    assert resume_command(["train", "--config", "a b.yaml", "--out", "r"]) == (
        "transduce train --config 'a b.yaml' --out r --resume"
    )
    assert resume_command(["train", "--resume", "--out", "r"]) == "transduce train --resume --out r"


def test_a_run_that_stops_at_that_step_anyway_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # early stopping decides at step 2, when the signal is acted on: a resume would not know
    # it had stopped, so the run finishes instead (model.pt, exit code 0)
    config = write_config(tmp_path / "c.yaml", max_steps=10, eval_every=1, patience=1)
    with_callbacks(monkeypatch, at_step(1, sigterm))
    run = tmp_path / "run"
    code, err = cli(capsys, *train_args(config, run))
    assert code == 0, err
    assert (run / "model.pt").exists()
    assert [p.name for p in checkpoint.step_checkpoints(run / "checkpoints")] == [
        "step_00000002.pt"
    ]
    assert checkpoint.load(run / "checkpoints" / "step_00000002.pt")["progress"]["bad_evals"] == 1


def test_a_signal_during_the_last_update_lets_the_run_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run stops at that step anyway: it finished as preempted (exit 143, no model.pt)
    where it should finish, as the Trainer's comment and the README say."""
    config = write_config(tmp_path / "c.yaml", max_steps=8, save_every=4)
    with monkeypatch.context() as m:
        with_callbacks(m, at_step(7, sigterm))  # seen at the step boundary of update 8
        code, err = cli(capsys, *train_args(config, tmp_path / "run"))
    assert code == 0, err
    assert (tmp_path / "run" / "model.pt").is_file()
    assert (
        checkpoint.load(tmp_path / "run" / "checkpoints" / "step_00000008.pt")["progress"]["step"]
        == 8
    )


@pytest.mark.parametrize("command", ["demo", "experiment"])
def test_a_stopped_demo_or_experiment_resumes_with_the_command_it_prints(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """The demo and `experiment reversal` print `... --resume` when stopped, as train does:
    the command they print parses and continues the run (it was refused: no --resume there)."""
    import functools

    from transduce import demo, experiments
    from transduce.config import update

    small = {"train_size": 2000, "valid_size": 50, "d_model": 32, "d_ff": 64, "d_k": 8, "d_v": 8}
    out = tmp_path / command
    argv = {
        "demo": ["demo", "--out", str(out), "--set", "max_steps=6"],
        "experiment": ["experiment", "reversal", "--minutes", "0.03", "--out", str(out)],
    }[command]
    argv = [*argv, *(f"--set={k}={v}" for k, v in small.items())] if command == "demo" else argv
    argv = [*argv, "--quiet"]
    configured = experiments.reversal_config
    monkeypatch.setattr(
        experiments, "reversal_config", lambda *a, **k: update(configured(*a, **k), small)
    )
    module = demo if command == "demo" else experiments
    with monkeypatch.context() as m:
        partial = functools.partial(module.train_synthetic, callbacks=(at_step(2, sigterm),))
        m.setattr(module, "train_synthetic", partial)
        code, err = cli(capsys, *argv)
    assert code == 143, err
    run = out if command == "demo" else out / "baseline"
    assert checkpoint.step_checkpoints(run / "checkpoints")[-1].name == "step_00000003.pt"
    resume = f"transduce --no-malloc-tuning {' '.join(argv)} --resume"
    assert err.strip().splitlines()[-1] == f"transduce: resume with: {resume}"
    code, err = cli(capsys, *resume.split()[1:])
    assert code == 0, err
    assert (run / "model.pt").is_file()
    if command == "demo":  # on to its last step
        assert checkpoint.step_checkpoints(run / "checkpoints")[-1].name == "step_00000006.pt"
    if command == "experiment":
        assert (out / "reversed" / "model.pt").is_file() and (out / "summary.json").is_file()
        # once finished, a resume has nothing left to train and draws again
        assert cli(capsys, *resume.split()[1:])[0] == 0
    elsewhere = [str(tmp_path / "new") if a == str(out) else a for a in argv]
    code, err = cli(capsys, *elsewhere, "--resume")
    assert code == 2 and "holds no checkpoint to continue from" in err, err

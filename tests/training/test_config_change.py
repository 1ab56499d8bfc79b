"""Resuming with a changed config: the budget, stopping rules, *_every keys, device and the like
may change (the change printed); any other change is refused, exit code 2, the keys with their
old and new values, no traceback, unless each is named with --allow-change KEY."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from training_testkit import cli, train_args, write_config

from transduce.config import Config, update
from transduce.errors import UserError
from transduce.training.config_change import (
    FREE,
    Setting,
    allowed_keys,
    check_resume,
    differences,
)


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("transduce: error: ")]
    assert len(errors) == 1, err
    return errors[0]


def test_resume_with_changed_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    first = write_config(tmp_path / "first.yaml", max_steps=4, save_every=2)
    assert cli(capsys, *train_args(first, run))[0] == 0

    # a longer budget, other intervals, another guard: free to change, and said so
    longer = write_config(
        tmp_path / "longer.yaml", max_steps=6, save_every=3, log_every=2, max_bad_updates=5
    )
    code, err = cli(capsys, *train_args(longer, run, "--resume"))
    assert code == 0, err
    assert (
        "with a changed config: train.max_bad_updates: 20 -> 5; train.max_steps: 4 -> 6; "
        "train.save_every: 2 -> 3; train.log_every: 1 -> 2"
    ) in err

    # a new learning rate and label smoothing: refused, both named, the run untouched
    other = write_config(
        tmp_path / "other.yaml",
        max_steps=8,
        save_every=3,
        log_every=2,
        lr_factor=2.0,
        label_smoothing=0.0,
    )
    code, err = cli(capsys, *train_args(other, run, "--resume"))
    assert code == 2
    line = _one_error_line(err)
    assert "resuming would change the model, the data order or the updates" in line
    assert "train.label_smoothing: 0.1 -> 0.0; train.lr_factor: 1.0 -> 2.0" in line
    assert "max_steps" not in line  # a free change is not a reason
    assert "--allow-change KEY" in line
    assert json.loads((run / "config.json").read_text())["train"]["max_steps"] == 6  # as it was

    # one of the two allowed is not enough; both are
    code, err = cli(capsys, *train_args(other, run, "--resume", "--allow-change", "lr_factor"))
    assert code == 2 and "train.label_smoothing: 0.1 -> 0.0" in _one_error_line(err)
    assert "lr_factor" not in _one_error_line(err)
    code, err = cli(
        capsys,
        *train_args(
            other,
            run,
            "--resume",
            "--allow-change",
            "lr_factor",
            "--allow-change",
            "train.label_smoothing",
        ),
    )
    assert code == 0, err
    assert "train.lr_factor: 1.0 -> 2.0" in err
    assert json.loads((run / "config.json").read_text())["train"]["lr_factor"] == 2.0


def test_allow_change_is_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "c.yaml")
    run = tmp_path / "run"
    code, err = cli(capsys, *train_args(config, run, "--resume", "--allow-change", "lr_factr"))
    assert code == 2 and "unknown config key 'lr_factr'" in _one_error_line(err)
    code, err = cli(capsys, *train_args(config, run, "--allow-change", "lr_factor"))
    assert code == 2 and "only when resuming (--resume)" in _one_error_line(err)
    assert not run.exists()


def test_differences_and_the_free_keys() -> None:
    old = Config()
    new = update(old, {"max_steps": 5, "d_model": 256, "beam": 2, "name": "translation"})
    changes = {key: (a, b) for key, a, b in differences(old, new)}
    assert changes["train.max_steps"] == (100_000, 5) and changes["model.d_model"] == (512, 256)
    assert changes["task.name"] == ("addition", "translation")
    assert changes["task.min_digits"] == (1, "(absent)")  # a key of the other task
    assert changes["task.train_src"] == ("(absent)", "")
    with pytest.raises(UserError) as e:
        check_resume(old.to_dict(), new, ["d_model"], Path("ck.pt"))
    assert "model.d_model" not in str(e.value) and "task.name" in str(e.value)
    assert "train.max_steps" not in str(e.value) and "decode.beam" not in str(e.value)
    assert check_resume(old.to_dict(), old, [], Path("ck.pt")) == ""
    # allowing a key that did not change is refused, the key and its value named
    with pytest.raises(UserError, match=r"--allow-change train.lr_factor: not changed .*= 1.0"):
        check_resume(old.to_dict(), new, ["d_model", "name", "lr_factor"], Path("ck.pt"))
    # every free key exists; none of them shapes the model or the data
    assert allowed_keys(sorted(FREE)) == FREE
    assert not {k for k in FREE if k.startswith("model.")}
    assert {
        "train.seed",
        "train.max_tokens",
        "train.precision",
        "train.lr_factor",
        "train.max_len",
    }.isdisjoint(FREE)


def test_free_keys_that_are_free_only_where_they_change_nothing() -> None:
    old = Config()
    ck = Path("ck.pt")

    def refused_from(
        stored: Config, new: Config, before: Setting = Setting(), now: Setting = Setting()
    ) -> str:
        try:
            check_resume(stored.to_dict(), new, [], ck, before, now)
        except UserError as e:
            return str(e)
        return ""

    def refused(new: Config, before: Setting = Setting(), now: Setting = Setting()) -> str:
        return refused_from(old, new, before, now)

    # update_freq: free while processes x update_freq, the tokens per update, stay the same
    twice = update(old, {"update_freq": 2})
    assert refused(twice, Setting(2), Setting(1)) == ""
    assert "train.update_freq: 1 -> 2" in refused(twice)
    # the budget sets the lr of every later update when the cooldown anneals over its last share
    longer = {"max_steps": 200_000, "max_minutes": 90.0}
    assert refused(update(old, longer)) == ""
    cooled = update(old, {"cooldown": 0.3})
    message = refused(update(cooled, longer))
    assert "train.max_steps" in message and "train.max_minutes" in message
    assert "train.cooldown" in message  # (the stored run had none: it is a change too)
    stored = cooled.to_dict()
    with pytest.raises(UserError, match="train.max_minutes"):
        check_resume(stored, update(cooled, longer), [], ck)
    assert "max_minutes" in check_resume(
        stored, update(cooled, longer), ["max_minutes", "max_steps"], ck
    )
    # device: free unless precision auto resolves to another precision there
    moved = update(old, {"device": "cuda"})
    assert refused(moved, Setting(1, "bf16"), Setting(1, "bf16")) == ""
    message = refused(moved, Setting(1, "bf16"), Setting(1, "fp32"))
    assert "train.precision (as resolved on the device): 'bf16' -> 'fp32'" in message
    assert (
        check_resume(
            old.to_dict(), moved, ["precision"], ck, Setting(1, "bf16"), Setting(1, "fp32")
        ).count("->")
        == 2
    )  # allowed by name: printed
    assert refused(moved, Setting(1, None), Setting(1, "fp32")) == ""  # older checkpoints
    # precision named as what "auto" resolved to (or the reverse): nothing changes, so free
    auto, fp32 = update(old, {"precision": "auto"}), update(old, {"precision": "fp32"})
    for a, b in ((auto, fp32), (fp32, auto)):
        assert "train.precision: " in check_resume(
            a.to_dict(), b, [], ck, Setting(1, "fp32"), Setting(1, "fp32")
        )
        message = refused_from(a, b, Setting(1, "bf16"), Setting(1, "fp32"))
        assert "train.precision: " in message and "--allow-change" in message
        assert refused_from(a, b, Setting(1, None), Setting(1, "fp32"))  # unknown: refused


def test_a_resume_cannot_change_the_vocabulary(tmp_path: Path) -> None:
    # a resumed run reads its run folder's vocabulary files: a new size would change nothing
    # but config.json, so it is refused even when allowed
    old = update(Config(), {"name": "translation", "vocab_size": 300})
    new = update(old, {"vocab_size": 200})
    with pytest.raises(UserError, match="keeps its checkpoint's vocabulary.*task.vocab_size"):
        check_resume(old.to_dict(), new, ["vocab_size"], tmp_path / "step.pt")
    # nor another vocabulary to reuse (accepted and recorded, it was read by nothing)
    new = update(old, {"vocab_model": "/elsewhere/vocab.model"})
    with pytest.raises(UserError, match="keeps its checkpoint's vocabulary.*task.vocab_model"):
        check_resume(old.to_dict(), new, ["vocab_model"], tmp_path / "step.pt")


def test_a_resume_refuses_vocabulary_files_that_are_not_the_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transduce import checkpoint

    run = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", max_steps=2, save_every=2)
    assert cli(capsys, *train_args(config, run))[0] == 0
    last = checkpoint.step_checkpoints(run / "checkpoints")[-1]
    state = checkpoint.load(last)
    vocab = dict(state["vocab"])
    key = next(k for k, v in vocab.items() if isinstance(v, list | str) and len(v) > 1)
    vocab[key] = vocab[key][::-1]  # the same symbols, other ids
    checkpoint.save({**state, "vocab": vocab}, last)
    longer = write_config(tmp_path / "longer.yaml", max_steps=4, save_every=2)
    code, err = cli(capsys, *train_args(longer, run, "--resume"))
    assert code == 2 and "trained with another vocabulary" in _one_error_line(err)


def test_every_decode_key_may_change_on_resume() -> None:
    """The decode section is the saved model's decoding defaults (validation searches with
    valid_beam): a new sampling setting was refused as if it changed the updates."""
    from dataclasses import fields

    from transduce.config import DecodeConfig

    assert {f"decode.{f.name}" for f in fields(DecodeConfig)} <= FREE


def test_allowed_optimizer_changes_act(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--allow-change of adam_beta2, adam_eps and weight_decay was accepted and printed, but
    the checkpoint's optimizer kept the saved values: the run trained as if nothing changed.
    Also from no decay to some, which was refused as a different number of groups."""
    import shutil

    import torch

    from transduce.checkpoint import load as load_checkpoint

    first = write_config(tmp_path / "first.yaml", max_steps=4, save_every=4)
    assert cli(capsys, *train_args(first, tmp_path / "a"))[0] == 0
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    same = write_config(tmp_path / "same.yaml", max_steps=6, save_every=2)
    changed = write_config(
        tmp_path / "changed.yaml", max_steps=6, save_every=2, adam_beta2=0.5, adam_eps=1e-3,
        weight_decay=0.5,
    )  # fmt: skip
    allow = ["--allow-change", "adam_beta2", "--allow-change", "adam_eps"]
    argv = train_args(changed, tmp_path / "a", "--resume", *allow, "--allow-change", "weight_decay")
    code, err = cli(capsys, *argv)
    assert code == 0, err
    assert cli(capsys, *train_args(same, tmp_path / "b", "--resume"))[0] == 0
    state = load_checkpoint(tmp_path / "a" / "checkpoints" / "step_00000006.pt")
    groups = state["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]
    assert all(g["betas"][1] == 0.5 and g["eps"] == 1e-3 for g in groups)
    other = load_checkpoint(tmp_path / "b" / "checkpoints" / "step_00000006.pt")["model"]
    assert any(not torch.equal(v, other[k]) for k, v in state["model"].items())

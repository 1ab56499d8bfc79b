"""The divergence guard: an update with a non-finite loss or gradient norm is skipped (weights,
Adam's state, the step and the learning rate untouched), counted and logged without bare NaN;
max_bad_updates in a row stop the run with exit code 3; no file is written from non-finite
weights. (Two ranks skipping together: test_protections_distributed.py.)"""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from training_testkit import cli, records, tiny_trainer, train_args, write_config

import transduce.training.updater as updater_module
from transduce import checkpoint
from transduce.errors import Diverged
from transduce.training.guard import gradient_norm
from transduce.training.metrics_log import MetricsLog
from transduce.training.progress import Progress


def _poison_losses(
    monkeypatch: pytest.MonkeyPatch, calls: set[int] | None = None, since: int | None = None
) -> None:
    """Make the loss of the batches numbered ``calls`` (1-based), or of every batch from
    ``since`` on, NaN: what a bad batch or an overflow does."""
    real = updater_module.label_smoothed_nll
    counter = itertools.count(1)

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        sums = real(*args, **kwargs)
        n = next(counter)
        bad = (calls is not None and n in calls) or (since is not None and n >= since)
        return sums._replace(loss=sums.loss * math.nan) if bad else sums

    monkeypatch.setattr(updater_module, "label_smoothed_nll", poisoned)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_nan_loss_skips_the_update_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _poison_losses(monkeypatch, calls={3})
    trainer = tiny_trainer(tmp_path, max_steps=5, save_every=100)
    seen: list[tuple[int, dict[str, Any], dict[str, Any], float]] = []

    def snapshot(p: Progress) -> None:  # after every update, applied or skipped
        seen.append(
            (
                p.step,
                copy.deepcopy(trainer.model.state_dict()),
                copy.deepcopy(trainer.optimizer.state_dict()),
                trainer.optimizer.param_groups[0]["lr"],
            )
        )

    trainer.callbacks = (snapshot,)
    assert trainer.train()["step"] == 5
    assert [s[0] for s in seen] == [1, 2, 2, 3, 4, 5]  # the third update did not count
    (_, w2, adam2, lr2), (_, w_skip, adam_skip, lr_skip) = seen[1], seen[2]
    assert _same(w2, w_skip) and lr2 == lr_skip
    assert adam2["state"].keys() == adam_skip["state"].keys()
    for key, state in adam2["state"].items():
        assert all(torch.equal(v, adam_skip["state"][key][name]) for name, v in state.items())
    assert not _same(seen[3][1], w2)  # the next update is applied

    logged = records(tmp_path)  # and none holds a bare NaN
    skipped = [r for r in logged if r.get("split") == "skipped"]
    assert skipped == [
        {
            "step": 3,
            "split": "skipped",
            "epoch": 0,
            "skipped": "non-finite loss (nan)",
            "loss": "nan",
            "grad_norm": "nan",
            "bad_in_row": 1,
            "skipped_updates": 1,
        }
    ]
    steps = [r for r in logged if "split" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in steps)
    assert [r.get("skipped_updates", 0) for r in steps] == [0, 0, 1, 1, 1]
    final = checkpoint.load(tmp_path / "checkpoints" / "step_00000005.pt")["progress"]
    assert final["skipped_updates"] == 1 and final["bad_in_row"] == 0


def test_max_bad_updates_in_a_row_stop_the_run_with_exit_code_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _poison_losses(monkeypatch, since=5)  # updates 5, 6, 7 ... all bad
    # max_minutes: a guard that never stops the run fails this test in a minute instead of hanging
    config = write_config(
        tmp_path / "c.yaml", max_bad_updates=3, save_every=2, max_steps=20, max_minutes=1
    )
    run = tmp_path / "run"
    code, err = cli(capsys, *train_args(config, run))
    assert code == 3, err
    assert "Traceback" not in err
    skips = [line for line in err.splitlines() if "was skipped" in line]
    assert len(skips) == 3 and "the update after step 4 was skipped: non-finite loss" in skips[0]
    stopped = err.strip().splitlines()[-1]
    assert stopped.startswith("transduce: stopped: training diverged: 3 updates in a row")
    assert str(run / "checkpoints" / "step_00000004.pt") in stopped  # the last good one
    assert [p.name for p in checkpoint.step_checkpoints(run / "checkpoints")] == [
        "step_00000002.pt",
        "step_00000004.pt",
    ]
    assert not (run / "model.pt").exists()
    state = checkpoint.load(run / "checkpoints" / "step_00000004.pt")["model"]
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize(
    "precision,stop",
    [
        ("fp32", "2 updates in a row"),  # every update after it is bad
        # the bfloat16 copy, cast before the master broke, gives finite updates: the save
        # refuses the master's NaN
        ("bf16-weights", "was not written"),
    ],
)
def test_nan_weights_are_never_written(tmp_path: Path, precision: str, stop: str) -> None:
    trainer = tiny_trainer(
        tmp_path,
        max_steps=20,
        save_every=2,
        max_bad_updates=2,
        max_minutes=1,
        precision=precision,
    )

    def break_a_weight(p: Progress) -> None:
        if p.step == 3:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(math.nan)

    trainer.callbacks = (break_a_weight,)
    with pytest.raises(Diverged, match=stop):
        trainer.train()
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path / "checkpoints")] == [
        "step_00000002.pt"
    ]
    with pytest.raises(Diverged, match="was not written"):  # nor through save() itself
        trainer.save()
    assert not (tmp_path / "checkpoints" / "step_00000003.pt").exists()
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


@pytest.mark.parametrize("clip", [0.0, 0.01])
def test_gradient_norm_is_the_total_norm_before_clipping(clip: float) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    net(torch.randn(5, 4)).pow(2).sum().backward()
    params = list(net.parameters())
    grads = [p.grad.clone() for p in params]
    want = torch.cat([g.flatten() for g in grads]).norm()
    norm = gradient_norm(params, clip)
    assert norm.item() == pytest.approx(want.item(), rel=1e-6)
    factor = min(1.0, clip / want.item()) if clip else 1.0
    for p, g in zip(params, grads, strict=True):
        torch.testing.assert_close(p.grad, g * factor, rtol=1e-4, atol=1e-7)


def test_metrics_jsonl_never_holds_a_bare_nan(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write(
        {
            "step": 1,
            "split": "valid",
            "valid_loss": math.nan,
            "bleu": math.inf,
            "valid_ppl": 2.5,
            "position_accuracy": [1.0, 0.5],
        }
    )
    assert records(tmp_path) == [
        {
            "step": 1,
            "split": "valid",
            "valid_loss": "nan",
            "bleu": "inf",
            "valid_ppl": 2.5,
            "position_accuracy": [1.0, 0.5],
        }
    ]


def test_a_run_that_diverges_before_its_first_checkpoint_is_not_told_to_resume(
    tmp_path: Path,
) -> None:
    from transduce.config import TrainConfig
    from transduce.training.guard import stop_if_diverged

    p = Progress()
    p.bad_in_row, p.step = 3, 2
    update = type("U", (), {"skipped": "non-finite loss"})()
    t = TrainConfig(max_bad_updates=3)
    with pytest.raises(Diverged, match="none yet.*start the run again") as first:
        stop_if_diverged(p, update, t, None)  # type: ignore[arg-type]
    assert "--resume" not in str(first.value)
    with pytest.raises(Diverged, match="resume with --resume --allow-change KEY"):
        stop_if_diverged(p, update, t, tmp_path / "step_00000002.pt")  # type: ignore[arg-type]


def test_out_naming_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path / "c.yaml", max_steps=2)
    (tmp_path / "afile").write_text("mine", encoding="utf-8")
    code, err = cli(capsys, *train_args(config, tmp_path / "afile"))
    assert (
        code == 2
        and err.strip()
        == f"transduce: error: {tmp_path / 'afile'}: is a file; --out names the run's folder"
    )
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "mine"

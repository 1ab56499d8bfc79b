"""A new run in a folder that holds a run is refused before it touches anything: it would mix
with the old run's checkpoints (its model.pt an average of theirs, its own last checkpoint
pruned) and overwrite the old metrics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from training_testkit import TINY

from transduce.config import from_dict, update
from transduce.errors import UserError
from transduce.training.run import train


def test_a_second_run_in_a_run_folder_is_refused(tmp_path: Path) -> None:
    cfg = update(from_dict(TINY), {"max_steps": 4, "save_every": 2})
    train(cfg, tmp_path, show_progress=False)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="already holds a run.*--resume continues it"):
        train(update(cfg, {"seed": 7, "max_steps": 3}), tmp_path, show_progress=False)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    summary = train(update(cfg, {"max_steps": 6}), tmp_path, resume=True, show_progress=False)
    assert summary["step"] == 6


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_whose_checkpoints_are_gone_is_not_replaced(tmp_path: Path, resume: bool) -> None:
    cfg = update(from_dict(TINY), {"max_steps": 2, "save_every": 2})
    train(cfg, tmp_path, show_progress=False)
    for saved in (tmp_path / "checkpoints").iterdir():  # a finished run, cleaned up
        saved.unlink()
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=r"holds a finished run's model.pt \(and no checkpoint"):
        train(cfg, tmp_path, resume=resume, show_progress=False)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    for name in ("model.pt", "model.safetensors"):  # a run killed before its first checkpoint
        (tmp_path / name).unlink(missing_ok=True)
    assert (tmp_path / "best.pt").is_file()  # (left by its first validation)
    assert train(cfg, tmp_path, show_progress=False)["step"] == 2  # starts again there


def test_the_demo_twice_in_one_folder_is_refused(tmp_path: Path) -> None:
    from transduce.demo import run_demo

    small = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8}
    overrides = {
        **small,
        "max_steps": 2,
        "save_every": 2,
        "eval_every": 0,
        "target_seq_accuracy": 0,
    }
    run_demo(tmp_path, overrides, show_progress=False)
    with pytest.raises(UserError, match="already holds a run"):
        run_demo(tmp_path, overrides, show_progress=False)


def test_a_resume_with_another_save_every_keeps_the_checkpoints_saved_before(
    tmp_path: Path, capsys
) -> None:
    """The old schedule's checkpoints were pruned as off the new one, and model.pt averaged
    fewer than average_last without a word."""
    from transduce.checkpoint import step_checkpoints

    cfg = update(from_dict(TINY), {"max_steps": 6, "save_every": 2, "average_last": 3})
    train(cfg, tmp_path, show_progress=False)
    again = update(cfg, {"max_steps": 10, "save_every": 5})
    train(again, tmp_path, resume=True, show_progress=False)
    steps = [int(p.stem.split("_")[1]) for p in step_checkpoints(tmp_path / "checkpoints")]
    assert steps[-3:] == [4, 6, 10]  # the last three averaged: 4 and 6 were kept
    assert "note: model.pt averages" not in capsys.readouterr().err
    # resumed once more with the new schedule (as after a kill): where it began is kept, so
    # the old schedule's checkpoints are not taken for a stop signal's and deleted
    train(update(again, {"max_steps": 15}), tmp_path, resume=True, show_progress=False)
    steps = [int(p.stem.split("_")[1]) for p in step_checkpoints(tmp_path / "checkpoints")]
    assert steps[-4:] == [4, 6, 10, 15]
    fewer = update(cfg, {"max_steps": 4, "save_every": 4, "average_last": 3})
    train(fewer, tmp_path / "fewer", show_progress=False)
    assert "model.pt averages 1 step checkpoint, not average_last = 3" in capsys.readouterr().err


def test_a_resume_of_another_task_is_refused_before_a_vocabulary_is_learned(
    tmp_path: Path,
) -> None:
    cfg = update(from_dict(TINY), {"max_steps": 2, "save_every": 2})
    train(cfg, tmp_path, show_progress=False)
    translation = {"name": "translation", "train_src": "a.txt", "train_tgt": "b.txt"}
    other = update(from_dict({**TINY, "task": translation}), {"max_steps": 2, "save_every": 2})
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError, match="holds a run of task"):
        train(other, tmp_path, resume=True, show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no vocabulary written


def test_compile_reduce_overhead_on_a_cpu_is_refused_before_the_run_folder(tmp_path) -> None:
    cfg = update(from_dict(TINY), {"compile": "reduce-overhead", "device": "cpu"})
    with pytest.raises(UserError, match="reduce-overhead captures CUDA graphs"):
        train(cfg, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("name", "make", "said"),
    [
        ("checkpoints", "file", "is a file; the run writes a folder there"),
        ("tensorboard", "file", "is a file; the run writes a folder there"),
        ("model.pt", "folder", "is a folder; the run writes a file there"),
        ("training_text.json", "folder", "is a folder; the run writes a file there"),
    ],
)
def test_a_run_path_of_the_wrong_kind_is_refused_before_training(
    tmp_path: Path, name: str, make: str, said: str
) -> None:
    # else the run trained to its first checkpoint, or to its end, and then said: free some space
    run = tmp_path / "run"
    run.mkdir()
    (run / name).mkdir() if make == "folder" else (run / name).write_text("x")
    cfg = update(from_dict(TINY), {"max_steps": 4, "save_every": 2})
    with pytest.raises(UserError, match=rf"{name}: {said}"):
        train(cfg, run, show_progress=False)
    assert not (run / "metrics.jsonl").exists()


def test_a_failed_write_says_free_some_space_only_for_a_full_disk() -> None:
    import errno

    from transduce.training.saving import _failure

    full = _failure(Path("/r/model.pt"), OSError(errno.ENOSPC, "No space left"), Path("/r/c"))
    other = _failure(Path("/r/model.pt"), OSError(errno.EISDIR, "Is a directory"), Path("/r/c"))
    assert "Free some space" in full and "Free some space" not in other and "Mend that" in other


def test_a_resume_names_the_checkpoint_before_a_damaged_or_model_only_newest(
    tmp_path: Path,
) -> None:
    from transduce import checkpoint
    from transduce.checkpoint.runs import average

    cfg = update(from_dict(TINY), {"max_steps": 4, "save_every": 2})
    train(cfg, tmp_path, show_progress=False)
    saved = sorted((tmp_path / "checkpoints").iterdir())
    newer = tmp_path / "checkpoints" / "step_00000005.pt"
    checkpoint.save(average(saved), newer)  # an average written among the step checkpoints
    longer = update(cfg, {"max_steps": 6})
    with pytest.raises(UserError) as refused:
        train(longer, tmp_path, resume=True, show_progress=False)
    assert str(refused.value) == (
        f"{newer} is a model file, not a training checkpoint (it holds no optimizer, progress, "
        f"rng); to resume from the one before it, {saved[-1]}, remove it"
    )
    newer.write_bytes(saved[-1].read_bytes()[:3000])  # cut short
    with pytest.raises(UserError, match=rf"to resume from the one before it, {saved[-1]}, remove"):
        train(longer, tmp_path, resume=True, show_progress=False)
    newer.unlink()
    assert train(longer, tmp_path, resume=True, show_progress=False)["step"] == 6


def test_a_model_too_large_for_memory_is_said_with_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transduce.training.fit as fit

    def no_memory(*args: object, **kwargs: object) -> None:  # the allocator's own words
        if str(torch.empty(0).device) != "meta":
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to ...")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    real = fit.build_model
    monkeypatch.setattr(fit, "build_model", no_memory)
    cfg = update(from_dict(TINY), {"d_ff": 4_000_000, "max_steps": 1})
    with pytest.raises(UserError) as said:
        train(cfg, tmp_path / "run", show_progress=False)
    m = re.match(r"the model \(([\d,]+) parameters: [\d.,]+ GiB of float32", str(said.value))
    assert m and int(m.group(1).replace(",", "")) > 2 * 16 * 4_000_000  # (its two FFN matrices)

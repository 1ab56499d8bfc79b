"""The guard and preemption on 2 gloo ranks (torchrun on the CPU): a NaN loss on one rank makes
both skip that update, and SIGTERM to one rank stops both at the same step boundary, with one
checkpoint written, exit code 143 on each."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from training_testkit import write_config

from transduce import checkpoint

RANK = """
import functools, itertools, math, os, signal, sys, torch
import transduce.training.trainer as tr
import transduce.training.updater as up
from transduce.cli.main import main
from transduce.training import run
rank, out = int(os.environ["RANK"]), sys.argv[2]
open(os.path.join(out, "pid%d" % rank), "w").write(str(os.getpid()))  # torchrun detaches ranks
calls, real = itertools.count(1), up.label_smoothed_nll
def poisoned(*args, **kwargs):  # rank 1's third batch has a NaN loss
    sums = real(*args, **kwargs)
    return sums._replace(loss=sums.loss * math.nan) if rank == 1 and next(calls) == 3 else sums
def sigterm_rank_1(p):  # SIGTERM reaches rank 1 alone, after its update 5
    if rank == 1 and p.step == 5:
        os.kill(os.getpid(), signal.SIGTERM)
preempt = tr.Trainer._preempt
def keep_state(self):  # what each rank holds when it stops, for the test
    torch.save({"model": self.model.state_dict(), "progress": vars(self.progress)},
               os.path.join(out, "rank%d.pt" % rank))
    return preempt(self)
up.label_smoothed_nll, tr.Trainer._preempt = poisoned, keep_state
run.train = functools.partial(run.train, callbacks=[sigterm_rank_1])
code = main(["--no-malloc-tuning", "train", "--config", sys.argv[1], "--out", out, "--quiet"])
open(os.path.join(out, "code%d" % rank), "w").write(str(code))
sys.exit(code)
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_ranks_skip_together_and_stop_together(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", max_steps=20, save_every=100, max_tokens=100)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSDUCE_MALLOC_TUNING": "0"}
    # Ranks that disagree wait for each other for ever: a timeout ends torchrun and each rank.
    torchrun = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            str(script),
            str(config),
            str(out),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = torchrun.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(torchrun.pid, signal.SIGKILL)
        for pid_file in out.glob("pid*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        torchrun.communicate()
        pytest.fail("the ranks did not stop together: they hang")
    done = subprocess.CompletedProcess(torchrun.args, torchrun.returncode, "", stderr)
    assert done.returncode != 0
    assert [(out / f"code{r}").read_text() for r in (0, 1)] == ["143", "143"], done.stderr[-3000:]
    assert "stopped by SIGTERM after step 6" in done.stderr  # rank 1
    assert "stopped by a signal to another process after step 6" in done.stderr  # rank 0
    assert "trainer.py" not in done.stderr  # torchrun's own traceback only (ChildFailedError)

    ranks = [torch.load(out / f"rank{r}.pt") for r in (0, 1)]
    for held in ranks:  # update 3 skipped on both: 7 updates, 6 steps
        assert held["progress"]["step"] == 6 and held["progress"]["skipped_updates"] == 1
    place = [{k: v for k, v in r["progress"].items() if k != "elapsed"} for r in ranks]
    assert place[0] == place[1]  # the same place in the data
    for key, value in ranks[0]["model"].items():
        assert torch.equal(value, ranks[1]["model"][key]), key
    assert [p.name for p in checkpoint.step_checkpoints(out / "checkpoints")] == [
        "step_00000006.pt"
    ]
    saved = checkpoint.load(out / "checkpoints" / "step_00000006.pt")
    for key, value in saved["model"].items():
        assert torch.equal(value, ranks[0]["model"][key]), key
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = [r for r in logged if r.get("split") == "skipped"]
    assert [(r["step"], r["skipped"]) for r in skipped] == [(3, "non-finite loss (nan)")]
    assert [r["step"] for r in logged if "split" not in r] == [1, 2, 3, 4, 5, 6]

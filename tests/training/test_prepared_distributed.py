"""Two gloo ranks train from a prepared folder, each reading its own batches through the memory
maps; a resumed run (on 2 ranks, or on 1 with twice the accumulation) continues exactly."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transduce.config import load_config
from transduce.data.prepare import prepare

WORDS = "the a house cat dog runs sees big small red blue green tree river".split()
CONFIG = """
model: {n_layers: 1, d_model: 32, d_ff: 64, n_heads: 2, d_k: 16, d_v: 16, dropout: 0.1}
train: {max_tokens: 200, warmup: 10, max_steps: 6, log_every: 1, save_every: 3, eval_every: 0,
        keep_last: 3, tensorboard: false, device: cpu, update_freq: FREQ, max_len: 30}
task: {name: translation, prepared: PREPARED, vocab_size: 50}
decode: {beam: 1}
"""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TRANSDUCE_MALLOC_TUNING": "0"}


def _losses(run: Path) -> list[float]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and r.get("split") != "valid"]


def _train(cfg: Path, out: Path, ranks: int, *extra: str) -> subprocess.CompletedProcess:
    launcher = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(ranks),
            "--standalone",
            "-m",
            "transduce",
        ]
        if ranks > 1
        else [sys.executable, "-m", "transduce"]
    )
    return subprocess.run(
        [*launcher, "train", "--config", str(cfg), "--out", str(out), "--quiet", *extra],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_ranks_from_a_prepared_folder_resume_exactly(tmp_path: Path) -> None:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(400)]
    (tmp_path / "train.src").write_text("\n".join(lines) + "\n")
    (tmp_path / "train.tgt").write_text("\n".join(x.upper() for x in lines) + "\n")
    files = CONFIG.replace(
        "prepared: PREPARED",
        f"train_src: {tmp_path / 'train.src'}, train_tgt: {tmp_path / 'train.tgt'}",
    ).replace("FREQ", "1")
    (tmp_path / "files.yaml").write_text(files)
    prepare(
        load_config(tmp_path / "files.yaml"),
        tmp_path / "p",
        workers=1,
        shard_pairs=150,
        show_progress=False,
        log=lambda _: None,
    )
    for name, freq in (("ddp", 1), ("single", 2)):
        (tmp_path / f"{name}.yaml").write_text(
            CONFIG.replace("PREPARED", str(tmp_path / "p")).replace("FREQ", str(freq))
        )

    full = _train(tmp_path / "ddp.yaml", tmp_path / "full", 2)
    assert full.returncode == 0, full.stderr[-3000:]
    assert (
        "on 2 process(es)" in full.stderr
        and "prepared pairs (uint16 ids, 3 shard(s))" in full.stderr
    )
    losses = _losses(tmp_path / "full")
    assert len(losses) == 6 and losses[0] != pytest.approx(losses[-1], rel=1e-3)

    for ranks, cfg in ((2, "ddp.yaml"), (1, "single.yaml")):
        cut = tmp_path / f"cut{ranks}"
        shutil.copytree(tmp_path / "full", cut)
        (cut / "checkpoints" / "step_00000006.pt").unlink()
        (cut / "model.pt").unlink()
        resumed = _train(tmp_path / cfg, cut, ranks, "--resume")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        if ranks == 2:  # weights, Adam, every rank's random state and the data position
            assert _losses(cut) == pytest.approx(losses, rel=1e-5)
        else:  # the data position carries over to another world size (each rank drew its own
            # dropout masks, which one process cannot replay: tests/training/test_distributed.py
            # checks the losses of such a move without dropout)
            assert "resuming a run of 2 process(es) on 1: epoch 0 continues at batch 6" in (
                resumed.stderr
            )
            assert len(_losses(cut)) == 6 and _losses(cut)[:3] == losses[:3]

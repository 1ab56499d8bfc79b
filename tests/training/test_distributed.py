"""Distributed training: torchrun with 2 CPU processes (gloo) against one process.

Two ranks with update_freq 1 must take the same steps as one process with update_freq 2: the same
batches, the loss normalised by the tokens of both, so the logged losses agree to float rounding
and every rank ends with the same parameters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transduce.errors import UserError
from transduce.training.distributed import World, init_from_env, shard

# precision fp32: auto gives one process and torchrun different numerics where bfloat16 is
# native (bf16-weights against bf16 autocast), and these runs are compared number for number
CONFIG = """
model: {n_layers: 1, d_model: 32, d_ff: 64, n_heads: 2, d_k: 16, d_v: 16, dropout: 0.0}
train: {max_tokens: 200, warmup: 20, max_steps: 8, log_every: 1, save_every: 4, eval_every: 0,
        keep_last: 2, label_smoothing: 0.1, tensorboard: false, update_freq: UPDATE_FREQ,
        precision: fp32}
task: {name: copy, train_size: 1500, valid_size: 20, max_length: 6, n_symbols: 6}
decode: {beam: 1}
"""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TRANSDUCE_MALLOC_TUNING": "0"}


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a process of its own (one OpenMP thread, no malloc tuning), its output kept."""
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)


def _losses(run: Path) -> list[float]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and r.get("split") != "valid"]


def _rank_script(path: Path, patches: str = "") -> Path:
    """A torchrun script at ``path`` that trains ``argv[1]`` into ``argv[2]`` and leaves each
    rank's parameters there (rank0.pt, rank1.pt), after the Python lines ``patches``."""
    path.write_text(
        "import os, sys, torch\n"
        "import transduce.training.trainer as tr\n"
        "from transduce.cli.main import main\n"
        "finish = tr.Trainer._finish\n"
        "def keep_params(self, *args):  # each rank leaves its parameters for the test\n"
        "    out = finish(self, *args)\n"
        "    torch.save(self.model.state_dict(),\n"
        "               os.path.join(sys.argv[2], 'rank%d.pt' % self.world.rank))\n"
        "    return out\n"
        "tr.Trainer._finish = keep_params\n"
        + patches
        + "sys.exit(main(['train', '--config', sys.argv[1], '--out', sys.argv[2], '--quiet']))\n"
    )
    return path


def test_shard_gives_disjoint_equal_shares() -> None:
    batches = list(range(11))
    shares = [shard(batches, World(rank=r, size=3)) for r in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    assert sorted(sum(shares, [])) == list(range(9))
    assert shard(batches, World()) == batches


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_ranks_match_one_process_with_twice_the_accumulation(tmp_path: Path) -> None:
    for name, freq in (("ddp", 1), ("single", 2)):
        (tmp_path / f"{name}.yaml").write_text(CONFIG.replace("UPDATE_FREQ", str(freq)))
    script = _rank_script(tmp_path / "rank.py")
    ddp = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            str(script),
            str(tmp_path / "ddp.yaml"),
            str(tmp_path / "ddp"),
        ],
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "on 2 process(es)" in ddp.stderr and "x 2 = 400 tokens per update" in ddp.stderr
    single = _run(
        [
            sys.executable,
            "-m",
            "transduce",
            "train",
            "--config",
            str(tmp_path / "single.yaml"),
            "--out",
            str(tmp_path / "single"),
            "--quiet",
        ],
    )
    assert single.returncode == 0, single.stderr[-3000:]

    ddp_losses, single_losses = _losses(tmp_path / "ddp"), _losses(tmp_path / "single")
    assert len(ddp_losses) == len(single_losses) == 8
    assert ddp_losses == pytest.approx(single_losses, rel=1e-5)
    assert ddp_losses[0] != pytest.approx(ddp_losses[-1], rel=1e-3)  # it trained

    rank0 = torch.load(tmp_path / "ddp" / "rank0.pt")
    rank1 = torch.load(tmp_path / "ddp" / "rank1.pt")
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    final = torch.load(tmp_path / "single" / "model.pt", weights_only=True)["model"]
    for key in rank0:
        torch.testing.assert_close(rank0[key], final[key], rtol=1e-4, atol=1e-5)
    # Only rank 0 wrote the run folder's files, once.
    assert sorted(p.name for p in (tmp_path / "ddp" / "checkpoints").iterdir()) == [
        "step_00000004.pt",
        "step_00000008.pt",
    ]

    # The 2-rank run's step-4 checkpoint resumed by one process (update_freq 2: the same tokens
    # per update) goes on with the batches the two ranks would have taken: the same losses.
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "ddp", moved)
    (moved / "checkpoints" / "step_00000008.pt").unlink()
    (moved / "model.pt").unlink()
    resumed = _run(
        [
            sys.executable,
            "-m",
            "transduce",
            "train",
            "--config",
            str(tmp_path / "single.yaml"),
            "--out",
            str(moved),
            "--resume",
            "--quiet",
        ],
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming a run of 2 process(es) on 1: epoch 0 continues at batch 8" in resumed.stderr
    assert _losses(moved) == pytest.approx(single_losses, rel=1e-5)


RECORDING_RANK = f"""
import os, sys
from typing import Any
sys.path.insert(0, {str(Path(__file__).parent)!r})
import transduce.checkpoint.files as ck  # where save() finds save_atomic
import transduce.training.metrics_log as ml
from killed_run import main
rank = os.environ["RANK"]
def note(what: str) -> None:  # which rank wrote what, for the test
    with open(os.path.join(sys.argv[3], "writes_rank" + rank), "a") as f:
        f.write(what + "\\n")
save_atomic, write = ck.save_atomic, ml.MetricsLog.write
def noted_save(obj: Any, path: Any) -> None:
    note("checkpoint")
    save_atomic(obj, path)
def noted_write(self: ml.MetricsLog, record: dict) -> None:
    note("metrics")
    write(self, record)
ck.save_atomic, ml.MetricsLog.write = noted_save, noted_write
sys.exit(main([sys.argv[1], sys.argv[2], *sys.argv[4:]]))
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_killed_two_rank_run_resumes_to_the_same_losses(tmp_path: Path) -> None:
    # With dropout each rank draws its own masks, so the same losses after a resume need every
    # rank's random state back, besides the weights, Adam's state and the place in the epoch.
    config = CONFIG.replace("UPDATE_FREQ", "1").replace("dropout: 0.0", "dropout: 0.1")
    (tmp_path / "run.yaml").write_text(config)
    script = tmp_path / "rank.py"
    script.write_text(RECORDING_RANK)

    def torchrun(out: str, *extra: str) -> subprocess.CompletedProcess:
        env = _env()
        (tmp_path / out).mkdir(exist_ok=True)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "--standalone",
                str(script),
                str(tmp_path / "run.yaml"),
                str(tmp_path / out),
                str(tmp_path / out),
                *extra,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    straight = torchrun("straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    died = torchrun("killed", "--die-at-step", "6")  # after the step-4 checkpoint
    assert died.returncode != 0
    assert max(json.loads(x)["step"] for x in (tmp_path / "killed" / "metrics.jsonl").open()) == 6
    resumed = torchrun("killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    want, got = _losses(tmp_path / "straight"), _losses(tmp_path / "killed")
    assert len(want) == len(got) == 8  # steps 5 and 6 logged once, by the resumed run
    assert got == pytest.approx(want, rel=1e-6)
    final_a = torch.load(tmp_path / "straight" / "model.pt", weights_only=True)["model"]
    final_b = torch.load(tmp_path / "killed" / "model.pt", weights_only=True)["model"]
    for key in final_a:
        torch.testing.assert_close(final_a[key], final_b[key], rtol=1e-6, atol=1e-7)
    # Rank 0 wrote every checkpoint and metrics line; rank 1 wrote nothing.
    for run in ("straight", "killed"):
        assert not (tmp_path / run / "writes_rank1").exists()
        writes = (tmp_path / run / "writes_rank0").read_text().split()
        assert "checkpoint" in writes and "metrics" in writes


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_translation_vocabulary_learned_by_rank_0_only(tmp_path: Path) -> None:
    # Every rank reads the corpus; rank 0 alone learns and writes the vocabulary and reports,
    # and the other rank trains with rank 0's vocabulary.
    words = "the a dog cat man runs sits on in red blue park".split()
    src = [" ".join(words[(i * 7 + k) % len(words)] for k in range(1 + i % 5)) for i in range(120)]
    (tmp_path / "train.src").write_text("".join(s + "\n" for s in src))
    (tmp_path / "train.tgt").write_text("".join(s.upper() + "\n" for s in src))
    (tmp_path / "run.yaml").write_text(
        "model: {n_layers: 1, d_model: 32, d_ff: 64, n_heads: 2, d_k: 16, d_v: 16}\n"
        "train: {max_tokens: 300, warmup: 5, max_steps: 2, save_every: 2, eval_every: 0,"
        " keep_last: 1, average_last: 1, tensorboard: false}\n"
        f"task: {{name: translation, train_src: {tmp_path / 'train.src'},"
        f" train_tgt: {tmp_path / 'train.tgt'}, vocab_size: 50}}\n"
    )
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys\n"
        "import transduce.training.trainer as tr\n"
        "from transduce.cli.main import main\n"
        "finish = tr.Trainer._finish\n"
        "def keep_vocab(self, *args):  # each rank leaves the vocabulary it trained with\n"
        "    out = finish(self, *args)\n"
        "    with open(os.path.join(sys.argv[2], 'vocab%d' % self.world.rank), 'wb') as f:\n"
        "        f.write(self.vocab.model_proto)\n"
        "    return out\n"
        "tr.Trainer._finish = keep_vocab\n"
        "sys.exit(main(['train', '--config', sys.argv[1], '--out', sys.argv[2], '--quiet']))\n"
    )
    out = tmp_path / "run"
    ddp = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            str(script),
            str(tmp_path / "run.yaml"),
            str(out),
        ],
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stderr.count("transduce: vocabulary: 50 shared BPE pieces") == 1, ddp.stderr
    assert ddp.stderr.count("transduce: train: 120 sentence pairs") == 1, ddp.stderr
    learned = (out / "vocab.model").read_bytes()
    assert (out / "vocab0").read_bytes() == (out / "vocab1").read_bytes() == learned
    assert not list(out.glob("*.tmp"))


def test_training_checks_its_device() -> None:
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            init_from_env("cuda")
    with pytest.raises(UserError, match="unknown device"):
        init_from_env("toaster")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_bf16_weights_on_two_ranks_match_one_process(tmp_path: Path) -> None:
    """precision bf16-weights under torchrun: no DDP (it would all-reduce the bfloat16 copy's
    gradients); rank 0's weights are broadcast, then the float32 gradients averaged over the
    ranks each update. Two ranks take one process's steps with update_freq 2."""
    config = CONFIG.replace("max_steps: 8", "max_steps: 6").replace("fp32", "bf16-weights")
    for name, freq in (("ranks", 1), ("single", 2)):
        (tmp_path / f"{name}.yaml").write_text(config.replace("UPDATE_FREQ", str(freq)))
    patches = (
        "import transduce.training.distributed as d\n"
        "broadcast = d.broadcast_parameters\n"
        "def unequal_first(model, world):  # rank 1 starts elsewhere until rank 0's weights come\n"
        "    if world.rank == 1:\n"
        "        with torch.no_grad():\n"
        "            for p in model.parameters():\n"
        "                p.add_(0.1)\n"
        "    broadcast(model, world)\n"
        "d.broadcast_parameters = unequal_first\n"
        "def no_ddp(model, world):  # bf16-weights averages its float32 gradients itself\n"
        "    raise AssertionError('DDP wrapped a bf16-weights run')\n"
        "d.wrap = no_ddp\n"
    )
    script = _rank_script(tmp_path / "rank.py", patches)
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    ranks = _run(
        [*run, str(script), str(tmp_path / "ranks.yaml"), str(tmp_path / "ranks")],
    )
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    assert "on 2 process(es), device cpu, precision bf16-weights" in ranks.stderr
    single = _run(
        [sys.executable, "-m", "transduce", "train", "--config", str(tmp_path / "single.yaml")]
        + ["--out", str(tmp_path / "single"), "--quiet"],
    )
    assert single.returncode == 0, single.stderr[-3000:]
    got, want = _losses(tmp_path / "ranks"), _losses(tmp_path / "single")
    assert len(got) == len(want) == 6 and got == pytest.approx(want, rel=1e-5)
    assert got[0] != pytest.approx(got[-1], rel=1e-3)  # it trained
    rank0, rank1 = (torch.load(tmp_path / "ranks" / f"rank{r}.pt") for r in (0, 1))
    final = torch.load(tmp_path / "single" / "model.pt", weights_only=True)["model"]
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
        torch.testing.assert_close(rank0[key], final[key], rtol=1e-4, atol=1e-5)


def test_an_epoch_with_fewer_batches_than_processes_is_refused() -> None:
    """Every rank's share would be empty: epochs without an update, for ever."""
    from transduce.config import TrainConfig
    from transduce.training.feed import BatchFeed

    pairs = [([5, 6, 7], [8, 9])] * 10  # one batch of max_tokens 1000
    t = TrainConfig(max_tokens=1000)
    one = BatchFeed(pairs, t, World())
    assert len(one.epoch(0, torch.device("cpu")).batches) == 1
    for rank in range(2):
        feed = BatchFeed(pairs, t, World(rank=rank, size=2))
        with pytest.raises(UserError, match="epoch 0 has 1 batch of max_tokens=1000 for 2 proc"):
            feed.epoch(0, torch.device("cpu"))


def test_batches_left_out_for_equal_shares_are_said_once_on_rank_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """3 processes trained 982 of 1000 pairs an epoch, with no word of the 18 left out."""
    from transduce.config import TrainConfig
    from transduce.training.feed import BatchFeed

    pairs = [([5] * (3 + i % 7), [6] * (2 + i % 5)) for i in range(1000)]
    t = TrainConfig(max_tokens=100, max_len=40)
    notes: list[list[str]] = [[], [], []]
    feeds = [BatchFeed(pairs, t, World(rank=r, size=3), note=notes[r].append) for r in range(3)]
    cpu = torch.device("cpu")
    for epoch in range(3):
        shares = []
        for feed in feeds:
            with feed.epoch(epoch, cpu) as reader:
                shares.append(reader.batches)
        trained = sum(len(b) for share in shares for b in share)
        assert len({len(share) for share in shares}) == 1 and trained < len(pairs)
        if epoch == 0:
            with BatchFeed(pairs, t, World()).epoch(0, cpu) as one:
                every = one.batches
            left, left_pairs = len(every) % 3, len(pairs) - trained
    assert notes[1] == notes[2] == []
    plural = "es" * (left != 1)
    assert notes[0] == [
        f"epoch 0: {left} batch{plural} ({left_pairs} pairs) of {len(every)} left out so that "
        "3 processes take equal shares; each epoch's shuffle leaves out others"
    ]
    with BatchFeed(pairs, t, World(rank=0, size=3)).epoch(0, cpu):
        pass
    assert f"({left_pairs} pairs) of" in capsys.readouterr().err  # the default: stderr

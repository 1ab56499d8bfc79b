"""The training loop on a tiny copy-task model: kill and resume, gradient accumulation, stopping
rules, the files a run leaves, and learning the copy task outright."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from training_testkit import records, train_losses

from transduce import checkpoint
from transduce.config import Config, update
from transduce.data.batching import collate, model_lengths, token_batches
from transduce.data.synthetic import make_task
from transduce.data.vocab import PAD
from transduce.errors import UserError
from transduce.model.transformer import make_model
from transduce.training import trainer as trainer_module
from transduce.training import updater as updater_module
from transduce.training.loss import label_smoothed_nll
from transduce.training.precision import native_bf16, resolve_precision
from transduce.training.run import train_synthetic
from transduce.training.schedule import rate
from transduce.training.tasks.synthetic import encode_pairs
from transduce.training.trainer import Trainer

TINY: dict[str, Any] = {
    "model": {
        "n_layers": 1,
        "d_model": 32,
        "d_ff": 64,
        "n_heads": 2,
        "d_k": 16,
        "d_v": 16,
        "dropout": 0.1,
    },
    "train": {
        "max_tokens": 256,
        "warmup": 50,
        "max_steps": 40,
        "save_every": 10,
        "log_every": 1,
        "eval_every": 0,
        "keep_last": 5,
        "tensorboard": False,
    },
    "task": {"name": "copy", "train_size": 500, "valid_size": 50, "max_length": 6, "n_symbols": 6},
    "decode": {"beam": 1},
}


def _cfg(**values: Any) -> Config:
    flat = {k: v for section in TINY.values() for k, v in section.items()}
    return update(Config(), {**flat, **values})


def _trainer(run_dir: Path, cfg: Config, **kwargs: Any) -> Trainer:
    task = make_task(cfg.task)
    torch.manual_seed(cfg.train.seed)
    model = make_model(cfg.model, src_vocab_size=len(task.vocab))
    kwargs.setdefault("valid_pairs", encode_pairs(task.vocab, task.valid))
    return Trainer(
        cfg,
        model,
        task.vocab,
        encode_pairs(task.vocab, task.train),
        run_dir=run_dir,
        show_progress=False,
        **kwargs,
    )


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> bool:
    return a.keys() == b.keys() and all(
        torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=atol) for k in a
    )


# --- kill and resume --------------------------------------------------------------------------


def _run(config: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """tests/training/killed_run.py in a process of its own (``--die-at-step N`` kills it)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # 2 shared cores
    script = Path(__file__).with_name("killed_run.py")
    return subprocess.run(
        [sys.executable, str(script), str(config), str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_killed_run_resumes_to_the_same_losses(tmp_path: Path) -> None:
    config = copy.deepcopy(TINY)
    config["train"]["eval_every"] = 20  # validation lines must not be duplicated either
    cfg_file = tmp_path / "tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(config))
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    # The uninterrupted reference runs in a process of its own too: in this one, what earlier
    # tests left (the thread count `serve --threads` sets, say) would change its last bits.
    done = _run(cfg_file, straight)
    assert done.returncode == 0, done.stderr

    died = _run(cfg_file, killed, "--die-at-step", "25")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert [p.name for p in checkpoint.step_checkpoints(killed / "checkpoints")] == [
        "step_00000010.pt",
        "step_00000020.pt",
    ]
    assert max(r["step"] for r in records(killed)) == 25  # steps 21..25 will be redone
    assert not (killed / "model.pt").exists()

    resumed = _run(cfg_file, killed, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["step"] == 40 and summary["stopped_by"] == "max_steps"

    want, got = train_losses(straight), train_losses(killed)
    assert [s for s, _ in got] == list(range(1, 41))  # each step exactly once
    assert [s for s, _ in want] == list(range(1, 41))
    for (step, a), (_, b) in zip(want, got):
        assert a == pytest.approx(b, abs=1e-6), f"step {step}: {a} != {b}"
    valid_steps = [r["step"] for r in records(killed) if r.get("split") == "valid"]
    assert valid_steps == [20, 40]
    final_a = checkpoint.load(straight / "model.pt")["model"]
    final_b = checkpoint.load(killed / "model.pt")["model"]
    assert _same_state(final_a, final_b, atol=1e-6)
    leftovers = [p.name for p in (killed / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_resume_without_checkpoints_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 99, "loss": 1.0}\n')
    trainer = _trainer(tmp_path, _cfg(max_steps=3, dropout=0.0), resume=True)
    assert trainer.progress.step == 0
    summary = trainer.train()
    assert summary["step"] == 3
    steps = [r for r in records(tmp_path) if "loss" in r and "split" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # the share of training time spent waiting for batches (read ahead on a thread)
    assert all(0.0 <= r["data_share"] <= 1.0 for r in steps)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])  # one optimizer parameter group, two
def test_resume_in_process_continues_from_last_checkpoint(
    tmp_path: Path, weight_decay: float
) -> None:
    straight = _trainer(tmp_path / "a", _cfg(max_steps=12, save_every=4, weight_decay=weight_decay))
    straight.train()
    first = _trainer(tmp_path / "b", _cfg(max_steps=6, save_every=4, weight_decay=weight_decay))
    first.train()  # leaves step 4 and (final) step 6 checkpoints
    cfg = _cfg(max_steps=12, save_every=4, weight_decay=weight_decay)
    second = _trainer(tmp_path / "b", cfg, resume=True)
    assert len(second.optimizer.param_groups) == (2 if weight_decay else 1)
    assert second.progress.step == 6
    second.train()
    want, got = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert [s for s, _ in want] == [s for s, _ in got] == list(range(1, 13))
    assert [x for _, x in got] == pytest.approx([x for _, x in want], abs=1e-6)
    assert _same_state(straight.model.state_dict(), second.model.state_dict(), atol=1e-6)


# --- training pairs drawn anew every epoch (BPE-dropout's hook) -------------------------------


def _epoch_pairs(calls: list[int] | None = None):  # noqa: ANN202 - a Resegment
    """100 of the copy task's pairs per epoch, a different 100 each epoch (5 in turn)."""
    task = make_task(_cfg().task)
    base = encode_pairs(task.vocab, task.train)

    def pairs(epoch: int) -> list[tuple[list[int], list[int]]]:
        if calls is not None:
            calls.append(epoch)
        return [p for i, p in enumerate(base) if i % 5 == epoch % 5]

    return pairs


def test_resegment_gives_each_epoch_its_own_pairs(tmp_path: Path) -> None:
    calls: list[int] = []
    trainer = _trainer(
        tmp_path, _cfg(max_steps=10_000, max_epochs=3), resegment=_epoch_pairs(calls)
    )
    pairs = _epoch_pairs()
    batches = [len(token_batches(model_lengths(pairs(e)), 256, seed=1, epoch=e)) for e in range(3)]
    summary = trainer.train()
    assert calls == [0, 1, 2]  # once per epoch, not once per batch
    assert summary["step"] == sum(batches) and summary["stopped_by"] == "max_epochs"
    assert list(trainer.feed.pairs) == pairs(2)
    assert trainer.feed.n_filtered == 0  # decided by train_pairs, not by an epoch's pairs


def test_resegment_with_several_processes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SentencePiece's BPE-dropout draws differently in each process: ranks would disagree
    two = trainer_module.distributed.World(rank=0, size=2)
    monkeypatch.setattr(
        trainer_module.distributed, "init_from_env", lambda device: (two, torch.device("cpu"))
    )
    with pytest.raises(UserError, match="bpe_dropout with 2 processes"):
        _trainer(tmp_path, _cfg(), resegment=_epoch_pairs())


def test_resume_mid_epoch_in_another_process_goes_on_with_the_saved_draw(tmp_path: Path) -> None:
    # SentencePiece draws otherwise in another process: a resegment that gives the resumed
    # epoch other pairs stands for it. The checkpoint's draw keeps that epoch's batches exact.
    cfg = _cfg(max_steps=12, save_every=5)
    straight = _trainer(tmp_path / "a", cfg, resegment=_epoch_pairs())
    straight.train()
    _trainer(tmp_path / "b", _cfg(max_steps=5, save_every=5), resegment=_epoch_pairs()).train()
    saved = torch.load(checkpoint.step_path(tmp_path / "b" / "checkpoints", 5), weights_only=True)
    resumed_epoch = saved["progress"]["epoch"]
    assert saved["drawn"]["epoch"] == resumed_epoch
    same, calls = _epoch_pairs(), list[int]()

    def another_process(epoch: int) -> list[tuple[list[int], list[int]]]:
        calls.append(epoch)
        return same(epoch + 1 if epoch == resumed_epoch else epoch)

    second = _trainer(tmp_path / "b", cfg, resume=True, resegment=another_process)
    assert second.progress.step == 5 and second.progress.batch_index > 0  # mid-epoch
    second.train()
    assert resumed_epoch not in calls  # that epoch's pairs came from the checkpoint
    want, got = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert [s for s, _ in want] == [s for s, _ in got] == list(range(1, 13))
    assert [x for _, x in got] == pytest.approx([x for _, x in want], abs=1e-6)
    assert _same_state(straight.model.state_dict(), second.model.state_dict(), atol=1e-6)


def test_a_damaged_draw_in_a_checkpoint_is_refused_naming_it(tmp_path: Path) -> None:
    _trainer(tmp_path, _cfg(max_steps=5, save_every=5), resegment=_epoch_pairs()).train()
    path = checkpoint.step_path(tmp_path / "checkpoints", 5)
    state = torch.load(path, weights_only=True)
    state["drawn"]["src_starts"] = state["drawn"]["src_starts"][:-1]  # a pair fewer
    torch.save(state, path)
    with pytest.raises(
        UserError, match="step_00000005.pt: its draw of the training pairs is damaged"
    ):
        _trainer(tmp_path, _cfg(max_steps=8), resume=True, resegment=_epoch_pairs())


# --- gradient accumulation --------------------------------------------------------------------


def test_accumulated_group_equals_one_concatenated_batch(tmp_path: Path) -> None:
    # adam_eps 1e-3: the attention key biases have a true gradient of exactly 0 (softmax is
    # shift-invariant), and Adam's first step, lr * g / (|g| + eps), would turn their float noise
    # (~1e-9) into steps of up to lr with eps 1e-9 (or ~1e-6 with eps 1e-6).
    # float32: the two groupings round differently in bfloat16, and the reference is float32
    cfg = _cfg(dropout=0.0, label_smoothing=0.1, adam_eps=1e-3, precision="fp32")
    a = _trainer(tmp_path / "a", cfg)
    b = _trainer(tmp_path / "b", cfg)
    b.model.load_state_dict(a.model.state_dict())
    short = [p for p in a.feed.pairs if len(p[0]) <= 2][:7]
    long = [p for p in a.feed.pairs if len(p[0]) >= 5][:13]
    first, second = short, long + short[:3]  # the two batches pad to different widths
    assert collate(first).src.shape[1] < collate(first + second).src.shape[1]
    joined = collate(first + second)

    # The reference: the loss of the joined batch, normalised by its tokens.
    ref_model = copy.deepcopy(a.model).train()
    sums = label_smoothed_nll(
        ref_model(joined.src, joined.tgt_in), joined.tgt_out, epsilon=0.1, ignore_index=PAD
    )
    (sums.loss / sums.n_tokens).backward()
    ref_grads = {n: p.grad.clone() for n, p in ref_model.named_parameters()}

    grads: dict[str, dict[str, torch.Tensor]] = {}
    for name, trainer in (("a", a), ("b", b)):
        step = trainer.optimizer.step

        def capture(*args: Any, _name: str = name, _t: Trainer = trainer, _step=step, **kw: Any):
            grads[_name] = {n: p.grad.clone() for n, p in _t.model.named_parameters()}
            return _step(*args, **kw)

        trainer.optimizer.step = capture  # type: ignore[method-assign]

    ua, ub = a._update([collate(first), collate(second)]), b._update([joined])
    loss_a, nll_a, n_a = ua.loss, ua.nll, ua.tokens
    loss_b, nll_b, n_b = ub.loss, ub.nll, ub.tokens
    # the gradient norm (before any clipping) is that of the reference's gradients
    ref_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in ref_grads.values()]))
    assert ua.grad_norm == pytest.approx(ref_norm.item(), rel=1e-5)
    assert ua.skipped is None and ub.skipped is None
    assert n_a == n_b == joined.n_tokens == sums.n_tokens
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert loss_b == pytest.approx(sums.loss.item() / sums.n_tokens, rel=1e-6)
    assert nll_a == pytest.approx(nll_b, rel=1e-6)
    for n in ref_grads:
        torch.testing.assert_close(grads["a"][n], ref_grads[n], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(grads["b"][n], ref_grads[n], rtol=1e-5, atol=1e-7)
    assert _same_state(a.model.state_dict(), b.model.state_dict(), atol=1e-6)


def test_pad_multiple_pads_the_batches_read_and_leaves_the_update(tmp_path: Path) -> None:
    cfg = _cfg(dropout=0.0, adam_eps=1e-3, precision="fp32", pad_multiple=8)
    a = _trainer(tmp_path / "a", cfg)
    b = _trainer(tmp_path / "b", update(cfg, {"pad_multiple": 1}))
    b.model.load_state_dict(a.model.state_dict())
    with a.feed.epoch(0, a.device) as epoch:
        batches, group = epoch.batches, epoch.read(0)
    assert all(t.shape[1] % 8 == 0 for batch in group for t in batch[:3])
    plain = [collate([a.feed.pairs[i] for i in batches[0].tolist()])]
    assert plain[0].src.shape[1] % 8 or plain[0].tgt_in.shape[1] % 8  # padding was added
    ua, ub = a._update(group), b._update(plain)
    assert ua.tokens == ub.tokens and ua.loss == pytest.approx(ub.loss, rel=1e-6)
    assert _same_state(a.model.state_dict(), b.model.state_dict(), atol=1e-6)


def test_update_freq_groups_batches(tmp_path: Path) -> None:
    one = _trainer(tmp_path / "one", _cfg(max_epochs=1, max_steps=10_000, dropout=0.0))
    two = _trainer(
        tmp_path / "two", _cfg(max_epochs=1, max_steps=10_000, dropout=0.0, update_freq=2)
    )
    n_batches = len(token_batches(one.feed.lengths, 256, seed=1, epoch=0))
    assert one.train()["step"] == n_batches
    assert two.train()["step"] == (n_batches + 1) // 2


# --- stopping rules and run files -------------------------------------------------------------


def test_max_steps(tmp_path: Path) -> None:
    summary = _trainer(tmp_path, _cfg(max_steps=7)).train()
    assert summary["stopped_by"] == "max_steps" and summary["step"] == 7
    assert (tmp_path / "model.pt").exists()
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path / "checkpoints")] == [
        "step_00000007.pt"
    ]  # the final state is always saved for --resume
    losses = train_losses(tmp_path)
    assert [s for s, _ in losses] == list(range(1, 8))
    data = checkpoint.load(tmp_path / "checkpoints" / "step_00000007.pt")
    assert data["progress"]["step"] == 7


def test_max_epochs(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(max_steps=10_000, max_epochs=2))
    expected = sum(len(token_batches(trainer.feed.lengths, 256, seed=1, epoch=e)) for e in (0, 1))
    summary = trainer.train()
    assert summary["stopped_by"] == "max_epochs"
    assert summary["step"] == expected and summary["epoch"] == 2
    assert (tmp_path / "model.pt").exists()
    epochs = {r["epoch"] for r in records(tmp_path) if "loss" in r and r.get("split") != "valid"}
    assert epochs == {0, 1}


def test_max_minutes(tmp_path: Path) -> None:
    summary = _trainer(tmp_path, _cfg(max_steps=10_000, max_minutes=0.02)).train()  # 1.2 s
    assert summary["stopped_by"] == "max_minutes"
    assert 0 < summary["step"] < 10_000
    assert summary["seconds"] >= 1.0
    assert (tmp_path / "model.pt").exists()


def _lrs(run_dir: Path) -> list[float]:
    return [r["lr"] for r in records(run_dir) if "lr" in r]


def test_cooldown_over_steps(tmp_path: Path) -> None:
    _trainer(tmp_path, _cfg(max_steps=40, warmup=5, cooldown=0.5)).train()
    lrs = _lrs(tmp_path)
    plain = [rate(s, d_model=32, warmup=5) for s in range(1, 41)]
    # Update s (1-based) happens after s - 1 of 40 steps: multiplier min(1, (1 - (s-1)/40) / 0.5).
    expected = [lr * min(1.0, (1 - (s - 1) / 40) / 0.5) for s, lr in enumerate(plain, start=1)]
    assert lrs == pytest.approx(expected, rel=1e-9)
    assert lrs[19] == pytest.approx(plain[19]) and lrs[-1] == pytest.approx(0.05 * plain[-1])


def test_cooldown_over_minutes(tmp_path: Path) -> None:
    summary = _trainer(
        tmp_path, _cfg(max_steps=100_000, max_minutes=0.03, warmup=1, cooldown=0.5)
    ).train()
    assert summary["stopped_by"] == "max_minutes"
    logged = [r for r in records(tmp_path) if "lr" in r]
    plain = [rate(r["step"], d_model=32, warmup=1) for r in logged]
    ratios = [r["lr"] / p for r, p in zip(logged, plain)]
    budget = 0.03 * 60
    for r, ratio in zip(logged, ratios):
        # The multiplier follows the clock: 1 in the first half, then down to ~0 at the end.
        if r["elapsed"] < 0.4 * budget:
            assert ratio == pytest.approx(1.0)
        assert ratio <= min(1.0, (1 - (r["elapsed"] - 0.2) / budget) / 0.5) + 1e-9
    assert ratios[-1] < 0.25


def test_model_pt_is_final_model(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(max_steps=5))
    trainer.train()
    model, vocab, cfg = checkpoint.load_model(tmp_path / "model.pt")
    assert _same_state(model.state_dict(), trainer.model.state_dict())
    assert cfg == trainer.cfg and vocab.to_dict() == trainer.vocab.to_dict()


def test_average_last(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(max_steps=20, save_every=5, keep_last=3, average_last=3))
    trainer.train()
    found = checkpoint.step_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in found] == ["step_00000010.pt", "step_00000015.pt", "step_00000020.pt"]
    states = [checkpoint.load(p)["model"] for p in found]
    final = checkpoint.load(tmp_path / "model.pt")["model"]
    for k, v in final.items():
        expected = sum(s[k].double() for s in states) / 3
        torch.testing.assert_close(v, expected.to(v.dtype), rtol=0, atol=1e-7)
    assert not _same_state(final, trainer.model.state_dict(), atol=1e-5)
    checkpoint.load_model(tmp_path / "model.pt")


def test_keep_last_prunes(tmp_path: Path) -> None:
    _trainer(tmp_path, _cfg(max_steps=9, save_every=2, keep_last=2)).train()
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path / "checkpoints")] == [
        "step_00000008.pt",
        "step_00000009.pt",
    ]


class Scripted:
    """A validator that returns scripted scores and remembers the model it was shown."""

    def __init__(self, scores: list[float], key: str = "score") -> None:
        self.scores, self.key, self.seen = list(scores), key, []

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        assert not model.training
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {self.key: self.scores[len(self.seen) - 1]}


def test_best_pt_follows_validation(tmp_path: Path) -> None:
    scripted = Scripted([0.1, 0.5, 0.3, 0.4, 0.2])
    trainer = _trainer(
        tmp_path, _cfg(max_steps=10, eval_every=2), validator=scripted, score_key="score"
    )
    summary = trainer.train()
    assert len(scripted.seen) == 5 and summary["score"] == 0.2
    best = checkpoint.load(tmp_path / "best.pt")
    assert _same_state(best["model"], scripted.seen[1])
    assert not _same_state(best["model"], scripted.seen[4])
    valid = [r for r in records(tmp_path) if r.get("split") == "valid"]
    assert [r["step"] for r in valid] == [2, 4, 6, 8, 10]
    assert [r["score"] for r in valid] == [0.1, 0.5, 0.3, 0.4, 0.2]
    assert "valid_nll" in valid[0] and valid[0]["neg_valid_nll"] == -valid[0]["valid_nll"]


def test_early_stopping(tmp_path: Path) -> None:
    scripted = Scripted([0.5, 0.4, 0.3, 0.2, 0.1, 0.0])
    summary = _trainer(
        tmp_path,
        _cfg(max_steps=100, eval_every=2, patience=2),
        validator=scripted,
        score_key="score",
    ).train()
    assert summary["stopped_by"] == "early_stopping" and summary["step"] == 6


def test_target_seq_accuracy(tmp_path: Path) -> None:
    scripted = Scripted([0.2, 0.9, 0.95, 1.0], key="seq_accuracy")
    summary = _trainer(
        tmp_path,
        _cfg(max_steps=100, eval_every=3, target_seq_accuracy=0.95),
        validator=scripted,
        score_key="seq_accuracy",
    ).train()
    assert summary["stopped_by"] == "target_seq_accuracy"
    assert summary["step"] == 9 and summary["seq_accuracy"] == 0.95
    assert len(scripted.seen) == 3  # no extra validation at the end
    assert (tmp_path / "model.pt").exists() and (tmp_path / "best.pt").exists()


def test_validation_loss_matches_loss_function(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(dropout=0.3))
    metrics = trainer.validate()
    model = trainer.model.eval()
    b = collate(trainer.valid_pairs)
    with torch.no_grad():
        sums = label_smoothed_nll(model(b.src, b.tgt_in), b.tgt_out, epsilon=0.1, ignore_index=PAD)
    assert metrics["valid_loss"] == pytest.approx(sums.loss.item() / sums.n_tokens, rel=1e-5)
    assert metrics["valid_nll"] == pytest.approx(sums.nll.item() / sums.n_tokens, rel=1e-5)


def test_long_pairs_are_filtered(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(max_len=5, max_steps=2))
    assert trainer.feed.n_filtered > 0
    assert all(max(s, t) <= 5 for s, t in model_lengths(trainer.feed.pairs))
    assert trainer.train()["filtered_pairs"] == trainer.feed.n_filtered


def test_nothing_left_after_filtering_is_a_user_error(tmp_path: Path) -> None:
    from transduce.errors import UserError

    with pytest.raises(UserError, match="max_len"):
        _trainer(tmp_path, _cfg(max_len=1))


def test_bf16_training_runs(tmp_path: Path) -> None:
    summary = _trainer(tmp_path, _cfg(max_steps=3, precision="bf16")).train()
    losses = [loss for _, loss in train_losses(tmp_path)]
    assert summary["step"] == 3 and all(0 < x < 10 for x in losses)


# --- precision bf16-weights (training/working_weights.py) -------------------------------------


def test_bf16_weights_resume_exactly_and_keep_float32_checkpoints(tmp_path: Path) -> None:
    """The copy is made after the resume restored the master weights, and cast anew after every
    step: 6 steps + 6 resumed are 12 straight."""
    straight = _trainer(tmp_path / "a", _cfg(max_steps=12, save_every=4, precision="bf16-weights"))
    straight.train()
    first = _trainer(tmp_path / "b", _cfg(max_steps=6, save_every=4, precision="bf16-weights"))
    first.train()
    cfg = _cfg(max_steps=12, save_every=4, precision="bf16-weights")
    second = _trainer(tmp_path / "b", cfg, resume=True)
    assert second.progress.step == 6
    second.train()
    want, got = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert [s for s, _ in got] == list(range(1, 13))
    assert [x for _, x in got] == pytest.approx([x for _, x in want], abs=1e-6)
    assert _same_state(straight.model.state_dict(), second.model.state_dict(), atol=1e-6)
    saved = torch.load(tmp_path / "b" / "model.pt", map_location="cpu", weights_only=False)
    assert {v.dtype for v in saved["model"].values() if v.is_floating_point()} == {torch.float32}


def test_bf16_weights_learn_as_autocast_does(tmp_path: Path) -> None:
    """40 updates of the copy task, 2 batches an update: the training loss falls as far as
    under autocast (bf16), within bfloat16 noise."""
    last = {}
    for precision in ("bf16", "bf16-weights"):
        _trainer(tmp_path / precision, _cfg(precision=precision, update_freq=2)).train()
        losses = [x for _, x in train_losses(tmp_path / precision)]
        assert losses[-1] < losses[0] - 0.8, (precision, losses[0], losses[-1])
        last[precision] = losses[-1]
    assert last["bf16-weights"] == pytest.approx(last["bf16"], abs=0.05)


@pytest.mark.parametrize(
    "caps,auto",
    [
        ({}, "fp32"),
        ({"avx512_f": True}, "fp32"),
        ({"avx512_bf16": True}, "bf16-weights"),
        ({"amx_bf16": True, "amx_tile": True}, "bf16-weights"),
    ],
)
def test_auto_precision_is_bf16_only_on_cpus_with_bfloat16_instructions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caps: dict[str, bool], auto: str
) -> None:
    # bfloat16 working weights in one process; autocast under torchrun (DDP's overlap)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    cpu = torch.device("cpu")
    assert native_bf16(cpu) == (auto != "fp32")
    assert resolve_precision("auto", cpu) == auto
    assert resolve_precision("auto", cpu, processes=2) == ("fp32" if auto == "fp32" else "bf16")
    for p in ("fp32", "bf16", "fp16", "bf16-weights"):
        assert resolve_precision(p, cpu) == p == resolve_precision(p, cpu, processes=2)
    assert _trainer(tmp_path, _cfg()).precision == auto  # auto is the default


def test_a_run_begun_under_autos_old_rule_resumes_in_the_precision_it_began_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto gave one process bf16 (autocast) before it gave bf16-weights: such a run, resumed,
    keeps autocast (its numerics unchanged midway, and its resume not refused), exactly as a
    straight bf16 run; a new run, and one begun under the new rule, take bf16-weights."""
    import transduce.training.trainer as trainer_module

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True})
    straight = _trainer(tmp_path / "a", _cfg(max_steps=8, save_every=4, precision="bf16"))
    straight.train()
    new_rule = trainer_module.resolve_precision
    with monkeypatch.context() as old_rule:
        old_rule.setattr(trainer_module, "resolve_precision", lambda p, d, n=1: "bf16")
        first = _trainer(tmp_path / "b", _cfg(max_steps=4, save_every=4))
        assert first.precision == "bf16"
        first.train()
    assert trainer_module.resolve_precision is new_rule
    second = _trainer(tmp_path / "b", _cfg(max_steps=8, save_every=4), resume=True)
    assert second.precision == "bf16"
    assert second.working is None  # autocast: no bfloat16 copy
    second.train()
    want, got = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert [x for _, x in got] == pytest.approx([x for _, x in want], abs=1e-6)
    last = tmp_path / "b" / "checkpoints" / "step_00000008.pt"
    assert torch.load(last, map_location="cpu", weights_only=False)["precision"] == "bf16"
    third = _trainer(tmp_path / "c", _cfg(max_steps=4, save_every=4))
    assert third.precision == "bf16-weights" and third.working is not None
    third.train()
    again = _trainer(tmp_path / "c", _cfg(max_steps=8, save_every=4), resume=True)
    assert again.precision == "bf16-weights"


@pytest.mark.parametrize("capability,native", [((7, 0), False), ((7, 5), False), ((8, 0), True)])
def test_auto_precision_on_cuda_is_bf16_from_ampere_on(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], native: bool
) -> None:
    # V100 (7.0) and T4 (7.5) only emulate bfloat16; A100 (8.0) computes in it
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    gpu = torch.device("cuda", 0)
    assert native_bf16(gpu) == native
    assert resolve_precision("auto", gpu) == ("bf16-weights" if native else "fp32")
    assert resolve_precision("auto", gpu, processes=8) == ("bf16" if native else "fp32")


def test_fp16_training_scales_the_loss_and_checkpoints_the_scale(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(max_steps=3, save_every=100, precision="fp16"))
    summary = trainer.train()
    logged = [r for r in records(tmp_path) if r.get("split") != "valid"]
    assert summary["step"] == 3 and all(0 < r["loss"] < 10 for r in logged)
    assert [r["loss_scale"] for r in logged] == [2.0**16] * 3  # GradScaler's start, no overflow
    trainer.scaler.update(new_scale=512.0)
    trainer.save()
    resumed = _trainer(tmp_path, _cfg(max_steps=3, save_every=100, precision="fp16"), resume=True)
    assert resumed.progress.step == 3 and resumed.scaler.get_scale() == 512.0


def test_fp16_update_with_overflowing_gradients_is_skipped(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, _cfg(precision="fp16", dropout=0.0))
    # float16 gradients of a loss scaled by 2^100 overflow: the update must change nothing
    trainer.scaler = trainer.updater.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)
    before = copy.deepcopy(trainer.model.state_dict())
    batch = collate(trainer.feed.pairs[:8])
    adam_before = copy.deepcopy(trainer.optimizer.state_dict())
    update = trainer._update([batch])
    assert 0 < update.loss < 10  # the reported loss is the unscaled one
    assert update.skipped is not None and "gradient norm" in update.skipped
    assert _same_state(before, trainer.model.state_dict())
    assert trainer.optimizer.state_dict() == adam_before  # Adam's state untouched too
    assert trainer.scaler.get_scale() == 2.0**99  # halved
    trainer.scaler = trainer.updater.scaler = torch.amp.GradScaler("cpu")  # a sane scale
    trainer._update([batch])
    after = trainer.model.state_dict()
    assert not _same_state(before, after)
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())


def test_fp16_skip_for_a_nan_loss_backs_the_scale_off_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = _trainer(tmp_path, _cfg(precision="fp16", dropout=0.0))
    real = updater_module.label_smoothed_nll  # a NaN loss; its gradients stay finite

    def nan_loss(*args: Any, **kwargs: Any) -> Any:
        sums = real(*args, **kwargs)
        return sums._replace(loss=sums.loss.detach() * math.nan + sums.loss)

    monkeypatch.setattr(updater_module, "label_smoothed_nll", nan_loss)
    update = trainer._update([collate(trainer.feed.pairs[:8])])
    assert update.skipped == "non-finite loss (nan)"
    assert trainer.scaler.get_scale() == 2.0**15  # halved, not grown as for a clean update


# --- it learns ----------------------------------------------------------------------------------


def test_learns_copy_task_exactly(tmp_path: Path) -> None:
    # Reaches 100% at 300-375 steps for seeds 1-3 (~6 s on an idle core).
    cfg = update(
        Config(),
        {
            "n_layers": 1,
            "d_model": 64,
            "d_ff": 64,
            "n_heads": 4,
            "d_k": 16,
            "d_v": 16,
            "dropout": 0.0,
            "label_smoothing": 0.0,
            "warmup": 100,
            "clip_norm": 1.0,
            "max_tokens": 512,
            "max_steps": 1000,
            "eval_every": 25,
            "save_every": 1000,
            "log_every": 50,
            "target_seq_accuracy": 1.0,
            "tensorboard": False,
            "name": "copy",
            "train_size": 2000,
            "valid_size": 100,
            "max_length": 5,
            "n_symbols": 8,
            "beam": 1,
        },
    )
    summary = train_synthetic(cfg, tmp_path, show_progress=False)
    assert summary["seq_accuracy"] == 1.0, summary
    assert summary["stopped_by"] == "target_seq_accuracy"
    # The saved model really copies held-out strings.
    from transduce.inference.search import predict_ids

    model, vocab, _ = checkpoint.load_model(tmp_path / "model.pt")
    task = make_task(cfg.task)
    sources = [vocab.encode(s) for s, _ in task.valid]
    hyps = predict_ids(model, sources, batch_size=64, max_len_offset=5)
    assert [vocab.decode(h) for h in hyps] == [t for _, t in task.valid]


def test_logged_loss_is_token_weighted_mean_since_last_log(tmp_path: Path) -> None:
    every = _trainer(tmp_path / "a", _cfg(max_steps=6, log_every=1, dropout=0.0))
    every.train()
    windowed = _trainer(tmp_path / "b", _cfg(max_steps=6, log_every=3, dropout=0.0))
    windowed.train()
    per_step = dict(train_losses(tmp_path / "a"))
    with every.feed.epoch(0, every.device) as epoch:  # update i trained on batches[i - 1]
        batches = epoch.batches
    tokens = [collate([every.feed.pairs[i] for i in b]).n_tokens for b in batches[:6]]
    want = [
        sum(per_step[s] * tokens[s - 1] for s in window) / sum(tokens[s - 1] for s in window)
        for window in (range(1, 4), range(4, 7))
    ]
    got = train_losses(tmp_path / "b")
    assert [s for s, _ in got] == [3, 6]
    assert [x for _, x in got] == pytest.approx(want, rel=1e-6)
    assert got[0][1] != pytest.approx(per_step[3], rel=1e-6)  # not just the last update's loss


def test_random_states_round_trip_and_keep_no_other_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from transduce.training.rng import rng_state as _rng_state
    from transduce.training.rng import set_rng_state as _set_rng_state

    cpu = torch.device("cpu")
    torch.manual_seed(5)
    state = _rng_state(cpu)
    assert "cuda" not in state  # a CPU run saves no GPU's state, even on a machine with GPUs
    first = torch.rand(3)
    torch.rand(7)
    _set_rng_state(state, cpu)
    assert torch.equal(torch.rand(3), first)

    # On a GPU: that GPU's state alone, saved and restored (a fake CUDA records the calls)
    gpu_states = {i: torch.full((4,), i, dtype=torch.uint8) for i in range(4)}
    restored: list[tuple[int, torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: gpu_states[device.index])
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda s, device: restored.append((device.index, s))
    )
    gpu1 = torch.device("cuda", 1)
    saved = _rng_state(gpu1)
    assert torch.equal(saved["cuda"], gpu_states[1])
    _set_rng_state(saved, gpu1)
    assert len(restored) == 1 and restored[0][0] == 1 and torch.equal(restored[0][1], gpu_states[1])
    # checkpoints before 2026-11-24 held a list of every visible GPU's state: this GPU's entry is
    # restored, and a list shorter than this GPU's index (fewer GPUs when saved) is skipped
    restored.clear()
    _set_rng_state({**state, "cuda": [gpu_states[i] for i in range(4)]}, gpu1)
    assert len(restored) == 1 and torch.equal(restored[0][1], gpu_states[1])
    restored.clear()
    _set_rng_state({**state, "cuda": [gpu_states[0]]}, gpu1)
    assert restored == []
    _set_rng_state({**state, "cuda": [gpu_states[0]]}, cpu)  # a CPU resume ignores GPU states
    assert restored == []

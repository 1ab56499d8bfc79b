"""precision bf16-weights (training/working_weights.py): a bfloat16 copy of the model trains,
cast from the float32 master weights once per update, its gradients accumulated in float32."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from training_testkit import records, tiny_trainer

import transduce.training.updater as updater_module
from transduce.config import ModelConfig
from transduce.kernels import adam, native
from transduce.model.transformer import make_model
from transduce.training.loss import label_smoothed_nll
from transduce.training.working_weights import WorkingWeights

CFG = ModelConfig(n_layers=1, d_model=32, d_ff=64, n_heads=2, d_k=16, d_v=16, dropout=0.0)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return make_model(CFG, src_vocab_size=20)


def test_the_working_copy_is_the_model_in_bfloat16_with_its_weights_tied() -> None:
    master = _model()
    working = WorkingWeights(master)
    copy = working.module
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in master.parameters()} == {torch.float32}  # the master is untouched
    for (name, w), m in zip(copy.named_parameters(), master.parameters(), strict=True):
        assert torch.equal(w, m.to(torch.bfloat16)), name
    # one matrix for source and target embeddings and the pre-softmax projection, as in master
    assert copy.generator.weight is copy.decoder.embed.weight is copy.encoder.embed.weight


def test_refresh_casts_the_master_weights_anew() -> None:
    master = _model()
    working = WorkingWeights(master)
    with torch.no_grad():
        for p in master.parameters():
            p.add_(0.5)
    assert not torch.equal(working.module.generator.weight, master.generator.weight.bfloat16())
    working.refresh()
    for w, m in zip(working.module.parameters(), master.parameters(), strict=True):
        assert torch.equal(w, m.to(torch.bfloat16))


def test_gradients_accumulate_in_float32_and_leave_the_copy() -> None:
    # 1 + 2^-10 is not a bfloat16 number (8 bits of mantissa): accumulated in the copy's
    # bfloat16 gradient, the small second batch would vanish
    master = _model()
    working = WorkingWeights(master)
    w = working.module.generator.weight
    for value in (1.0, 2.0**-10):
        w.grad = torch.full_like(w, value)
        working.gradients_to_master()
        assert w.grad is None
    grad = master.generator.weight.grad
    assert grad is not None and grad.dtype == torch.float32
    assert torch.equal(grad, torch.full_like(grad, 1.0 + 2.0**-10))


def _gradient(net: torch.nn.Module, bf16_autocast: bool = False) -> None:
    """One batch's label-smoothed loss backpropagated through ``net``."""
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 20, (8, 7), generator=g), torch.randint(4, 20, (8, 7), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = net(src, tgt[:, :-1])
    sums = label_smoothed_nll(logits, tgt[:, 1:], epsilon=0.1, ignore_index=0)
    (sums.loss / sums.n_tokens).backward()


def _flat_gradient(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_the_gradient_is_the_float32_gradient_within_bfloat16_rounding() -> None:
    """One batch's gradient through the bfloat16 copy against the model's own in float32 (the
    reference) and under bf16 autocast: as close to the reference as autocast's, or closer
    (here 1.3% against 2.9% of the gradient's norm)."""
    reference, master, autocast = _model(), _model(), _model()
    working = WorkingWeights(master)
    _gradient(reference)
    _gradient(working.module)
    working.gradients_to_master()
    _gradient(autocast, bf16_autocast=True)
    exact = _flat_gradient(reference)
    ours = (_flat_gradient(master) - exact).norm() / exact.norm()
    theirs = (_flat_gradient(autocast) - exact).norm() / exact.norm()
    assert ours < 0.03 and ours < theirs, (float(ours), float(theirs))


def test_every_gradient_arrives_exactly_in_its_own_float32_tensor() -> None:
    # the fused copy of the first batch: each master gradient is its working gradient cast, in
    # a tensor of its own (not a view of another's, not the working one)
    master = _model()
    working = WorkingWeights(master)
    _gradient(working.module)
    before = [p.grad.clone() for p in working.module.parameters()]
    working.gradients_to_master()
    grads = [p.grad for p in master.parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    for g, b in zip(grads, before, strict=True):
        assert torch.equal(g, b.float())
    assert len({g.data_ptr() for g in grads}) == len(grads)


# --- Adam's step in one pass (WorkingWeights.step, kernels/adam.py) --------------------------


def _bf16_run(run_dir: Path, monkeypatch: pytest.MonkeyPatch, fused: bool, **train: Any) -> Any:
    """TINY trained in bf16-weights (weight decay: two parameter groups), its third batch's
    loss NaN (a skipped update); ``fused`` False: every update made the three-pass way. The
    Trainer and how many updates the one-pass step made."""
    calls = []
    real_step = adam.adam_bf16_copy
    real_nll = updater_module.label_smoothed_nll
    batches = itertools.count(1)

    def counted(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        real_step(*args, **kwargs)

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        sums = real_nll(*args, **kwargs)
        return sums._replace(loss=sums.loss * math.nan) if next(batches) == 3 else sums

    with monkeypatch.context() as m:
        m.setattr(adam, "adam_bf16_copy", counted)
        m.setattr(updater_module, "label_smoothed_nll", poisoned)
        if not fused:
            m.setattr(WorkingWeights, "steps", lambda self, optimizer: False)
        run = {"precision": "bf16-weights", "max_steps": 9, "weight_decay": 0.1, **train}
        trainer = tiny_trainer(run_dir, **run)
        trainer.train()
    return trainer, len(calls)


@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
def test_the_one_pass_step_trains_as_the_three_passes_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clip_norm: float
) -> None:
    if not native.available():
        pytest.skip("the native kernels are not built here")
    one, calls = _bf16_run(tmp_path / "one", monkeypatch, True, clip_norm=clip_norm)
    three, none = _bf16_run(tmp_path / "three", monkeypatch, False, clip_norm=clip_norm)
    # 9 updates applied and 1 skipped: the first by torch (it makes Adam's state), the other 8 in
    # one pass, a call for each of the two parameter groups
    assert (calls, none) == (16, 0)
    for a, b in zip(one.model.state_dict().values(), three.model.state_dict().values()):
        assert torch.equal(a, b)
    working = one.updater.working
    assert working is not None
    for w, p in zip(working.module.parameters(), one.model.parameters(), strict=True):
        assert torch.equal(w, p.bfloat16()) and w.grad is None
    a, b = one.optimizer.state_dict(), three.optimizer.state_dict()
    for key, state in a["state"].items():
        assert all(torch.equal(state[k], b["state"][key][k]) for k in state)
    strip = {"elapsed", "tokens_per_s", "data_share", "seconds", "time", "valid_seconds"}
    assert [{k: v for k, v in r.items() if k not in strip} for r in records(tmp_path / "one")] == [
        {k: v for k, v in r.items() if k not in strip} for r in records(tmp_path / "three")
    ]


def test_updates_of_several_batches_step_from_the_float32_gradients_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two batches accumulate in float32 (and are clipped there): the one pass reads those
    if not native.available():
        pytest.skip("the native kernels are not built here")
    run = {"update_freq": 2, "max_steps": 5, "clip_norm": 0.05}
    one, calls = _bf16_run(tmp_path / "one", monkeypatch, True, **run)
    three, none = _bf16_run(tmp_path / "three", monkeypatch, False, **run)
    assert (calls, none) == (8, 0)  # 5 updates, the first by torch; 2 parameter groups
    for a, b in zip(one.model.state_dict().values(), three.model.state_dict().values()):
        assert torch.equal(a, b)
    assert all(p.grad is None for p in one.model.parameters())
    working = one.updater.working
    assert working is not None
    for w, p in zip(working.module.parameters(), one.model.parameters(), strict=True):
        assert torch.equal(w, p.bfloat16()) and w.grad is None


def _stepped(**adam: Any) -> tuple[WorkingWeights, torch.optim.Optimizer]:
    """TINY-sized model, its working copy and an Adam of ``adam`` after one update (its state
    made), the working copy's gradients set for the next."""
    master = _model()
    working = WorkingWeights(master)
    options = {"lr": 1e-3, "fused": True, "decoupled_weight_decay": True, **adam}
    optimizer = torch.optim.Adam(master.parameters(), **options)
    _gradient(working.module)
    working.gradients_to_master()
    optimizer.step()
    _gradient(working.module)
    return working, optimizer


@pytest.mark.parametrize(
    "adam_options",
    [
        {"weight_decay": 0.1, "decoupled_weight_decay": False},  # L2 in the gradient: not ours
        {"amsgrad": True},
        {"maximize": True},
        {"fused": False, "foreach": True},  # torch's other kernels round otherwise
    ],
)
def test_the_one_pass_step_is_refused_where_torchs_adam_would_differ(
    adam_options: dict[str, Any],
) -> None:
    if not native.available():
        pytest.skip("the native kernels are not built here")
    working, optimizer = _stepped()
    assert working.steps(optimizer)  # the plain fused Adam: taken
    working, optimizer = _stepped(**adam_options)
    assert not working.steps(optimizer)


def test_the_one_pass_step_waits_for_adams_state_and_dense_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not native.available():
        pytest.skip("the native kernels are not built here")
    master = _model()
    working = WorkingWeights(master)
    fresh = torch.optim.Adam(master.parameters(), lr=1e-3, fused=True)
    assert not working.steps(fresh)  # no state yet: the first update is torch's
    working, optimizer = _stepped()
    state = next(s for s in optimizer.state.values() if s["exp_avg"].dim() == 2)
    state["exp_avg"] = state["exp_avg"].t().contiguous().t()  # the same numbers, strided
    assert not state["exp_avg"].is_contiguous()
    assert not working.steps(optimizer)
    working, optimizer = _stepped()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert not working.steps(optimizer)  # torch's plain build rounds its multiply-adds twice

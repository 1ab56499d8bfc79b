"""Adam with optional decoupled weight decay: parameter groups and one step against the formula."""

from __future__ import annotations

import pytest
import torch

from transduce.config import ModelConfig
from transduce.model.transformer import make_model
from transduce.training.optimizer import make_optimizer, parameter_groups

TINY = ModelConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8, dropout=0.0)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return make_model(TINY, src_vocab_size=11)


def test_no_weight_decay_is_one_group_of_every_parameter() -> None:
    model = _model()
    (group,) = parameter_groups(model, weight_decay=0.0)
    assert group["weight_decay"] == 0.0
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


def test_weight_decay_reaches_matrices_only() -> None:
    model = _model()
    decayed, kept = parameter_groups(model, weight_decay=0.1)
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    kept_names = {names[id(p)] for p in kept["params"]}
    assert decayed_names.isdisjoint(kept_names)
    assert decayed_names | kept_names == set(names.values())
    # the tied embedding and every projection decay; biases and LayerNorm parameters do not
    assert any("embed" in n for n in decayed_names)
    assert all(p.dim() >= 2 for p in decayed["params"]) and decayed["params"]
    assert all(p.dim() == 1 for p in kept["params"]) and kept["params"]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(names[id(m.weight)] in kept_names for m in norms)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_one_step_follows_adamw_formula(weight_decay: float) -> None:
    """Step 1 of Adam has m_hat = g and v_hat = g^2, so
    p1 = p0 * (1 - lr * wd) - lr * g / (|g| + eps) for a decayed matrix, wd = 0 for the rest."""
    model = _model()
    lr, eps = 0.01, 1e-9
    opt = make_optimizer(model, betas=(0.9, 0.98), eps=eps, weight_decay=weight_decay)
    for g in opt.param_groups:
        g["lr"] = lr
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {}
    for n, p in model.named_parameters():
        p.grad = torch.randn_like(p)
        grads[n] = p.grad.clone()
    opt.step()
    for n, p in model.named_parameters():
        wd = weight_decay if p.dim() >= 2 else 0.0
        want = before[n] * (1 - lr * wd) - lr * grads[n] / (grads[n].abs() + eps)
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6, msg=n)


def test_zero_gradient_only_shrinks_matrices() -> None:
    model = _model()
    opt = make_optimizer(model, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.5)
    for g in opt.param_groups:
        g["lr"] = 0.1
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 0.95 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, msg=n)


def _stepped(weight_decay: float, model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = make_optimizer(model, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    for group in opt.param_groups:  # as the trainer sets it
        group["lr"] = 1e-3
    opt.step()
    return opt


@pytest.mark.parametrize(("before", "after"), [(0.0, 0.1), (0.1, 0.0), (0.1, 0.5)])
def test_a_saved_state_fits_another_weight_decay_its_moments_on_their_parameters(
    before: float, after: float
) -> None:
    """A resume allowed to change weight_decay between 0 and > 0 was refused ("a different
    number of parameter groups"), and one allowed to change betas, eps or the decay kept the
    saved values in silence. The moments go to the same parameters; the hyperparameters are
    the new config's, the learning rate the saved one."""
    from transduce.training.optimizer import saved_state_for

    model = _model()
    saved = _stepped(before, model)
    fresh = make_optimizer(model, betas=(0.8, 0.5), eps=1e-3, weight_decay=after)
    fresh.load_state_dict(saved_state_for(saved.state_dict(), fresh, model))
    for p in model.parameters():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(fresh.state[p][key], saved.state[p][key]), key
    for group in fresh.param_groups:
        assert group["betas"] == (0.8, 0.5) and group["eps"] == 1e-3 and group["lr"] == 1e-3
    assert fresh.param_groups[0]["weight_decay"] == after

"""precision bf16-weights (training/working_weights.py): a bfloat16 copy of the model trains,
cast from the float32 master weights once per update, its gradients accumulated in float32."""

from __future__ import annotations

import torch

from transduce.config import ModelConfig
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

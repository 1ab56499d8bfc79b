"""kernels.log_softmax_topk (the k best log-probabilities of each row through its tiles) against
``log_softmax`` then ``topk``: its torch stage everywhere, its Triton kernel on CPU tensors under
Triton's interpreter (a subprocess: the interpreter is chosen when the kernel is defined), and
on CUDA where there is a GPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from transduce import kernels
from transduce.kernels import native, topk_tiles

BLOCK = topk_tiles.BLOCK
NINF = float("-inf")


def reference(logits: torch.Tensor, k: int, lo: int, hi: int) -> torch.Tensor:
    """log_softmax in float32, columns lo..hi -inf, then the k best values."""
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    lprobs[:, lo : hi + 1] = NINF
    return lprobs


def check(logits: torch.Tensor, k: int, lo: int, hi: int, use_triton: bool) -> None:
    logits = logits.clone()
    logits[:, lo : hi + 1] = logits.float().max() + 1  # the excluded would be the best
    want = reference(logits, k, lo, hi)
    values, index = kernels.log_softmax_topk(logits, k, lo, hi, use_triton=use_triton)
    assert values.dtype == torch.float32 and values.shape == index.shape == (logits.size(0), k)
    top = want.topk(k, dim=1).values
    torch.testing.assert_close(values, top, atol=1e-5, rtol=1e-6)  # the values, best first
    # each index holds its value (ties may name another index of the same value), none twice
    # among the finite values, none excluded
    torch.testing.assert_close(want.gather(1, index), top, atol=1e-5, rtol=1e-6)
    for row_v, row_i in zip(values, index, strict=True):
        finite = row_i[row_v > NINF].tolist()
        assert len(set(finite)) == len(finite)
        assert not any(lo <= i <= hi for i in finite)


CASES = [  # rows, vocabulary, k
    (3, 3 * BLOCK + 17, 4),  # a short last tile
    (2, BLOCK, 1),  # one whole tile
    (5, 2 * BLOCK, 8),
    (4, 100, 3),  # less than a tile
    (1, 5 * BLOCK - 1, 16),  # MAX_K
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_the_torch_stage_gives_log_softmax_topk(case, dtype):
    rows, vocab, k = case
    g = torch.Generator().manual_seed(rows * vocab + k)
    logits = (4 * torch.randn(rows, vocab, generator=g)).to(dtype)  # bf16: many ties
    check(logits, k, 0, 1, use_triton=False)


def edge_cases(use_triton: bool, device: str = "cpu") -> None:
    """The k best in one tile (each tile's k best are needed, not its maximum only), a row
    whose other tiles are all -inf, a row whose best entries are the excluded ones; rows with
    fewer finite entries than k, the last tile shorter than k."""
    logits = torch.randn(3, 3 * BLOCK, device=device)
    logits[0, BLOCK + 10 : BLOCK + 16] = 50.0 + torch.arange(6.0, device=device)
    logits[1, BLOCK:] = NINF
    logits[2, :2] = 100.0
    check(logits, 4, 0, 1, use_triton=use_triton)
    logits = torch.full((2, BLOCK + 5), NINF, device=device)
    logits[:, 7] = 1.0
    logits[:, BLOCK + 2] = 3.0
    values, index = kernels.log_softmax_topk(logits, 8, 0, 1, use_triton=use_triton)
    assert values[:, 0].tolist() == pytest.approx([-0.126928] * 2, abs=1e-5)  # log(e^3/(e+e^3))
    assert index[:, :2].tolist() == [[BLOCK + 2, 7]] * 2
    assert values[:, 2:].eq(NINF).all()
    assert index.lt(BLOCK + 5).all() and index.ge(0).all()  # -inf ones named in the row too


def test_edge_cases_of_the_torch_stage():
    edge_cases(use_triton=False)


def test_no_rows_and_a_k_out_of_range():
    values, index = kernels.log_softmax_topk(torch.empty(0, 300), 4, 0, 1, use_triton=False)
    assert values.shape == index.shape == (0, 4)
    with pytest.raises(ValueError, match="k must be 1..16"):
        kernels.log_softmax_topk(torch.randn(2, 300), topk_tiles.MAX_K + 1, 0, 1, use_triton=False)


def test_the_rule_is_cuda_where_the_kernel_runs_and_a_small_k(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(topk_tiles, "runs_on", lambda device, k: True)
    # on a CPU the native kernel's rule (tests/kernels/test_native.py)
    assert kernels.log_softmax_topk_pays(cpu, 4) == native.available()
    assert not kernels.log_softmax_topk_pays(cpu, topk_tiles.NATIVE_MAX_K + 1)
    assert not kernels.log_softmax_topk_pays(cuda, topk_tiles.MAX_K + 1)
    assert kernels.log_softmax_topk_pays(cuda, 4) == topk_tiles.available()
    monkeypatch.setattr(topk_tiles, "runs_on", lambda device, k: False)
    assert not kernels.log_softmax_topk_pays(cuda, 4)


def test_a_kernel_that_fails_to_run_is_tried_once_and_left_with_a_warning(monkeypatch):
    # Triton imported but its first launch failing (no C compiler, a GPU it does not support)
    monkeypatch.setattr(topk_tiles, "_RUNS_ON", {})

    def fails(*args):  # noqa: ANN002, ANN202
        raise RuntimeError("Failed to find\n  C compiler")

    monkeypatch.setattr(topk_tiles, "tiles_triton", fails)
    where = torch.device("cpu")  # the device only names the cache's entry here
    with pytest.warns(RuntimeWarning, match="does not run on cpu .*Failed to find C compiler") as w:
        assert not topk_tiles.runs_on(where, 4)
    assert "\n" not in str(w[0].message)  # one line
    monkeypatch.setattr(topk_tiles, "tiles_triton", topk_tiles.tiles_torch)
    assert not topk_tiles.runs_on(where, 4)  # tried once: the answer kept
    assert topk_tiles.runs_on(where, 2)  # another k: a kernel of its own, tried
    topk_tiles._RUNS_ON.clear()
    assert topk_tiles.runs_on(where, 4)  # a kernel that runs and agrees


INTERPRETED = """
import torch
from tests_kernel_cases import CASES, check, edge_cases
for rows, vocab, k in CASES:
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(rows * vocab + k)
        check((4 * torch.randn(rows, vocab, generator=g)).to(dtype), k, 2, 4, use_triton=True)
edge_cases(use_triton=True)
print("interpreted", len(CASES) * 2)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_the_triton_kernel_under_the_interpreter_gives_the_same(tmp_path):
    # this module's cases and check, importable by the subprocess under another name
    (tmp_path / "tests_kernel_cases.py").write_text(open(__file__, encoding="utf-8").read())
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"interpreted {len(CASES) * 2}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not topk_tiles.available(), reason="Triton not installed")
@pytest.mark.parametrize("case", CASES)
def test_the_triton_kernel_on_cuda(case):
    rows, vocab, k = case
    g = torch.Generator(device="cuda").manual_seed(rows * vocab + k)
    logits = (4 * torch.randn(rows, vocab, generator=g, device="cuda")).to(torch.bfloat16)
    check(logits, k, 0, 1, use_triton=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not topk_tiles.available(), reason="Triton not installed")
def test_the_triton_kernel_s_edge_cases_on_cuda():
    edge_cases(use_triton=True, device="cuda")
    assert topk_tiles.runs_on(torch.device("cuda"), 4)  # the check before first use agrees


@pytest.mark.parametrize("stage", ["torch", "native"])
def test_forced_rows_hold_the_forced_column_then_minus_inf(stage: str) -> None:
    """A search's last step: rows where ``force`` hold column ``forced``'s log-probability (of
    the whole row's log_softmax), then -inf at the first other columns outside lo..hi; the other
    rows as without ``force``. The torch stage and the CPU's kernel name the same columns."""
    if stage == "native" and not native.available():
        pytest.skip("the native kernels did not build")
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(5, 3 * BLOCK + 7, generator=g) * 3
    logits[3, 2] = NINF  # the forced column -inf: nothing finite in that row
    force = torch.tensor([True, False, False, True, True])
    use_triton = False if stage == "torch" else None
    values, index = kernels.log_softmax_topk(
        logits, 4, 0, 1, use_triton=use_triton, force=force, forced=2
    )
    free, free_index = kernels.log_softmax_topk(logits, 4, 0, 1, use_triton=use_triton)
    assert torch.equal(values[~force], free[~force]) and torch.equal(
        index[~force], free_index[~force]
    )
    lprobs = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(values[[0, 4], 0], lprobs[[0, 4], 2], atol=1e-5, rtol=1e-6)
    assert values[force, 1:].isneginf().all() and values[3, 0] == NINF
    assert index[force].tolist() == [[2, 3, 4, 5]] * 3


@pytest.mark.parametrize("stage", ["torch", "native"])
def test_a_forced_column_at_minus_inf_or_a_nan_row_keeps_the_forced_column_first(
    stage: str,
) -> None:
    """Column ``forced`` comes first even at -inf (both stages name the same columns after it),
    and a NaN elsewhere in a forced row leaves the other candidates -inf."""
    if stage == "native" and not native.available():
        pytest.skip("the native kernels did not build")
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(4))
    logits[0, 7] = NINF
    logits[1, 50] = float("nan")
    force = torch.tensor([True, True, False])
    values, index = kernels.log_softmax_topk(
        logits, 4, 0, 1, use_triton=False if stage == "torch" else None, force=force, forced=7
    )
    assert index[0].tolist() == [7, 2, 3, 4] and values[0].isneginf().all()
    assert index[1, 0] == 7 and values[1, 1:].isneginf().all()

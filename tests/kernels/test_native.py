"""The native CPU kernels (kernels/native/rows.cpp): bit for bit the numbers of their PyTorch
forms, built where a compiler is, and PyTorch's forms with one warning where the build fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from transduce.data.vocab import EOS
from transduce.kernels import native, quantized


def _native_or_skip() -> None:
    """A skip where the kernels did not build; in CI (``CI=true``: .ci/run installs g++ and
    ninja) a failure, so the native path is always tested there."""
    if native.available():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("the native kernels did not build in CI (g++ and ninja-build are installed)")
    pytest.skip("the native kernels did not build here (no C++ compiler or ninja)")


def _hard_rows(width: int, seed: int) -> torch.Tensor:
    """(40, width): magnitudes 10^6 apart, a row of zeros, ReLU'd rows, rows of exact halves
    after scaling (ties), a row whose unit would be subnormal, and a row of one nonzero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, width, generator=g) * torch.logspace(-4, 2, 40)[:, None]
    x[3] = 0.0
    x[5:9] = x[5:9].relu()
    halves = torch.randint(-126, 126, (4, width), generator=g) + 0.5
    halves[:, 0] = 127.0  # each row's largest 127: unit 1, its entries stay halves
    x[10:14] = halves
    x[15] = torch.linspace(-1, 1, width) * 1.5 * torch.finfo(torch.float32).tiny
    x[16] = 0.0
    x[16, width // 2] = -3.0
    x[17] = _near_ties(width)
    return x


def _near_ties(width: int) -> torch.Tensor:
    """(width,): 38.1 (so the unit is 38.1 / 127), then values within 2 ulps of (k + 1/2) units,
    where x / unit and x times 1 / unit round to different integers (a kernel that multiplies
    by the reciprocal, or rounds otherwise, gives other numbers)."""
    top = torch.tensor(38.1)
    unit = top / 127
    base = (torch.arange(-126, 126) + 0.5) * unit
    near = [base]
    for _ in range(2):
        near += [torch.nextafter(near[-2 if len(near) > 1 else 0], base + 1)]
        near += [torch.nextafter(near[-2], base - 1)]
    cands = torch.cat(near)
    differ = (cands / unit).add(128).round() != (cands * (1 / unit)).add(128).round()
    picked = cands[differ]
    assert picked.numel() > 0
    row = picked.repeat(width // picked.numel() + 1)[:width].clone()
    row[0] = top
    return row


@pytest.mark.parametrize("width", [2, 7, 64, 257, 2048])
def test_int8_rows_are_pytorchs_bit_for_bit(width: int) -> None:
    _native_or_skip()
    x = _hard_rows(width, width)
    for rows in (x, x[:1], x[10:14], x[:, : max(2, width // 2)]):  # the last not contiguous
        q, units = native.int8_rows(rows)
        q_ref, units_ref = quantized.int8_rows_torch(rows)
        assert q.dtype == torch.int8 and units.shape == (rows.size(0), 1)
        assert torch.equal(units, units_ref)
        assert torch.equal(q, q_ref), (q.int() - q_ref.int()).abs().max()


@pytest.mark.parametrize("width", [2, 7, 64, 257, 2048])
def test_guarded_rows_are_pytorchs_bit_for_bit(width: int) -> None:
    _native_or_skip()
    x = _hard_rows(width, width + 1)
    for rows in (x, x[:1], x[:, : max(2, width // 2)]):
        out, units = native.guarded_rows(rows)
        out_ref, units_ref = quantized.guarded_rows_torch(rows)
        assert out.shape == (rows.size(0) + 1, rows.size(1))
        assert torch.equal(units, units_ref) and torch.equal(out, out_ref)


def test_an_empty_batch_and_a_nan_row() -> None:
    _native_or_skip()
    q, units = native.int8_rows(torch.empty(0, 8))
    assert q.shape == (0, 8) and units.shape == (0, 1)
    out, _ = native.guarded_rows(torch.empty(0, 8))
    assert out.tolist() == [[-128.0] + [127.0] * 7]  # the guard row alone
    x = torch.randn(3, 9)
    x[1, 4] = float("nan")
    _, units = native.int8_rows(x)
    assert units[1].isnan().all() and not units[[0, 2]].isnan().any()  # as abs().amax() gives


def test_the_int8_products_take_the_native_rows_where_they_are_built(monkeypatch) -> None:
    _native_or_skip()
    calls: list[str] = []
    real = native.int8_rows, native.guarded_rows
    monkeypatch.setattr(native, "int8_rows", lambda x: calls.append("int8") or real[0](x))
    monkeypatch.setattr(native, "guarded_rows", lambda x: calls.append("guard") or real[1](x))
    x = torch.randn(5, 16)
    assert torch.equal(quantized.int8_rows(x)[0], quantized.int8_rows_torch(x)[0])
    assert torch.equal(quantized.guarded_rows(x)[0], quantized.guarded_rows_torch(x)[0])
    assert calls == ["int8", "guard"]


def test_a_failed_build_warns_once_and_pytorch_computes(monkeypatch) -> None:
    def fail() -> None:
        raise RuntimeError("Ninja is required to load C++ extensions")

    native.available.cache_clear()
    try:
        monkeypatch.setattr(native, "_load", fail)
        monkeypatch.setenv(native.VARIABLE, "1")
        with pytest.warns(RuntimeWarning, match="did not build .Ninja is required"):
            assert not native.available()
        x = torch.randn(6, 10)
        assert torch.equal(quantized.int8_rows(x)[0], quantized.int8_rows_torch(x)[0])
        native.available.cache_clear()
        monkeypatch.setenv(native.VARIABLE, "require")
        with pytest.raises(native.NativeBuildError, match="Ninja is required"):
            native.available()
        native.available.cache_clear()
        monkeypatch.setenv(native.VARIABLE, "0")
        assert not native.available()  # not built, no warning
    finally:
        native.available.cache_clear()


def test_the_build_name_follows_the_source_and_the_cpu(monkeypatch, tmp_path) -> None:
    name = native.build_name()
    assert name.startswith("transduce_native_") and name == native.build_name()
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset({"avx2"}))
    other_cpu = native.build_name()
    source = tmp_path / "rows.cpp"
    source.write_bytes(native.SOURCES[0].read_bytes() + b"\n")
    monkeypatch.setattr(native, "SOURCES", (source, *native.SOURCES[1:]))
    assert len({name, other_cpu, native.build_name()}) == 3


def test_transduce_native_0_keeps_pytorchs_operators() -> None:
    code = (
        "import torch; from transduce.kernels import native, quantized; "
        "x = torch.randn(4, 8); quantized.int8_rows(x); "
        "print(native.available(), hasattr(torch.ops.transduce_native, 'int8_rows'))"
    )
    env = dict(os.environ, TRANSDUCE_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def _reference_topk(logits: torch.Tensor, k: int, lo: int, hi: int):
    lp = torch.log_softmax(logits.double(), dim=-1)  # float64: the exact values to ~1e-15
    lp[:, lo : hi + 1] = float("-inf")
    return lp.topk(k, dim=1)


@pytest.mark.parametrize(
    ("v", "k", "scale"),
    [(3, 1, 1.0), (17, 4, 3.0), (300, 12, 10.0), (8000, 4, 5.0), (37000, 1, 1.0)],
)
def test_log_softmax_topk_gives_log_softmax_then_topk(v: int, k: int, scale: float) -> None:
    _native_or_skip()
    g = torch.Generator().manual_seed(v)
    logits = torch.randn(9, v, generator=g) * scale
    logits[2] += 40.0  # a shifted row: the same log-probabilities
    values, index = native.log_softmax_topk(logits, k, 0, 1)
    ref_v, ref_i = _reference_topk(logits, k, 0, 1)
    assert index.dtype == torch.int64 and torch.equal(index, ref_i)
    # a few float32 ulps of the log-probabilities (the sum's order and exp differ)
    torch.testing.assert_close(values.double(), ref_v, atol=2e-5, rtol=2e-6)
    assert (index > 1).all()  # PAD and BOS never chosen


def test_log_softmax_topk_ties_masks_and_short_rows() -> None:
    _native_or_skip()
    x = torch.zeros(4, 600)
    x[0, [5, 300, 599]] = 2.0  # ties: the first index first, in a block, across blocks, the tail
    x[1] = float("-inf")
    x[1, [0, 7, 9]] = torch.tensor([5.0, 1.0, 3.0])  # PAD (excluded) the max, two finite choices
    x[2, 1:] = float("-inf")  # only PAD (excluded) is finite: every choice -inf
    x[3] = torch.linspace(-200, 0, 600)  # exps far below the max's: ~0 in the sum
    values, index = native.log_softmax_topk(x, 4, 0, 1)
    assert index[0].tolist() == [5, 300, 599, 2]
    assert index[1].tolist() == [9, 7, 2, 3] and values[1, 2:].isneginf().all()
    torch.testing.assert_close(values[1, :2], torch.log_softmax(x[1], 0)[[9, 7]])
    assert values[2].isneginf().all() and index[2].tolist() == [2, 3, 4, 5]
    ref_v, ref_i = _reference_topk(x[3:], 4, 0, 1)
    assert torch.equal(index[3:], ref_i)
    torch.testing.assert_close(values[3:].double(), ref_v, atol=2e-5, rtol=0)
    with pytest.raises(RuntimeError, match="k must be"):
        native.log_softmax_topk(torch.zeros(1, 5), 4, 0, 1)  # 3 columns may be chosen


def test_search_steps_take_the_native_candidates_on_the_cpu(monkeypatch) -> None:
    _native_or_skip()
    from transduce.inference.common import next_token_log_probs
    from transduce.inference.topk import chunked_topk, next_token_candidates

    calls: list[int] = []
    real = native.log_softmax_topk
    monkeypatch.setattr(
        native, "log_softmax_topk", lambda x, k, *a: calls.append(k) or real(x, k, *a)
    )
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(3)) * 4
    values, tokens = next_token_candidates(logits, None, 4)
    ref_v, ref_t = chunked_topk(next_token_log_probs(logits, None), 4)
    assert calls == [4] and torch.equal(tokens, ref_t)
    torch.testing.assert_close(values, ref_v, atol=2e-5, rtol=0)
    # forced rows (a search's last step) in the same pass: EOS's log-probability, then -inf
    logits[4, EOS] = float("-inf")  # a model that gives EOS -inf: nothing finite
    forced = torch.tensor([False, True, False, False, True, False])
    values, tokens = next_token_candidates(logits, forced, 4)
    ref_v, ref_t = chunked_topk(next_token_log_probs(logits, forced), 4)
    assert calls == [4, 4] and torch.equal(tokens[~forced], ref_t[~forced])
    torch.testing.assert_close(values, ref_v, atol=2e-5, rtol=0)  # -inf where the reference's
    assert tokens[1, 0] == EOS and tokens[4, 0] == EOS
    assert tokens[forced, 1:].ge(EOS).all()  # never PAD or BOS, even at -inf


def test_greedy_steps_take_the_native_best_token_on_the_cpu() -> None:
    _native_or_skip()
    from transduce.inference.common import next_token_log_probs
    from transduce.inference.topk import next_token_best

    logits = torch.randn(7, 3000, generator=torch.Generator().manual_seed(8)) * 3
    logits[3, 0] = 100.0  # PAD the largest: never chosen
    best, tokens = next_token_best(logits)
    ref_best, ref_tokens = next_token_log_probs(logits, None).max(dim=-1)
    assert torch.equal(tokens, ref_tokens) and tokens[3] != 0
    torch.testing.assert_close(best, ref_best, atol=2e-5, rtol=0)
    # forced rows: EOS with its log-probability, even where the model gives it -inf
    logits[5, EOS] = float("-inf")
    forced = torch.tensor([True, False, False, True, False, True, False])
    best, tokens = next_token_best(logits, forced)
    lprobs = next_token_log_probs(logits, forced)
    assert tokens[forced].eq(EOS).all() and torch.equal(tokens[~forced], ref_tokens[~forced])
    torch.testing.assert_close(best, lprobs.max(dim=-1).values, atol=2e-5, rtol=0)
    assert best[5] == float("-inf")


def _attention_reference(q, k, v, mask):
    """softmax(q k^T / sqrt(K) + mask) v in float64; zeros where a query may attend nothing."""
    scores = q.double() @ k.double().transpose(-1, -2) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1).nan_to_num(0.0)
    return (weights @ v.double()).float()


@pytest.mark.parametrize("head", [8, 16, 20, 32, 48, 64, 96, 128])
def test_decode_attention_gives_the_formula(head: int) -> None:
    """Every head size the kernel sums in registers (multiples of 16 to 128) and others, key
    counts around the blocks of 4 keys and 16 lanes, strided keys, masks, several queries."""
    _native_or_skip()
    g = torch.Generator().manual_seed(head)
    for keys in (1, 3, 4, 5, 15, 16, 17, 33):
        for queries in (1, 4):
            q = torch.randn(3, 2, queries, head, generator=g) * 2
            buffer = torch.randn(3, keys + 3, 2, 2 * head, generator=g) * 2
            k = buffer[:, :keys, :, :head].transpose(1, 2)  # (3, 2, keys, head), strided
            v = buffer[:, :keys, :, head:].transpose(1, 2)
            mask = torch.rand(3, 2, queries, keys, generator=g) > 0.3
            mask[..., 0] = True
            mask[2, 1] = False  # a (row, head) with no key: zeros
            for m in (None, mask):
                out = native.decode_attention(q, k, v, m)
                ref = _attention_reference(q, k, v, m)
                torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-5)
                # heads inner in memory: merging them back into rows is a view, not a copy
                merged = out.transpose(1, 2).reshape(3 * queries, 2 * head)
                assert merged.data_ptr() == out.data_ptr() and merged._base is not None


@pytest.mark.parametrize("head", [8, 64])
def test_cached_self_attention_gives_decode_attention_on_the_gathered_cache(head: int) -> None:
    _native_or_skip()
    g = torch.Generator().manual_seed(head)
    n, rows, capacity, h, t = 6, 8, 10, 2, 5
    kb, vb = (torch.randn(rows, capacity, h, head, generator=g) for _ in range(2))
    lineage = torch.randint(0, rows, (n, capacity), generator=g)
    qkv = torch.randn(n, 3, h, 1, head, generator=g)
    q, k, v = qkv.unbind(1)  # strided views, as the engine's
    before = kb.clone(), vb.clone()
    out = native.cached_self_attention(q, k, v, kb, vb, lineage, t)
    assert torch.equal(lineage[:, t], torch.arange(n))
    assert torch.equal(kb[:n, t], k.squeeze(2)) and torch.equal(vb[:n, t], v.squeeze(2))
    assert torch.equal(kb[n:], before[0][n:]) and torch.equal(kb[:, :t], before[0][:, :t])
    positions = torch.arange(t + 1)
    keys = kb[lineage[:, : t + 1], positions]  # (N, t + 1, H, K): row i's positions
    values = vb[lineage[:, : t + 1], positions]
    ref = _attention_reference(q, keys.transpose(1, 2), values.transpose(1, 2), None)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=2e-5)
    lineage[1, 2] = rows  # a row the buffers do not have
    with pytest.raises(RuntimeError, match="lineage holds a row out of range"):
        native.cached_self_attention(q, k, v, kb, vb, lineage, t)
    with pytest.raises(RuntimeError, match="past the buffers' capacity"):
        native.cached_self_attention(q, k, v, kb, vb, lineage, capacity)

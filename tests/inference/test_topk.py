"""chunked_topk against torch.topk."""

from __future__ import annotations

import pytest
import torch

from transduce.inference.topk import chunked_topk


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("v", [8000, 8000 + 37, 4 * 8 * 64])
def test_equals_torch_topk_on_distinct_values(k: int, v: int) -> None:
    g = torch.Generator().manual_seed(v + k)
    scores = torch.randn(33, v, generator=g).log_softmax(-1)
    values, indices = chunked_topk(scores, k)
    ref = scores.topk(k, dim=1)
    assert torch.equal(values, ref.values)
    assert torch.equal(indices, ref.indices)


def test_best_entries_in_one_chunk_and_in_the_tail() -> None:
    # The adversarial layouts of the chunk argument: all k best in one chunk (the other kept
    # chunks hold none of them), and the best entries past the last whole chunk.
    scores = torch.full((3, 1000), -5.0)
    scores[0, 128:132] = torch.tensor([1.0, 4.0, 3.0, 2.0])  # chunk 2 of 64
    scores[1, 990:994] = torch.tensor([4.0, 3.0, 2.0, 1.0])  # tail: 1000 = 15 * 64 + 40
    scores[2, [5, 700, 999, 64]] = torch.tensor([4.0, 3.0, 2.0, 1.0])
    values, indices = chunked_topk(scores, 4)
    assert values.tolist() == [[4.0, 3.0, 2.0, 1.0]] * 3
    assert indices.tolist() == [[129, 130, 131, 128], [990, 991, 992, 993], [5, 700, 999, 64]]


def test_ties_and_minus_infinity_keep_torch_topk_values() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (16, 4096), generator=g).float()  # many ties
    scores[0] = float("-inf")
    scores[1, 7:] = float("-inf")  # fewer finite entries than k
    values, indices = chunked_topk(scores, 8)
    assert torch.equal(values, scores.topk(8, dim=1).values)
    assert torch.equal(scores.gather(1, indices), values)  # each index holds its value
    assert all(len(set(row)) == 8 for row in indices.tolist())  # no entry twice


def test_short_rows_fall_back_to_topk() -> None:
    scores = torch.randn(5, 100)
    values, indices = chunked_topk(scores, 4)
    ref = scores.topk(4, dim=1)
    assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)

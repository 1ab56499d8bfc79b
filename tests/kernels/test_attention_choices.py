"""The attention rules asked by the model and the engine: when a mask can be left out, and which
path the queries of a beam take."""

from __future__ import annotations

import torch

from transduce.kernels import all_attendable, grouped_queries_path


def test_a_mask_is_left_out_only_where_every_key_may_be_attended_on_the_cpu() -> None:
    assert all_attendable(torch.ones(2, 3, dtype=torch.bool))
    assert not all_attendable(torch.tensor([[True, False]]))
    # elsewhere the check would wait for the device: masked anyway ("meta" stands in for a GPU)
    assert not all_attendable(torch.ones(2, 3, dtype=torch.bool, device="meta"))


def test_beams_take_the_formula_on_the_cpu_unless_a_path_is_asked_for() -> None:
    query = torch.zeros(1, 2, 4, 8)  # (B, H, G, K)
    assert grouped_queries_path(query) == "formula"
    assert grouped_queries_path(query, "fused") == "fused"
    assert grouped_queries_path(query.to("meta")) == "auto"

"""Attention weights on request: what the model computes, every layer and head, rows summing to
1."""

from __future__ import annotations

import torch
from model_testkit import tiny_batch, tiny_model

from transduce.model import AttentionRecord


def test_recorded_pass_equals_the_plain_one_and_rows_sum_to_one() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    with torch.no_grad():
        plain = model(src, tgt)
        record = AttentionRecord()
        memory, valid = model.encode(src, record=record)
        recorded = model.decode(tgt, memory, valid, record=record)
    # the recorded pass computes its output from the weights it keeps
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    n_layers, h = model.config.n_layers, model.config.n_heads
    (b, s), t = src.shape, tgt.size(1)
    assert [w.shape for w in record.encoder] == [(b, h, s, s)] * n_layers
    assert [w.shape for w in record.decoder] == [(b, h, t, t)] * n_layers
    assert [w.shape for w in record.cross] == [(b, h, t, s)] * n_layers
    for w in record.encoder + record.cross:
        assert torch.all(w.masked_select(~valid[:, None, None, :]) == 0)  # padded keys
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    for w in record.decoder:  # causal: no weight on later positions
        assert torch.all(w.triu(1) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_recording_beams_keeps_one_row_per_hypothesis() -> None:
    model = tiny_model()
    src, tgt = tiny_batch()
    g = 2
    with torch.no_grad():
        memory, valid = model.encode(src)
        rows = tgt.repeat_interleave(g, dim=0)  # (B*G, T), sentence-major
        record = AttentionRecord()
        model.decode(rows, memory, valid, record=record)
        single = AttentionRecord()
        model.decode(tgt, memory, valid, record=single)
    b, t, s = src.size(0), tgt.size(1), src.size(1)
    assert record.cross[0].shape == (b * g, model.config.n_heads, t, s)
    # hypothesis g of sentence i has sentence i's weights
    torch.testing.assert_close(record.cross[-1][::g], single.cross[-1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(record.cross[-1][1::g], single.cross[-1], atol=1e-6, rtol=1e-5)

"""next_token_log_probs and first_forced_step against hand-built expectations."""

import torch
import torch.nn.functional as F

from transduce.data.vocab import BOS, EOS, PAD, UNK
from transduce.inference.common import first_forced_step, next_token_log_probs


def test_pad_and_bos_are_never_generated_and_the_rest_is_log_softmax() -> None:
    logits = torch.randn(3, 9)
    out = next_token_log_probs(logits, None)
    expected = F.log_softmax(logits, dim=-1)
    expected[:, PAD] = expected[:, BOS] = float("-inf")  # not renormalised
    assert torch.equal(out, expected)
    assert torch.isfinite(out[:, [EOS, UNK, 4, 8]]).all()


def test_forced_rows_keep_only_eos_with_its_own_log_prob() -> None:
    logits = torch.randn(3, 9)
    out = next_token_log_probs(logits, torch.tensor([False, True, False]))
    plain = next_token_log_probs(logits, None)
    assert torch.equal(out[[0, 2]], plain[[0, 2]])
    assert out[1, EOS] == plain[1, EOS]
    others = torch.ones(9, dtype=torch.bool)
    others[EOS] = False
    assert torch.isinf(out[1, others]).all()
    assert torch.equal(next_token_log_probs(logits, torch.zeros(3, dtype=torch.bool)), plain)


def test_low_precision_logits_give_float32() -> None:
    logits = torch.randn(2, 9).bfloat16()
    out = next_token_log_probs(logits, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[:, 2:], F.log_softmax(logits.float(), -1)[:, 2:])


def test_first_forced_step_is_the_shortest_limit() -> None:
    assert first_forced_step(torch.tensor([7, 3, 9])) == 3
    assert first_forced_step(torch.tensor([0])) == 0

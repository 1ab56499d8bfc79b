"""Beam search's choice of a step in one native call on CPUs (kernels/native/beam_select.cpp).

A step of ``inference.beam`` chooses, from each hypothesis's P best next tokens, the W best
extensions of each sentence, which of them finish, which sentences are done, and the cache rows
the next step reads: ~30 PyTorch operators on (sentences, beam) tensors, each costing more to
call than its work on a CPU. The native kernel does it in one pass, with the same numbers bit for
bit but for exact ties of finite scores at the beam's edge, where it takes the first candidate
and ``torch.topk`` any (``inference.beam_choice.choose_in_torch`` is the PyTorch form and the
reference;
tests/inference/test_beam_select.py). Where it runs is a kernels rule (``runs``): CPUs with
the native kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from transduce.kernels import native


class BeamChoice(NamedTuple):
    """A beam search step's choice for its n sentences of W slots (beam.py's names)."""

    top: Tensor  # (n, W) the W best extensions' log-probabilities, best first
    parent: Tensor  # (n, W) the slot each extends
    tok: Tensor  # (n, W) their tokens
    ended: Tensor  # (n, W) bool: entered the beam and ended (EOS)
    normalised: Tensor  # (n, W) top / lp(step + 1), read where ended
    finished_scores: Tensor  # (n, W) each sentence's W best finished scores after the step
    n_finished: Tensor  # (n,) each sentence's finished count after the step
    keep: Tensor | None  # (n',) the sentences that go on, None where all do
    rows: Tensor  # (n'*W,) the cache rows the next step reads
    next_tok: Tensor  # (n'*W, 1) their new tokens
    next_scores: Tensor  # (n', W) their live log-probabilities, -inf where none
    any_ended: bool  # whether any candidate ended


def runs(device: torch.device) -> bool:
    """Whether beam search's choice is made by the native kernel on ``device``: CPUs where the
    native kernels are built (on GPUs PyTorch's operators queue without waiting)."""
    return device.type == "cpu" and native.available()


def beam_select(
    row_top: Tensor,
    row_tok: Tensor,
    scores: Tensor,
    sentences: tuple[Tensor, Tensor, Tensor, Tensor],
    step: int,
    lp: tuple[float, float],
    nbest: int,
    eos: int,
    in_place: bool,
) -> BeamChoice:
    """row_top, row_tok (n*W, P) each hypothesis's P best next log-probabilities and tokens,
    scores (n, W) the live log-probabilities, ``sentences`` (n_finished (n,), finished_scores
    (n, W), lp_max_len (n,), max_lens (n,)), ``lp`` the length penalties of step + 1 and step + 2
    tokens -> the step's choice; ``in_place``: where every sentence goes on, hypotheses take
    their parents' slots (``inference.beam_choice.parent_slots``)."""
    n = scores.size(0)
    n_finished, finished_scores, lp_max_len, max_lens = sentences
    numbers = (step, lp[0], lp[1], nbest, eos, in_place)
    *tensors, any_ended = native.beam_select(
        row_top, row_tok, scores, n_finished, finished_scores, lp_max_len, max_lens, numbers
    )
    top, parent, tok, ended, normalised, fin, n_fin, keep, rows, next_tok, next_scores = tensors
    return BeamChoice(
        top,
        parent,
        tok,
        ended,
        normalised,
        fin,
        n_fin,
        None if keep.numel() == n else keep,
        rows,
        next_tok,
        next_scores,
        bool(any_ended),
    )


__all__ = ["BeamChoice", "beam_select", "runs"]

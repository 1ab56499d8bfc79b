"""``generate``: decode a batch with the settings of a ``DecodeConfig`` (greedy when beam is 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from transduce.inference.beam import Hypothesis, beam_search
from transduce.inference.common import max_output_lengths
from transduce.inference.greedy import greedy_decode, greedy_search
from transduce.inference.length_penalty import length_penalty

if TYPE_CHECKING:
    from transduce.config import DecodeConfig


def generate(
    model, src: Tensor, decode_cfg: DecodeConfig, nbest: int = 1
) -> list[list[Hypothesis]]:
    """src (B, S) -> per sentence its ``nbest`` hypotheses, best first.

    Greedy search when ``decode_cfg.beam == 1`` (then ``nbest`` must be 1; it returns what
    ``beam_search(beam=1)`` would, scores included), else beam search with ``decode_cfg.alpha``.
    Sentences are decoded ``decode_cfg.decode_batch`` at a time. Call ``model.eval()`` first.
    """
    if decode_cfg.beam == 1 and nbest != 1:
        raise ValueError(f"greedy decoding (beam 1) gives one hypothesis, not nbest={nbest}")
    out: list[list[Hypothesis]] = []
    for chunk in src.split(decode_cfg.decode_batch):
        if decode_cfg.beam == 1:
            max_lens = max_output_lengths(chunk, decode_cfg.max_len_offset, None)
            for tokens, log_prob in greedy_decode(model, chunk, max_lens=max_lens):
                score = log_prob / length_penalty(len(tokens) + 1, decode_cfg.alpha)
                out.append([Hypothesis(tokens=tokens, score=score, log_prob=log_prob)])
        else:
            out.extend(
                beam_search(
                    model,
                    chunk,
                    beam=decode_cfg.beam,
                    alpha=decode_cfg.alpha,
                    max_len_offset=decode_cfg.max_len_offset,
                    nbest=nbest,
                )
            )
    return out


__all__ = ["Hypothesis", "beam_search", "generate", "greedy_search"]

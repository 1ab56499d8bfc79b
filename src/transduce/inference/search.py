"""``generate``: decode a batch with the settings of a ``DecodeConfig`` (greedy when beam is 1);
``predict_ids``: greedy outputs of id lists, batched."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from transduce import kernels
from transduce.architectures import Seq2Seq
from transduce.data.batching import collate
from transduce.inference.beam import Hypothesis, beam_search
from transduce.inference.common import max_output_lengths
from transduce.inference.contract import DecodableModel
from transduce.inference.engine import DecodingModel
from transduce.inference.engine.static import StaticDecoder
from transduce.inference.greedy import greedy_decode, greedy_search
from transduce.inference.length_penalty import length_penalty
from transduce.inference.sampling import sample
from transduce.model.transformer import Transformer

if TYPE_CHECKING:
    from transduce.config import DecodeConfig


def generate(
    model: DecodableModel[Any], src: Tensor, decode_cfg: DecodeConfig, nbest: int = 1
) -> list[list[Hypothesis]]:
    """src (B, S) -> per sentence its ``nbest`` hypotheses, best first.

    Greedy search when ``decode_cfg.beam == 1`` (then ``nbest`` must be 1; it returns what
    ``beam_search(beam=1)`` would, scores included, and no hypothesis where a constraint left
    no token with a finite log-probability), else beam search with ``decode_cfg.alpha``;
    with ``decode_cfg.sampling``, ``nbest`` samples per sentence instead (``inference.sampling``;
    a generator seeded with ``sampling_seed`` per call, so a call's samples depend on the seed
    and the sentences of ``src``).
    Sentences are decoded ``decode_cfg.decode_batch`` at a time. Call ``model.eval()`` first.
    """
    if decode_cfg.sampling:  # nbest samples per sentence; the draws seeded per call
        generator = torch.Generator(device=src.device).manual_seed(decode_cfg.sampling_seed)
        out_samples: list[list[Hypothesis]] = []
        for chunk in src.split(decode_cfg.decode_batch):
            samples = sample(
                model,
                chunk,
                samples=nbest,
                temperature=decode_cfg.temperature,
                top_k=decode_cfg.top_k,
                top_p=decode_cfg.top_p,
                alpha=decode_cfg.alpha,
                generator=generator,
                max_len_offset=decode_cfg.max_len_offset,
            )
            out_samples.extend(samples)
        return out_samples
    if decode_cfg.beam == 1 and nbest != 1:
        raise ValueError(f"greedy decoding (beam 1) gives one hypothesis, not nbest={nbest}")
    out: list[list[Hypothesis]] = []
    for chunk in src.split(decode_cfg.decode_batch):
        if decode_cfg.beam == 1:
            max_lens = max_output_lengths(chunk, decode_cfg.max_len_offset, None)
            for tokens, log_prob in greedy_decode(model, chunk, max_lens=max_lens):
                if not math.isfinite(log_prob):  # a token no constraint allowed: none, as beam's
                    out.append([])
                    continue
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


def searchable(model: Seq2Seq, *, int8: bool = False, graphs: bool = False) -> DecodableModel[Any]:
    """What searches should run for ``model``: a Transformer's inference engine (a snapshot of
    its weights: make a new one after they change), any other model itself. ``int8``: the
    engine's projections in int8 (``DecodingModel``). ``graphs``: the engine's steps on static
    buffers replayed as CUDA graphs (``engine.static.StaticDecoder``), for a Transformer on a
    CUDA device that counts positions in tokens (``graphs_apply``). Either is a ValueError
    where it cannot be. ``Translator.load``, ``of_model`` and ``load_ensemble`` ask for graphs
    wherever they apply (measured faster on a GPU, a file's first pass and its captures
    included: benchmarks/RESULTS.md)."""
    if not isinstance(model, Transformer):
        if int8 or graphs:
            what = "int8 decoding" if int8 else "decoding on CUDA graphs"
            raise ValueError(f"{what} runs on the Transformer's engine, not {type(model).__name__}")
        return model
    engine = DecodingModel(model, int8=int8)
    return StaticDecoder(engine, graphs=True) if graphs else engine


def graphs_apply(model: Seq2Seq) -> bool:
    """Whether ``searchable(model, graphs=True)`` takes ``model``: a Transformer counting
    positions in tokens (not the parser's word slots), its weights on a device that captures
    CUDA graphs."""
    return (
        isinstance(model, Transformer)
        and model.decoder.word_slot is None
        and kernels.graphs_capture(model.generator.weight.device)
    )


def predict_ids(
    model: DecodableModel[Any],
    sources: Sequence[list[int]],
    *,
    batch_size: int,
    max_len_offset: int,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Greedy outputs (ids without BOS/EOS) of source id lists, in input order, ``batch_size``
    sentences at a time on ``device``. Call ``model.eval()`` first."""
    out: list[list[int]] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        src = collate([(s, []) for s in chunk]).src.to(device)
        out.extend(greedy_search(model, src, max_len_offset=max_len_offset))
    return out


__all__ = [
    "Hypothesis",
    "beam_search",
    "generate",
    "graphs_apply",
    "greedy_search",
    "predict_ids",
    "searchable",
]

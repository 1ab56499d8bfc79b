"""Decoding outside the model: greedy and beam search on the model's decoding contract.

Only ``model.encode(src) -> (memory, src_valid)``, ``model.new_cache()``,
``model.decode(new_tgt, memory, src_valid, cache) -> logits``, ``cache.reorder(index)``
(hypothesis rows) and ``cache.select_sources(index)`` (sentence rows) are used, so any object
with that contract can be decoded (the tests drive a scripted fake model). Beam search passes
``decode`` B*W target rows (row i*W + w is beam w of sentence i) with B rows of memory: what
belongs to a source sentence is never copied per beam.
Conventions shared by both searches (length limits, forced EOS, tokens never generated) are in
``transduce.inference.common``; the beam search algorithm and its stopping bound in
``transduce.inference.beam``. On the same contract: sampling (``inference.sampling``), forced
decoding (``inference.scoring``), ensembles (``inference.ensemble``) and target prefixes
(``inference.prefix``), the last two as wrappers that keep the contract.
"""

from transduce.inference.beam import Hypothesis, beam_search
from transduce.inference.greedy import greedy_search
from transduce.inference.length_penalty import length_penalty
from transduce.inference.search import generate

__all__ = ["Hypothesis", "beam_search", "generate", "greedy_search", "length_penalty"]

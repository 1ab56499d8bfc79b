"""Beam search reads the device once a step: on a GPU every read of a tensor's values waits for
the kernels queued before it, so the finished hypotheses stay on the device until the end
(``beam._Finished``) and only the sentences still searched are read each step."""

import collections
import sys
from pathlib import Path

import pytest
import torch
from inference_testkit import random_sources, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from transduce import kernels
from transduce.inference import beam_search
from transduce.inference.beam import PARENT_SLOTS_MIN_ROWS

READS = ("aten.is_nonzero", "aten.item", "aten.nonzero", "aten._local_scalar_dense")
# beam search's own files: the search and its choice of a step
BEAM_PY = {
    str(Path(sys.modules[name].__file__))
    for name in ("transduce.inference.beam", "transduce.inference.beam_choice")
}


class ReadsByBeamSearch(TorchDispatchMode):
    """Counts the operators that read a tensor's values back into Python and are called from
    beam search's files (not from the model, nor from helpers they call)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if str(func).startswith(READS):
            frame = sys._getframe(1)
            while frame is not None and "transduce" not in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename in BEAM_PY:
                self.reads[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed", [0, 2])
def test_one_read_of_the_device_a_step(monkeypatch, seed):
    # as on a GPU: no reads taken for cheap (parent slots, the cache's moved rows)
    monkeypatch.setattr(kernels, "reads_are_cheap", lambda device: False)
    model = tiny_model(seed)
    src = random_sources(torch.Generator().manual_seed(3), [4, 2, 6, 1, 3])
    steps = 0
    decode = model.decode

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003
        nonlocal steps
        steps += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(model, "decode", counted)
    # tolist reads the device without dispatching an operator: counted where beam.py calls it,
    # but for the end's reads of the results (``_Finished.best``)
    tolist = torch.Tensor.tolist
    lists = collections.Counter()

    def counted_tolist(self):  # noqa: ANN001, ANN202
        caller = sys._getframe(1).f_code
        if caller.co_filename in BEAM_PY and caller.co_name != "best":
            lists[caller.co_name] += 1
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    with ReadsByBeamSearch() as mode:
        out = beam_search(model, src, beam=4, max_len_offset=12, nbest=2)
    assert steps > 10  # long enough for finished hypotheses on many steps
    assert sum(len(h) for h in out) == 2 * len(out)
    # one read a step (which sentences go on, whether any hypothesis ended) and one at the
    # start (the longest output)
    assert sum(mode.reads.values()) + sum(lists.values()) == steps + 1, (mode.reads, lists)
    assert lists == {"_kept": steps}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_read_as_on_a_gpu_gives_the_same_outputs(monkeypatch, seed):
    """The GPU's way (the finished tokens written after the step's read, only when some ended;
    no parent slots) and the CPU's way find the same hypotheses with the same scores."""
    model = tiny_model(seed)
    lengths = [4, 2, 6, 1, 3, 5] * 3  # 18 sentences x beam 4: the CPU's parent slots in use
    assert len(lengths) * 4 >= PARENT_SLOTS_MIN_ROWS
    src = random_sources(torch.Generator().manual_seed(seed + 7), lengths)
    ref = beam_search(model, src, beam=4, max_len_offset=12, nbest=3)
    monkeypatch.setattr(kernels, "reads_are_cheap", lambda device: False)
    out = beam_search(model, src, beam=4, max_len_offset=12, nbest=3)
    assert [[h.tokens for h in hs] for hs in out] == [[h.tokens for h in hs] for hs in ref]
    assert [[h.score for h in hs] for hs in out] == [[h.score for h in hs] for hs in ref]

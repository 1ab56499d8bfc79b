"""What the recurrent decoder keeps between decoding steps, reorderable for beam search."""

from __future__ import annotations

from torch import Tensor


class RecurrentCache:
    """The decoder's state after ``length`` target positions.

    Hypothesis rows (N = B*G, sentence-major; ``reorder`` selects them):
        h, c   (L, N, H) the LSTM state of each layer, in ``nn.LSTM``'s layout (layers first)
        feed   (N, H) the last attentional state h~_{t-1}, with input feeding (else None)
    Source rows (B; ``select_sources`` selects them):
        keys   (B, S, H) the source side of the attention score, made once per sentence

    Memory itself is not kept: ``decode`` is handed it at every step. Everything is None until
    the first ``decode``, which starts the state from memory (``RecurrentDecoder.initial_state``).
    """

    def __init__(self) -> None:
        self.h: Tensor | None = None
        self.c: Tensor | None = None
        self.feed: Tensor | None = None
        self.keys: Tensor | None = None
        self.length = 0  # target positions already decoded

    def reorder(self, index: Tensor) -> None:
        """Keep hypothesis rows ``index`` (LongTensor (N_new,)), in that order; rows may repeat
        (B sentences -> B*W beams)."""
        if self.h is not None and self.c is not None:
            self.h = self.h.index_select(1, index)  # (L, N, H) -> (L, N_new, H)
            self.c = self.c.index_select(1, index)
        if self.feed is not None:
            self.feed = self.feed.index_select(0, index)  # (N, H) -> (N_new, H)

    def select_sources(self, index: Tensor) -> None:
        """Keep source-sentence rows ``index`` (LongTensor (B_new,)) of the attention keys."""
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)  # (B, S, H) -> (B_new, S, H)


__all__ = ["RecurrentCache"]

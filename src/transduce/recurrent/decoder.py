"""The attentional LSTM decoder (Luong et al. 2015), with or without input feeding."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transduce import kernels
from transduce.recurrent.attention import Attention
from transduce.recurrent.cache import RecurrentCache
from transduce.recurrent.config import AttentionKind

State = tuple[Tensor, Tensor]  # (h, c), each (L, N, H)


def masked_mean(memory: Tensor, src_valid: Tensor) -> Tensor:
    """memory (B, S, H), src_valid (B, S) -> the mean over the real tokens (B, H); 0 for a
    sentence without any."""
    count = src_valid.sum(dim=1, keepdim=True).clamp(min=1)  # (B, 1)
    return (memory * src_valid[:, :, None]).sum(dim=1) / count


class RecurrentDecoder(nn.Module):
    """Target embedding and dropout, an L-layer ``nn.LSTM``, attention over memory, and the
    attentional state h~_t = tanh(W_c [c_t; h_t]) (Luong eq. 5), dropout applied.

    Initial state: h_0 of every layer = tanh(W_init mean_s(memory) + b) over the real source
    tokens (the mean-annotation start of Nematus, Sennrich et al. 2017), c_0 = 0, h~_0 = 0. It is
    made from memory alone, so memory can stay a single tensor.

    With ``input_feeding`` the LSTM input at t is [embedding(y_t); h~_{t-1}] (Luong section 3.3),
    a loop over the positions; without it the LSTM runs fused over all T positions and attention
    is computed for all of them at once. The fed h~ is the one after dropout (as OpenNMT-py).
    """

    def __init__(
        self,
        embed: nn.Embedding,
        *,
        hidden_size: int,
        n_layers: int,
        dropout: float,
        attention: AttentionKind,
        input_feeding: bool,
    ) -> None:
        super().__init__()
        self.embed = embed
        self.hidden_size = hidden_size
        self.n_layers = n_layers
        self.input_feeding = input_feeding
        self.dropout = nn.Dropout(dropout)
        feed = hidden_size if input_feeding else 0
        self.lstm = nn.LSTM(
            embed.embedding_dim + feed,
            hidden_size,
            n_layers,
            batch_first=True,
            dropout=dropout if n_layers > 1 else 0.0,
        )
        self.attention = Attention(attention, hidden_size)
        self.combine = nn.Linear(2 * hidden_size, hidden_size, bias=False)  # W_c
        self.init_state = nn.Linear(hidden_size, n_layers * hidden_size)  # W_init, b

    def initial_state(self, memory: Tensor, src_valid: Tensor) -> State:
        """memory (B, S, H), src_valid (B, S) -> (h_0, c_0), each (L, B, H)."""
        b, h = memory.size(0), self.hidden_size
        h0 = torch.tanh(self.init_state(masked_mean(memory, src_valid)))  # (B, L*H)
        h0 = h0.view(b, self.n_layers, h).transpose(0, 1).contiguous()  # (B, L*H) -> (L, B, H)
        return h0, torch.zeros_like(h0)

    def forward(
        self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: RecurrentCache | None = None
    ) -> Tensor:
        """tgt (N, T) shifted-right target ids, memory (B, S, H), src_valid (B, S) -> h~ (N, T, H).

        N = B*G for G hypotheses per sentence (row i*G + g belongs to sentence i). With a cache,
        ``tgt`` holds the positions after ``cache.length`` and the cache moves on past them.
        """
        n, b = tgt.size(0), memory.size(0)
        if n % b:
            raise ValueError(f"{n} target rows are not a multiple of {b} source rows")
        if cache is not None and cache.h is not None and cache.c is not None:
            state, feed, keys = (cache.h, cache.c), cache.feed, cache.keys
        else:
            state, feed, keys = self._start(n, memory, src_valid)
        assert keys is not None  # made with the first state
        x = self.dropout(self.embed(tgt))  # (N, T, E)
        if self.input_feeding:
            assert feed is not None  # h~_0 = 0 from _start
            out, state, feed = self._steps(x, state, feed, keys, memory, src_valid)
        else:
            h, state = kernels.lstm(self.lstm, x, state)  # (N, T, H): fused over T positions
            out = self._attentional(h, keys, memory, src_valid)
        if cache is not None:
            (cache.h, cache.c), cache.feed, cache.keys = state, feed, keys
            cache.length += tgt.size(1)
        return out

    def _start(
        self, n: int, memory: Tensor, src_valid: Tensor
    ) -> tuple[State, Tensor | None, Tensor]:
        """The state before the first target position, expanded to the N hypothesis rows, the
        zero h~_0 (input feeding) and the attention keys (B, S, H), one row per sentence."""
        h0, c0 = self.initial_state(memory, src_valid)  # (L, B, H) each
        g = n // memory.size(0)
        if g > 1:  # the G hypotheses of a sentence start alike; memory itself is not copied
            rows = torch.arange(memory.size(0), device=memory.device).repeat_interleave(g)
            h0, c0 = h0.index_select(1, rows), c0.index_select(1, rows)  # (L, B, H) -> (L, N, H)
        feed = memory.new_zeros(n, self.hidden_size) if self.input_feeding else None
        return (h0, c0), feed, self.attention.keys(memory)

    def _steps(
        self, x: Tensor, state: State, feed: Tensor, keys: Tensor, memory: Tensor, src_valid: Tensor
    ) -> tuple[Tensor, State, Tensor]:
        """Input feeding, one position at a time: x (N, T, E), feed (N, H) = h~_{t-1} ->
        (h~ (N, T, H), the last state, the last h~ (N, H))."""
        outs = []
        for t in range(x.size(1)):
            step_in = torch.cat([x[:, t], feed], dim=-1)[:, None]  # (N, E+H) -> (N, 1, E+H)
            h, state = kernels.lstm(self.lstm, step_in, state)  # (N, 1, H)
            out = self._attentional(h, keys, memory, src_valid)  # (N, 1, H)
            feed = out[:, 0]  # (N, 1, H) -> (N, H)
            outs.append(out)
        return torch.cat(outs, dim=1), state, feed  # (N, T, H)

    def _attentional(self, h: Tensor, keys: Tensor, memory: Tensor, src_valid: Tensor) -> Tensor:
        """h (N, T, H) top LSTM states -> h~ = dropout(tanh(W_c [c_t; h_t])) (N, T, H)."""
        context, _ = self.attention(h, keys, memory, src_valid)  # (N, T, H)
        return self.dropout(torch.tanh(self.combine(torch.cat([context, h], dim=-1))))


__all__ = ["RecurrentDecoder", "masked_mean"]

"""The bidirectional LSTM encoder: embeddings -> fused multi-layer biLSTM -> memory."""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from transduce import kernels


class RecurrentEncoder(nn.Module):
    """Embedding, dropout, an L-layer bidirectional ``nn.LSTM`` (H per direction) run on packed
    sequences, and a bias-free projection of the two directions [h_fwd; h_bwd] (2H) to H.

    Packing makes each sentence's states those of the sentence alone: the backward direction
    starts at the last real token, not at the padding, and padding positions of memory are 0.
    """

    def __init__(
        self, embed: nn.Embedding, hidden_size: int, n_layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.embed = embed
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            embed.embedding_dim,
            hidden_size,
            n_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if n_layers > 1 else 0.0,  # between layers; nn.LSTM warns at L = 1
        )
        self.proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)

    def forward(self, src: Tensor, src_valid: Tensor) -> Tensor:
        """src (B, S) token ids, src_valid (B, S) bool (True on real tokens, a prefix of each
        row: right padding) -> memory (B, S, H), zero at padding (but for the one token run
        for an empty source)."""
        # packing needs the lengths on the CPU (one device sync on a GPU); an empty source is
        # run as one token, which attention then masks (masked_softmax gives it no weight)
        lengths = src_valid.sum(dim=1).clamp(min=1).cpu()  # (B,)
        x = self.dropout(self.embed(src))  # (B, S, E)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = kernels.lstm(self.lstm, packed)  # (the CPU's bfloat16 rule: kernels)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))  # (B, S, 2H)
        return self.proj(out)  # (B, S, 2H) -> (B, S, H)


__all__ = ["RecurrentEncoder"]

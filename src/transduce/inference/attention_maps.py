"""The attention weights of a trained model on one sentence pair, drawn or read as alignments.

``attention_maps`` runs the model once, teacher-forced on the pair, and keeps every layer's and
head's weights: encoder self-attention, decoder self-attention and encoder-decoder attention.
Row t of the decoder's maps is the decoder state that predicts output token t (the t-th piece,
then EOS), as fairseq and CTranslate2 report attention; the decoder's keys are its inputs (BOS,
then the pieces). ``word_alignment`` turns encoder-decoder attention into a word alignment in
Pharaoh format (``i-j``: source word i, target word j, over whitespace-separated words of the
detokenized texts).

A model of two vocabularies (``VocabPair``: every parser, a translation model with
``shared_vocab: false``) reads the source with the source vocabulary and the target with the
target one; ``sides`` gives the two (the same one twice for a shared vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import Tensor

from transduce.architectures import Seq2Seq
from transduce.data.batching import collate
from transduce.data.vocab import SPECIALS, Vocab, sides
from transduce.errors import UserError
from transduce.inference.common import MAX_SENTENCE_TOKENS
from transduce.inference.search import predict_ids, searchable
from transduce.model.attention import AttentionRecord
from transduce.model.transformer import Transformer

Kind = Literal["cross", "encoder", "decoder"]
BOS_TOKEN, EOS_TOKEN = SPECIALS[1], SPECIALS[2]


@dataclass(frozen=True)
class AttentionMaps:
    """One sentence pair's attention weights, every layer and head (float32, on the CPU).

    source (S,): the source pieces and EOS; inputs (T,): BOS and the target pieces; outputs (T,):
    the target pieces and EOS. encoder (L, H, S, S), decoder (L, H, T, T), cross (L, H, T, S).
    """

    source: list[str]
    inputs: list[str]
    outputs: list[str]
    source_ids: list[int]
    target_ids: list[int]
    encoder: Tensor
    decoder: Tensor
    cross: Tensor

    def of(self, kind: Kind) -> tuple[Tensor, list[str], list[str]]:
        """(weights (L, H, T_q, T_k), query tokens, key tokens) of ``kind``."""
        if kind == "encoder":
            return self.encoder, self.source, self.source
        if kind == "decoder":
            return self.decoder, self.outputs, self.inputs
        if kind == "cross":
            return self.cross, self.outputs, self.source
        raise UserError(f"attention kind {kind!r}: one of {', '.join(get_args(Kind))}")


def _pieces(vocab: Vocab, ids: list[int]) -> list[str]:
    to_piece = getattr(vocab, "id_to_piece", None)
    if to_piece is not None:
        return [to_piece(i) for i in ids]
    return [vocab.decode([i]) or f"<{i}>" for i in ids]


def _check_placed(side: str, ids: list[int], limit: int | None) -> None:
    """A UserError when ``ids`` and their EOS (or BOS) need more positions than ``limit`` (the
    learned positions') or tokens than ``MAX_SENTENCE_TOKENS``."""
    most = MAX_SENTENCE_TOKENS if limit is None else limit - 1
    if len(ids) > most:
        why = (
            f"this model's learned positions (max_positions={limit}) place at most {most}"
            if limit is not None
            else f"at most {most} are read (a whole text on one line?)"
        )
        raise UserError(f"the {side} has {len(ids)} subword tokens; {why}")


def _check_pair(source: object, target: object, max_len_offset: object) -> None:
    """A TypeError or UserError for a pair that is not text, or an offset that is not one."""
    if not isinstance(source, str) or not isinstance(target, str | None):
        raise TypeError("the source must be a str, and the target a str or None")
    if isinstance(max_len_offset, bool) or not isinstance(max_len_offset, int):
        raise TypeError(f"max_len_offset must be an int; got {max_len_offset!r}")
    if max_len_offset < 0:
        raise UserError(f"max_len_offset must be at least 0; got {max_len_offset}")


@torch.no_grad()
def attention_maps(
    model: Seq2Seq,
    vocab: Vocab,
    source: str,
    target: str | None = None,
    *,
    max_len_offset: int = 50,
) -> AttentionMaps:
    """The weights of ``model`` on ``source`` and ``target`` (None: the model's greedy output)."""
    if not isinstance(model, Transformer):
        raise UserError("attention maps are drawn of a Transformer (model.architecture)")
    model.eval()
    src_vocab, tgt_vocab = sides(vocab)
    _check_pair(source, target, max_len_offset)
    src_ids = src_vocab.encode(source.strip())
    if not src_ids:
        raise UserError("the source sentence is empty")
    cfg = model.config
    limit = cfg.max_positions if cfg.positional == "learned" else None  # + EOS / BOS each
    _check_placed("source", src_ids, limit)
    device = next(model.parameters()).device
    if target is None:
        if limit is not None:  # the decoder places BOS and n + 1 + offset outputs
            room = limit - len(src_ids) - 2
            if room < 0:
                raise UserError(
                    f"the source has {len(src_ids)} subword tokens; this model's learned "
                    f"positions (max_positions={limit}) leave no room for its output: give "
                    "--tgt, or a shorter source"
                )
            max_len_offset = min(max_len_offset, room)
        tgt_ids = predict_ids(
            searchable(model),
            [src_ids],
            batch_size=1,
            max_len_offset=max_len_offset,
            device=device,
        )[0]
    else:
        tgt_ids = tgt_vocab.encode(target.strip())
        _check_placed("target", tgt_ids, limit)
    batch = collate([(src_ids, tgt_ids)]).to(device)
    record = AttentionRecord()
    memory, valid = model.encode(batch.src, record=record)
    model.decode(batch.tgt_in, memory, valid, record=record)

    def stacked(maps: list[Tensor]) -> Tensor:
        return torch.stack([m[0] for m in maps]).float().cpu()  # L x (H, T, T') -> (L, H, T, T')

    pieces = _pieces(tgt_vocab, tgt_ids)
    return AttentionMaps(
        source=[*_pieces(src_vocab, src_ids), EOS_TOKEN],
        inputs=[BOS_TOKEN, *pieces],
        outputs=[*pieces, EOS_TOKEN],
        source_ids=src_ids,
        target_ids=tgt_ids,
        encoder=stacked(record.encoder),
        decoder=stacked(record.decoder),
        cross=stacked(record.cross),
    )


def word_index(vocab: Vocab, ids: list[int]) -> list[int]:
    """The 0-based whitespace-separated word of the detokenized text that each piece of ``ids``
    belongs to: the number of words in the text of the pieces up to it, less one. ``vocab``: the
    vocabulary of the side ``ids`` come from (``sides``)."""
    out = []
    for i in range(len(ids)):
        out.append(max(len(vocab.decode(ids[: i + 1]).split()) - 1, 0))
    return out


def word_alignment(maps: AttentionMaps, vocab: Vocab, layer: int = -1) -> list[tuple[int, int]]:
    """Pharaoh pairs (source word, target word), sorted: each target word aligned to the source
    word receiving the most encoder-decoder attention in ``layer``, averaged over its heads and
    summed over the pieces of both words (EOS on either side takes no part). ``vocab``: the
    model's, source words read with its source side and target words with its target side."""
    n_src, n_tgt = len(maps.source_ids), len(maps.target_ids)
    if not n_tgt:
        return []
    weights = maps.cross[layer].mean(0)[:n_tgt, :n_src]  # (H, T, S) -> (T, S), pieces only
    src_vocab, tgt_vocab = sides(vocab)
    src_words = torch.tensor(word_index(src_vocab, maps.source_ids))
    tgt_words = torch.tensor(word_index(tgt_vocab, maps.target_ids))
    # (T, S) -> (T, source words) -> (target words, source words): sums over pieces
    per_src = torch.zeros(n_tgt, int(src_words.max()) + 1).index_add_(1, src_words, weights)
    per_word = torch.zeros(int(tgt_words.max()) + 1, per_src.size(1)).index_add_(
        0, tgt_words, per_src
    )
    return [(int(i), j) for j, i in enumerate(per_word.argmax(1).tolist())]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """'0-0 1-2 ...' of (source, target) pairs."""
    return " ".join(f"{i}-{j}" for i, j in sorted(pairs))


# The most tokens a side of a drawn map may have: past it the labels overlap and the drawing
# takes minutes
DRAWN_MAX_TOKENS = 256


def draw_attention(
    model: Seq2Seq,
    vocab: Vocab,
    source: str,
    output: Path,
    *,
    target: str | None = None,
    kind: Kind = "cross",
    layer: int = -1,
    head: int | None = None,
    style: Literal["grid", "lines"] = "grid",
    max_len_offset: int = 50,
) -> Path:
    """Draw one layer's attention of ``kind`` on the pair into ``output`` (.png, .svg, .pdf or
    .html; ``transduce.plotting.plot_attention``): all heads, or ``head`` alone. Without a
    ``target``, the model's greedy output of at most source tokens + EOS + ``max_len_offset``; a
    side of over ``DRAWN_MAX_TOKENS`` tokens is refused (a map of it is unreadable)."""
    from transduce.plotting.attention import plot_attention

    _check_pair(source, target, max_len_offset)
    if kind not in get_args(Kind):  # before the model runs
        raise UserError(f"attention kind {kind!r}: one of {', '.join(get_args(Kind))}")
    src_vocab, tgt_vocab = sides(vocab)
    for side, text, side_vocab in (("source", source, src_vocab), ("target", target, tgt_vocab)):
        n = 0 if text is None else len(side_vocab.encode(text.strip()))
        if n > DRAWN_MAX_TOKENS:
            raise UserError(
                f"the {side} has {n} subword tokens; a map of more than {DRAWN_MAX_TOKENS} "
                "is unreadable: draw one sentence"
            )
    maps = attention_maps(model, vocab, source, target, max_len_offset=max_len_offset)
    weights, queries, keys = maps.of(kind)
    n_layers = weights.size(0)
    if not -n_layers <= layer < n_layers:
        raise UserError(f"--layer {layer}: this model has layers 0 to {n_layers - 1}")
    title = f"{kind} attention, layer {layer % n_layers}"
    return plot_attention(
        weights[layer].numpy(), queries, keys, output, style=style, heads=head, title=title
    )


__all__ = [
    "DRAWN_MAX_TOKENS",
    "AttentionMaps",
    "attention_maps",
    "draw_attention",
    "pharaoh",
    "sides",
    "word_alignment",
    "word_index",
]

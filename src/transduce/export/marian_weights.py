"""Weights between a Hugging Face ``MarianMTModel`` state dict and a transduce ``Transformer``
state dict (``transduce.export.huggingface``): names, the order of the model dimension, and the
order of the vocabulary.

* **The model dimension.** Marian's sinusoids put the sines of all frequencies first and the
  cosines after them (``[sin f_0 .. sin f_{D/2-1}, cos f_0 .. cos f_{D/2-1}]``), the paper's (and
  ``positional_table``'s) interleave them (``[sin f_0, cos f_0, sin f_1, ...]``), at the same
  frequencies. Every other part of the model is the same function when all its D-sized axes are
  permuted alike (layer norm normalises over the whole axis), so the weights are permuted:
  transduce's dimension ``2i`` is Marian's ``i`` and ``2i + 1`` Marian's ``D/2 + i``
  (``model_permutation``). The function is kept exactly; no table is stored.
* **The vocabulary.** transduce's ids are PAD 0, BOS 1, EOS 2, UNK 3, then the other pieces;
  Marian's are those of ``vocab.json`` (OPUS-MT: ``</s>`` 0, ``<unk>`` 1, ..., ``<pad>`` last).
  ``order[t]`` is the Marian id of transduce id ``t``; rows of embeddings, of the output layer
  and of the logits bias are taken in that order. Marian starts decoding from
  ``decoder_start_token_id`` (OPUS-MT: the pad id) where transduce starts from BOS, so when
  the start token is not a ``<s>`` piece, BOS is a new row: the decoder embedding of the start
  token, and in the output layer a row that never wins (logits bias ``NEVER``), so log-
  probabilities over the other ids are Marian's.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NEVER", "from_marian_state", "model_permutation", "to_marian_state"]

# the logits bias of the added BOS row: exp(NEVER - max) is 0 in float32, so the row takes no
# probability; finite, so that the logits stay finite in every dtype (float16 included)
NEVER = -1.0e4

_ATTENTION = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
_ENCODER_NORMS = ("self_attn_layer_norm", "final_layer_norm")
_DECODER_NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")


def model_permutation(d_model: int) -> Tensor:
    """(D,) long: transduce's dimension j is Marian's ``perm[j]`` (D even)."""
    half = d_model // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], 1).reshape(-1)


def _names(n_layers: int) -> list[tuple[str, str, str]]:
    """(transduce name, Marian name, kind) of every layer weight; kind says which axes are the
    model dimension: 'in' (columns), 'out' (rows and bias), 'norm'."""
    out: list[tuple[str, str, str]] = []
    for side, attns, norms in (
        ("encoder", (("self_attn", "self_attn"),), _ENCODER_NORMS),
        ("decoder", (("self_attn", "self_attn"), ("cross_attn", "encoder_attn")), _DECODER_NORMS),
    ):
        for i in range(n_layers):
            ours, theirs = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
            for attn, their_attn in attns:
                for w, proj in _ATTENTION.items():
                    kind = "out" if w == "w_o" else "in"
                    for p in ("weight", "bias"):
                        out.append(
                            (f"{ours}.{attn}.{w}.{p}", f"{theirs}.{their_attn}.{proj}.{p}", kind)
                        )
            for w, fc, kind in (("w_1", "fc1", "in"), ("w_2", "fc2", "out")):
                for p in ("weight", "bias"):
                    out.append((f"{ours}.ffn.{w}.{p}", f"{theirs}.{fc}.{p}", kind))
            for k, norm in enumerate(norms):
                for p in ("weight", "bias"):
                    out.append((f"{ours}.norms.{k}.{p}", f"{theirs}.{norm}.{p}", "norm"))
    return out


def _permuted(t: Tensor, kind: str, perm: Tensor) -> Tensor:
    """A Marian weight in transduce's dimension order (``perm`` from ``model_permutation``; its
    inverse turns a transduce weight into Marian's). 'in': the columns of a weight (its bias is
    not D-sized); 'out' and 'norm': the rows, or the entries of a vector."""
    if kind == "in":
        return t[:, perm] if t.dim() == 2 else t
    return t[perm]


def _rows(weight: Tensor, order: list[int | None], fill: Tensor | None) -> Tensor:
    """weight (V, D) rows in ``order``; a None row is ``fill`` (D,), or zeros."""
    rows = [
        weight[i]
        if i is not None
        else (fill if fill is not None else weight.new_zeros(weight.size(1)))
        for i in order
    ]
    return torch.stack(rows)


def from_marian_state(
    state: dict[str, Tensor],
    *,
    n_layers: int,
    src_order: list[int | None],
    tgt_order: list[int | None],
    start: int,
    tied: bool,
) -> dict[str, Tensor]:
    """A ``MarianMTModel`` state dict as the weights of a transduce ``Transformer`` (every
    alias of a tied weight given, with equal values): layers and embeddings in transduce's
    dimension order, vocabulary rows in ``src_order`` / ``tgt_order``. ``start`` is the Marian id
    of the decoder's start token, whose decoder embedding an added BOS row (None in
    ``tgt_order``) takes; ``tied``: the output layer is the decoder embedding."""
    d_model = state["model.encoder.embed_tokens.weight"].size(1)
    perm = model_permutation(d_model)
    out = {ours: _permuted(state[theirs], kind, perm) for ours, theirs, kind in _names(n_layers)}
    src_embed = state["model.encoder.embed_tokens.weight"][:, perm]  # (V_src, D)
    tgt_embed = state["model.decoder.embed_tokens.weight"][:, perm]  # (V_tgt, D)
    start_row = tgt_embed[start]  # (D,)
    same = src_order == tgt_order and torch.equal(src_embed, tgt_embed)  # one matrix, maybe tied
    out["encoder.embed.weight"] = _rows(src_embed, src_order, start_row if same else None)
    out["decoder.embed.weight"] = _rows(tgt_embed, tgt_order, start_row)
    lm_head = state["lm_head.weight"][:, perm]  # (V_tgt, D)
    out["generator.weight"] = _rows(lm_head, tgt_order, start_row if tied else None)
    bias = state["final_logits_bias"].reshape(-1)  # (1, V_tgt) -> (V_tgt,)
    out["generator.bias"] = torch.stack(
        [bias[i] if i is not None else bias.new_tensor(NEVER) for i in tgt_order]
    )
    return out


def to_marian_state(state: dict[str, Tensor], *, n_layers: int) -> dict[str, Tensor]:
    """A transduce ``Transformer`` state dict as ``MarianMTModel`` weights, ids unchanged (the
    exported ``vocab.json`` keeps transduce's ids): the dimension order turned back."""
    d_model = state["encoder.embed.weight"].size(1)
    inverse = torch.argsort(model_permutation(d_model))
    out = {theirs: _permuted(state[ours], kind, inverse) for ours, theirs, kind in _names(n_layers)}
    src = state["encoder.embed.weight"][:, inverse]
    tgt = state["decoder.embed.weight"][:, inverse]
    out["model.encoder.embed_tokens.weight"] = src.contiguous()
    out["model.decoder.embed_tokens.weight"] = tgt.contiguous()
    out["model.shared.weight"] = src.contiguous()
    out["lm_head.weight"] = state["generator.weight"][:, inverse].contiguous()
    bias = state.get("generator.bias")
    out["final_logits_bias"] = (
        torch.zeros(1, out["lm_head.weight"].size(0)) if bias is None else bias.reshape(1, -1)
    )
    return {k: v.detach().float().contiguous() for k, v in out.items()}

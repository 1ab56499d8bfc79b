"""Marian folders built locally for the Hugging Face tests: OPUS-MT-shaped configs (swish,
post-norm, static sinusoids, scale_embedding, a nonzero final_logits_bias, the pad id as the
decoder's start), separate source and target SentencePiece models trained here on a synthetic
corpus, one joint vocab.json in OPUS-MT's id layout (``</s>`` 0, ``<unk>`` 1, ..., ``<pad>``
last), random seeded weights. Nothing comes from a hub."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

WORDS = [
    "the",
    "a",
    "dog",
    "cat",
    "man",
    "woman",
    "runs",
    "sits",
    "on",
    "in",
    "red",
    "blue",
    "big",
    "small",
    "park",
    "street",
    "ball",
]


def corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 7))) for _ in range(n)]
    return src, [s.upper()[::-1] for s in src]


def train_spm(lines: list[str], size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=size,
        model_type="unigram",
        minloglevel=2,
    )
    return out.getvalue()


def joint_vocab(source: bytes, target: bytes) -> dict[str, int]:
    """OPUS-MT's layout: ``</s>`` 0, ``<unk>`` 1, the pieces of both models, ``<pad>`` last."""
    pieces: list[str] = []
    for proto in (source, target):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            p = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and p not in pieces:
                pieces.append(p)
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def marian_folder(
    folder: Path, *, seed: int = 0, d_model: int = 32, eos_bias: float = 3.5, **config: Any
) -> Path:
    """Write a MarianMTModel + MarianTokenizer folder (``config`` overrides MarianConfig)."""
    from transformers import (
        GenerationConfig,
        MarianConfig,
        MarianMTModel,
        MarianTokenizer,
    )

    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = corpus(300, seed=0)
    source, target = train_spm(src, 40), train_spm(tgt, 40)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    vocab = joint_vocab(source, target)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    v = len(vocab)
    options: dict[str, Any] = {
        "vocab_size": v,
        "d_model": d_model,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "activation_function": "swish",
        "scale_embedding": True,
        "pad_token_id": v - 1,
        "eos_token_id": 0,
        "decoder_start_token_id": v - 1,
        "forced_eos_token_id": 0,
        "max_position_embeddings": 128,
        "dropout": 0.0,
        "init_std": 0.3,
        **config,
    }
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**options))
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, 0] += eos_bias  # some outputs end before the limit
        # the start (pad) row: Hugging Face initialises it to 0, a trained model's is not
        for embed in (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens):
            embed.weight[v - 1].normal_(0.0, options["init_std"])
    model.generation_config = GenerationConfig(
        decoder_start_token_id=v - 1,
        eos_token_id=0,
        pad_token_id=v - 1,
        forced_eos_token_id=0,
        bad_words_ids=[[v - 1]],
        max_length=128,
        num_beams=4,
    )
    model.save_pretrained(str(folder))
    MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    ).save_pretrained(str(folder))
    return folder

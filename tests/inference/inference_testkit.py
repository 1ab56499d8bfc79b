"""Helpers for the decoding tests: a scripted fake model and tiny real models with naive,
cache-free references. Imported by the test modules of this folder (not collected itself)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.config import ModelConfig
from transduce.data.vocab import BOS, EOS, PAD, UNK
from transduce.inference import length_penalty
from transduce.model import DecoderCache, make_model

A, B_ = 4, 5  # the two symbols of the 6-token vocabulary (PAD, BOS, EOS, UNK, A, B_)
VOCAB = 6

Dist = Mapping[int, float]  # next token -> probability (missing tokens: probability 0)
Script = Mapping[tuple[int, ...], Dist] | Callable[[tuple[int, ...]], Dist]


class ScriptedModel:
    """A fake model with the decoding contract that replays hand-written next-token tables, in
    the style of fairseq's test_sequence_generator.

    ``scripts[key]`` gives, for a prefix of generated tokens (no BOS), the next-token
    distribution; ``key`` is the first token of the source sentence. A prefix missing from a
    dict script gets ``default``. The prefix of each row is read back from a real
    ``DecoderCache`` (the tokens fed so far are stored as the layer's ``self_k``), so a search
    that reorders the cache wrongly reads the wrong tables. The sentence key is stored as
    ``cross_k`` on the first call only, as the real model does with its cross-attention keys.
    """

    training = False

    def __init__(self, scripts: Mapping[int, Script], default: Dist | None = None) -> None:
        self.scripts = scripts
        self.default = default if default is not None else {EOS: 1.0}
        self.rows_per_call: list[int] = []
        self.cross_rows = 0  # rows for which the "cross-attention keys" were computed
        self.queries: list[tuple[int, tuple[int, ...]]] = []

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return src[:, :, None].float(), src != PAD  # memory (B, S, 1)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(1)

    def dist(self, key: int, prefix: tuple[int, ...]) -> Dist:
        script = self.scripts[key]
        if callable(script):
            return script(prefix)
        return script.get(prefix, self.default)

    def decode(self, tgt: Tensor, memory: Tensor, src_valid: Tensor, cache: DecoderCache) -> Tensor:
        rows, sentences = tgt.size(0), memory.size(0)
        assert tgt.shape == (rows, 1), tgt.shape
        assert src_valid.size(0) == sentences and rows % sentences == 0  # G rows per sentence
        layer = cache.layers[0]
        if layer.cross_k is None:
            assert cache.length == 0
            layer.cross_k = memory[:, 0, 0].long()
            self.cross_rows += sentences
        else:
            assert cache.length > 0
            assert layer.cross_k.size(0) == sentences
            # memory rows must stay aligned with the cache rows when sentences are dropped
            assert torch.equal(layer.cross_k, memory[:, 0, 0].long())
        fed = tgt if layer.self_k is None else torch.cat([layer.self_k, tgt], dim=1)
        layer.self_k = fed
        cache.length += 1
        assert fed.size(1) == cache.length
        self.rows_per_call.append(rows)
        logits = torch.full((rows, 1, VOCAB), float("-inf"))
        keys = layer.cross_k.repeat_interleave(rows // sentences).tolist()  # sentence of each row
        for r, (key, toks) in enumerate(zip(keys, fed.tolist(), strict=True)):
            assert toks[0] == BOS
            prefix = tuple(toks[1:])
            self.queries.append((key, prefix))
            for token, p in self.dist(key, prefix).items():
                if p > 0:
                    logits[r, 0, token] = math.log(p)
        return logits


def tiny_model(seed: int, *, sharpness: float = 3.0):
    """A 1-layer Transformer on the 6-token vocabulary with random weights, drawn so that the
    next-token distributions are peaky and depend on position and prefix (the default
    initialisation gives a model that mostly repeats its last input token): matrices N(0, 0.4),
    token embeddings N(0, 0.1), an untied pre-softmax projection N(0, sharpness / sqrt(D))."""
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2, d_k=8, d_v=8, dropout=0.0)
    model = make_model(cfg, src_vocab_size=VOCAB)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.4)
        model.encoder.embed.weight.normal_(0.0, 0.1)  # shared by encoder and decoder
        projection = torch.randn(VOCAB, cfg.d_model) * sharpness / cfg.d_model**0.5
    model.generator.weight = torch.nn.Parameter(projection)
    return model.eval()


def random_sources(gen: torch.Generator, lengths: list[int]) -> Tensor:
    """Right-padded (B, max(lengths)) sources over UNK/A/B_ tokens."""
    src = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, VOCAB, (n,), generator=gen)
    return src


def no_pad(src_row: Tensor) -> Tensor:
    return src_row[src_row != PAD][None]


def sequence_log_probs(model, src_row: Tensor, outputs: list[list[int]]) -> list[float]:
    """log P(y + EOS | src) of each output by the full (cache-free) forward pass; PAD and BOS are
    excluded from generation like in the searches, so their probability mass is just lost."""
    src1 = no_pad(src_row)
    longest = max(len(y) for y in outputs) + 1
    tgt = torch.full((len(outputs), longest), PAD, dtype=torch.long)  # shifted right
    gold = torch.full((len(outputs), longest), PAD, dtype=torch.long)
    for i, y in enumerate(outputs):
        tgt[i, : len(y) + 1] = torch.tensor([BOS, *y])
        gold[i, : len(y) + 1] = torch.tensor([*y, EOS])
    with torch.no_grad():
        logits = model(src1.expand(len(outputs), -1), tgt)  # causal: right padding is harmless
    lprobs = F.log_softmax(logits.double(), dim=-1).gather(2, gold[:, :, None]).squeeze(2)
    return [lprobs[i, : len(y) + 1].sum().item() for i, y in enumerate(outputs)]


def enumerate_outputs(max_len: int) -> list[list[int]]:
    """Every output over the generable symbols (UNK, A, B_) of at most ``max_len`` tokens."""
    symbols = (UNK, A, B_)
    return [list(y) for n in range(max_len + 1) for y in itertools.product(symbols, repeat=n)]


def ranked(
    model, src_row: Tensor, max_len: int, alpha: float
) -> list[tuple[float, list[int], float]]:
    """Exhaustive search: all outputs as (score, tokens, log_prob), best score first."""
    outputs = enumerate_outputs(max_len)
    log_probs = sequence_log_probs(model, src_row, outputs)
    out = [
        (lp / length_penalty(len(y) + 1, alpha), y, lp)
        for y, lp in zip(outputs, log_probs, strict=True)
    ]
    return sorted(out, key=lambda x: x[0], reverse=True)


def naive_greedy(model, src_row: Tensor, max_len: int) -> list[int]:
    """Greedy search that reruns the full forward pass on the whole prefix at every step."""
    src1 = no_pad(src_row)
    out: list[int] = []
    with torch.no_grad():
        while len(out) < max_len:
            logits = model(src1, torch.tensor([[BOS, *out]]))[0, -1]
            logits[PAD] = logits[BOS] = float("-inf")
            tok = int(logits.argmax())
            if tok == EOS:
                break
            out.append(tok)
    return out


# --- a tiny untrained translation checkpoint (Translator and server tests) ---------------------

TOY_WORDS = "the a dog cat man woman runs sits on in red blue big small park street ball".split()


def toy_sentences(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(TOY_WORDS) for _ in range(rng.randint(1, 9))) for _ in range(n)]


def save_toy_translation_model(  # noqa: ANN201
    path,  # noqa: ANN001
    decode: dict,
    model: dict | None = None,
    text: list[str] | None = None,
):
    """Write a checkpoint holding an untrained tiny model (``model``: changes to its section,
    e.g. the rnn architecture) and a 60-piece SentencePiece vocabulary learned on
    ``toy_sentences(300)`` and ``text`` (the checkpoint alone is enough to translate)."""
    from transduce import checkpoint
    from transduce.architectures import build_model
    from transduce.config import from_dict
    from transduce.data.subword import train_sentencepiece

    vocab = train_sentencepiece(toy_sentences(300) + (text or []), 60)
    sizes = {"n_layers": 1, "d_model": 32}
    if (model or {}).get("architecture", "transformer") == "transformer":  # the rnn refuses them
        sizes |= {"d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16}
    task = {"name": "translation"}  # (without it the default task, addition, is recorded)
    cfg = from_dict({"model": {**sizes, **(model or {})}, "decode": decode, "task": task})
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=len(vocab))
    checkpoint.save(
        {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": model.state_dict()}, path
    )
    return path


TOY_GERMAN = [
    "der",
    "die",
    "ein",
    "eine",
    "hund",
    "katze",
    "mann",
    "frau",
    "rennt",
    "sitzt",
    "auf",
    "im",
    "rot",
    "blau",
    "gross",
    "klein",
    "park",
    "strasse",
    "ball",
    "und",
]
TOY_BRACKETS = ["(S", ")S", "(NP", ")NP", "(VP", ")VP", "XX"]


def _save_toy(path: Path, vocab: Any, sections: dict, model: dict | None) -> Path:
    from transduce import checkpoint
    from transduce.architectures import build_model
    from transduce.config import from_dict
    from transduce.data.vocab import vocab_sizes

    sizes = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16}
    cfg = from_dict({"model": {**sizes, **(model or {})}, **sections})
    src_size, tgt_size = vocab_sizes(vocab)
    torch.manual_seed(0)
    built = build_model(cfg.model, src_vocab_size=src_size, tgt_vocab_size=tgt_size)
    checkpoint.save(
        {"config": cfg.to_dict(), "vocab": vocab.to_dict(), "model": built.state_dict()}, path
    )
    return path


def save_toy_pair_translator(path: Path, decode: dict, model: dict | None = None) -> Path:
    """As ``save_toy_translation_model`` with ``shared_vocab: false``: a 60-piece English source
    vocabulary and a 45-piece German target one (sizes apart, so that an id of one side read
    with the other shows)."""
    import random

    from transduce.data.subword import train_sentencepiece
    from transduce.data.vocab import VocabPair

    rng = random.Random(1)
    german = [
        " ".join(rng.choice(TOY_GERMAN) for _ in range(rng.randint(1, 9))) for _ in range(300)
    ]
    vocab = VocabPair(train_sentencepiece(toy_sentences(300), 60), train_sentencepiece(german, 45))
    task = {"name": "translation", "shared_vocab": False}
    return _save_toy(path, vocab, {"decode": decode, "task": task}, model)


def save_toy_parser(path: Path, decode: dict, model: dict | None = None) -> Path:
    """An untrained tiny parsing checkpoint: 60 English word pieces in, the bracket tokens of
    ``TOY_BRACKETS`` out."""
    from transduce.data.subword import train_sentencepiece
    from transduce.data.vocab import TokenVocab, VocabPair

    vocab = VocabPair(train_sentencepiece(toy_sentences(300), 60), TokenVocab(TOY_BRACKETS))
    return _save_toy(path, vocab, {"decode": decode, "task": {"name": "parsing"}}, model)


def save_toy_synthetic(path: Path, decode: dict, model: dict | None = None) -> Path:
    """An untrained tiny ``addition`` checkpoint: one character a token, digits and '+'."""
    from transduce.data.vocab import CharVocab

    vocab = CharVocab(list("0123456789+"))
    return _save_toy(path, vocab, {"decode": decode, "task": {"name": "addition"}}, model)


# --- a tiny model trained to upper-case the words (int8, CTranslate2 and Hugging Face tests) ----


def upper_casing_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` sentences of 1 to 6 toy words and their upper-cased copies (the task)."""
    import random

    rng = random.Random(seed)
    src = [" ".join(rng.choice(TOY_WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    return src, [s.upper() for s in src]


def train_upper_casing(root: Path, sources: list[str], model: dict | None = None) -> Path:
    """Train a 1-layer d_model 64 Transformer (``model``: changes to that section) for 300 steps
    to upper-case ``sources`` (a 60-piece vocabulary learned from them) in ``root / "run"``;
    about 10 s on one CPU thread. Returns its model.pt."""
    from transduce.config import from_dict
    from transduce.training.run import train_translation

    (root / "train.src").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (root / "train.tgt").write_text("\n".join(s.upper() for s in sources) + "\n", encoding="utf-8")
    sizes = {"n_layers": 1, "d_model": 64, "d_ff": 128, "n_heads": 4, "d_k": 16, "d_v": 16}
    cfg = from_dict(
        {
            "model": {**sizes, "dropout": 0.0, **(model or {})},
            "train": {
                "max_steps": 300,
                "warmup": 60,
                "max_tokens": 600,
                "eval_every": 0,
                "save_every": 100_000,
                "keep_last": 1,
                "log_every": 1000,
                "tensorboard": False,
            },
            "task": {
                "name": "translation",
                "train_src": str(root / "train.src"),
                "train_tgt": str(root / "train.tgt"),
                "vocab_size": 60,
            },
            "decode": {"max_len_offset": 20},
        }
    )
    torch.manual_seed(0)
    train_translation(cfg, root / "run", show_progress=False, log=lambda _: None)
    return root / "run" / "model.pt"

"""From a Config to a trained run folder: the task's data, the model, the Trainer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transduce.config import Config
from transduce.data.synthetic import TextPair, make_task
from transduce.data.vocab import Vocab
from transduce.evaluation.accuracy import sequence_accuracy, token_accuracy
from transduce.inference import greedy_search
from transduce.model.transformer import Transformer, make_model
from transduce.training.batching import Pair, collate
from transduce.training.trainer import Trainer


def encode_pairs(vocab: Vocab, pairs: Sequence[TextPair]) -> list[Pair]:
    return [(vocab.encode(s), vocab.encode(t)) for s, t in pairs]


@torch.no_grad()
def predict_ids(
    model: Transformer, sources: Sequence[list[int]], *, batch_size: int, max_len_offset: int
) -> list[list[int]]:
    """Greedy outputs (ids without BOS/EOS) for source id lists, in input order."""
    model.eval()
    device = next(model.parameters()).device
    out: list[list[int]] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        src = collate([(s, []) for s in chunk]).src.to(device)
        out.extend(greedy_search(model, src, max_len_offset=max_len_offset))
    return out


def accuracy_validator(cfg: Config, valid: Sequence[Pair]):  # noqa: ANN201 - returns Validator
    """Exact-match and token accuracy of greedy decoding on the held-out pairs."""
    sources = [s for s, _ in valid]
    refs = [t for _, t in valid]

    def validate(model: Transformer) -> dict[str, float]:
        hyps = predict_ids(
            model,
            sources,
            batch_size=cfg.decode.decode_batch,
            max_len_offset=cfg.decode.max_len_offset,
        )
        return {"seq_accuracy": sequence_accuracy(hyps, refs), "token_accuracy": token_accuracy(hyps, refs)}

    return validate


def train_synthetic(
    cfg: Config, out_dir: str | Path, *, resume: bool = False, show_progress: bool | None = None
) -> dict[str, Any]:
    """Train on the synthetic task of ``cfg.task``; returns the Trainer's summary."""
    task = make_task(cfg.task)
    train = encode_pairs(task.vocab, task.train)
    valid = encode_pairs(task.vocab, task.valid)
    torch.manual_seed(cfg.train.seed)
    model = make_model(cfg.model, src_vocab_size=len(task.vocab))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    trainer = Trainer(
        cfg,
        model,
        task.vocab,
        train,
        run_dir=out,
        valid_pairs=valid,
        validator=accuracy_validator(cfg, valid),
        score_key="seq_accuracy",
        resume=resume,
        show_progress=show_progress,
    )
    return trainer.train()

"""The evaluation of a translation model (``transduce evaluate``): a file translated and scored
with sacreBLEU against its reference. (A parser's is ``parsing.parser.evaluate_parser``.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transduce.config import DecodeConfig
from transduce.data.parallel import read_aligned
from transduce.errors import UserError
from transduce.evaluation.bleu import corpus_scores
from transduce.inference.translator import Translator


def evaluate_files(
    translator: Translator,
    src_path: str | Path,
    ref_path: str | Path,
    decode: DecodeConfig | None = None,
    *,
    lowercase: bool = False,
    show_progress: bool | None = False,
) -> tuple[dict[str, Any], list[str]]:
    """Translate ``src_path`` with ``decode`` (default: the model's settings) and score it
    against ``ref_path`` with sacreBLEU: the evaluation of a translation model (``transduce
    evaluate``).

    Returns (scores, translations). Scores: ``bleu``, ``chrf`` (cased unless ``lowercase``) with
    their signatures, ``bleu_lowercase`` (always lowercased) with its signature, ``lines``, and
    the ``beam`` and ``alpha`` used. Files of different line counts are a UserError naming both.
    """
    if translator.cfg.task.name == "parsing":  # trees are scored by their brackets, not BLEU
        raise UserError(
            "a parsing model is evaluated with EVALB: transduce.parsing.parser.evaluate_parser"
        )
    if not isinstance(lowercase, bool):
        raise TypeError(f"lowercase must be True or False; got {lowercase!r}")
    sources, references = read_aligned(src_path, ref_path, what="source and reference")
    if not sources:
        raise UserError(f"{src_path}: no lines to translate")
    cfg = translator.cfg.decode if decode is None else decode
    hyps = translator.translate(sources, cfg, show_progress=show_progress)
    scores = corpus_scores(hyps, references, lowercase=lowercase)
    lower = corpus_scores(hyps, references, lowercase=True)
    scores["bleu_lowercase"] = lower["bleu"]
    scores["bleu_lowercase_signature"] = lower["bleu_signature"]
    if cfg.sampling:  # sampled, not searched: no beam
        scores["sampling"] = {
            "seed": cfg.sampling_seed,
            "temperature": cfg.temperature,
            "top_k": cfg.top_k,
            "top_p": cfg.top_p,
        }
    else:
        scores["beam"] = cfg.beam
    scores["alpha"] = cfg.alpha
    return scores, hyps


__all__ = ["evaluate_files"]

"""Corpus-level BLEU and chrF with sacreBLEU (Post, 2018), so scores are comparable across papers.

The BLEU is sacreBLEU's default corpus BLEU: case-sensitive (unless ``lowercase``), computed on
*detokenized* hypotheses and references, which sacreBLEU tokenizes itself with its ``13a``
tokenizer (the one of mteval-v13a.pl, WMT's official scorer); 4-gram precisions with the brevity
penalty of Papineni et al. (2002), one reference per sentence, no smoothing needed at corpus level
(sacreBLEU's ``exp`` smoothing only acts on zero counts). The signature string records all of
this, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``; report it with the
score. This is not the paper's number for WMT (a tokenized BLEU with compound splitting), which
is not comparable across tokenizations.

chrF is sacreBLEU's default chrF (character 6-grams, beta 2, no word n-grams).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from transduce.errors import UserError

__all__ = ["corpus_scores"]


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    lowercase: bool = False,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """BLEU and chrF of detokenized ``hypotheses`` against one reference each.

    Returns ``{"bleu", "bleu_signature", "chrf", "chrf_signature", "lines"}`` (scores 0..100).
    ``tokenize`` is a sacreBLEU tokenizer name for BLEU (``13a`` default; ``intl``, ``zh``, ...).
    Different numbers of hypotheses and references are a ``UserError``.
    """
    hyps, refs = list(hypotheses), list(references)
    if len(hyps) != len(refs):
        raise UserError(
            f"{len(hyps)} hypotheses but {len(refs)} references; they must be line-aligned"
        )
    if not hyps:
        raise UserError("no sentences to score")
    if tokenize not in BLEU.TOKENIZERS:
        raise UserError(
            f"unknown BLEU tokenizer {tokenize!r}; choose from {', '.join(BLEU.TOKENIZERS)}"
        )
    bleu = BLEU(lowercase=lowercase, tokenize=tokenize)
    chrf = CHRF(lowercase=lowercase)
    return {
        "bleu": float(bleu.corpus_score(hyps, [refs]).score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": float(chrf.corpus_score(hyps, [refs]).score),
        "chrf_signature": str(chrf.get_signature()),
        "lines": len(hyps),
    }

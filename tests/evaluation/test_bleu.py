import pytest
import sacrebleu

from transduce.errors import UserError
from transduce.evaluation.bleu import corpus_scores

REFS = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
    "Leute reparieren das Dach eines Hauses.",
]
HYPS = [
    "Ein Mann mit orangefarbenem Hut starrt etwas an.",
    "Ein Boston Terrier rennt auf grünem Gras vor einem weißen Zaun.",
    "Leute Reparieren das Dach eines Hauses.",
]


def test_identical_is_100():
    s = corpus_scores(REFS, REFS)
    assert s["bleu"] == pytest.approx(100.0)
    assert s["chrf"] == pytest.approx(100.0)
    assert s["lines"] == 3


def test_equals_sacrebleu_directly():
    s = corpus_scores(HYPS, REFS)
    assert s["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert s["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert 0 < s["bleu"] < 100


def test_signature_is_cased_13a():
    s = corpus_scores(HYPS, REFS)
    assert "case:mixed" in s["bleu_signature"] and "tok:13a" in s["bleu_signature"]
    assert "nrefs:1" in s["bleu_signature"]
    assert s["bleu_signature"].endswith(f"version:{sacrebleu.__version__}")
    assert "nc:6" in s["chrf_signature"]


def test_case_sensitivity():
    cased = corpus_scores(HYPS, REFS)
    lower = corpus_scores(HYPS, REFS, lowercase=True)
    assert lower["bleu"] > cased["bleu"]  # "Reparieren" vs "reparieren"
    assert "case:lc" in lower["bleu_signature"]
    assert lower["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True).score)


def test_count_mismatch():
    with pytest.raises(UserError, match="2 hypotheses but 3 references"):
        corpus_scores(HYPS[:2], REFS)
    with pytest.raises(UserError, match="no sentences"):
        corpus_scores([], [])


def test_tokenizer_option():
    s = corpus_scores(HYPS, REFS, tokenize="intl")
    assert "tok:intl" in s["bleu_signature"]
    with pytest.raises(UserError, match="unknown BLEU tokenizer"):
        corpus_scores(HYPS, REFS, tokenize="moses")

"""Evaluation: corpus BLEU and chrF with sacreBLEU, exact-match and token accuracy."""

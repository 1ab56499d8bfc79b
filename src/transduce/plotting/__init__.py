"""Figures of what a model learns, drawn from plain data (no model, trainer or GPU needed).

- ``read_metrics``, ``plot_curves``: learning curves of runs from their ``metrics.jsonl``.
- ``plot_attention``: attention weights as heat maps per head or the paper's token-line figures.
- ``reversal_summary``, ``plot_reversal``: a synthetic task learnt with and without its inputs
  reversed, side by side.

matplotlib (``pip install 'transduce[plot]'``) is imported only when a figure is drawn.
"""

from transduce.plotting.attention import plot_attention
from transduce.plotting.curves import plot_curves
from transduce.plotting.records import read_metrics
from transduce.plotting.reversal import plot_reversal, reversal_summary

__all__ = ["plot_attention", "plot_curves", "plot_reversal", "read_metrics", "reversal_summary"]

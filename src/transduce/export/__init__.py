"""Exporting trained models to other inference engines.

``transduce.export.ctranslate2``: a CTranslate2 model folder (``transduce export ctranslate2``).
Each exporter imports its engine's package lazily, so ``import transduce.export`` needs none.
"""

__all__ = ["ctranslate2"]

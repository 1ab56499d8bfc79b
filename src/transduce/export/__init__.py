"""Exporting trained models to other inference engines, and importing models made elsewhere.

``transduce.export.ctranslate2``: a CTranslate2 model folder (``transduce export ctranslate2``).
``transduce.export.huggingface``: Hugging Face Marian (OPUS-MT) folders in (``import_marian``) and
out (``export_marian``); ``marian_config`` and ``marian_weights`` map configurations and weights.
``transduce.export.folders``: what an export may write over (``--force``).
Each imports its engine's package lazily, so ``import transduce.export`` needs none.
"""

__all__ = ["ctranslate2", "folders", "huggingface"]

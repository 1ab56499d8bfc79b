"""Constituency parsing as translation (section 6.3): words in, linearised trees out.

``parser``: ``Parser`` (the Python API behind ``transduce parse``), decoding a sentence's
linearised tree with a ``Translator`` and reading the tree back (``data.linearise``), and the
EVALB scores of a parser on a test set (``transduce evaluate`` of a parsing model, validation
during training); ``tree_constraint`` and ``constrained``: decoding that can emit only what
still becomes a well-formed tree with the input's words. The treebank reading and
the linearisation itself are corpus work and live in ``transduce.data``.
"""

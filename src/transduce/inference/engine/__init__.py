"""The inference engine: the Transformer's encoder and decoding steps computed from a snapshot of
its weights laid out for inference (``DecodingModel``), what ``Translator`` and the server run.
It keeps the decoding contract of ``transduce.inference.contract``, so every search takes it in
place of the model."""

from transduce.inference.engine.decoding import DecodingModel

__all__ = ["DecodingModel"]

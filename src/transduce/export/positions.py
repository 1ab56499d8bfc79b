"""How many positions an exported model's table holds. transduce's sinusoidal table grows with
the input (``model.positions.SinusoidalPositions``); an exported one (CTranslate2's
``position_encodings``, Marian's ``max_position_embeddings``) is fixed, so it is written at least
``EXPORT_MIN_POSITIONS`` long, and learned positions are as many as the model has."""

from __future__ import annotations

from transduce.config import ModelConfig

__all__ = ["EXPORT_MIN_POSITIONS", "exported_positions"]

EXPORT_MIN_POSITIONS = 1024


def exported_positions(cfg: ModelConfig, asked: int | None = None) -> int:
    """The positions an export of a model of ``cfg`` holds: ``asked`` (None: the model's
    ``max_positions``, at least ``EXPORT_MIN_POSITIONS``) for sinusoidal positions, the
    model's own for learned ones (a table it has no more of)."""
    if cfg.positional != "sinusoidal":
        return cfg.max_positions
    return max(cfg.max_positions, EXPORT_MIN_POSITIONS) if asked is None else asked

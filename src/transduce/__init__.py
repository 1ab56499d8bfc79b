"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

``from transduce import Translator`` gives the translation API
(``transduce.inference.translator``); it is imported on first use, so ``import transduce`` stays
cheap (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]

if TYPE_CHECKING:
    from transduce.inference.translator import Translator


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from transduce.inference.translator import Translator

        return Translator
    raise AttributeError(f"module 'transduce' has no attribute {name!r}")

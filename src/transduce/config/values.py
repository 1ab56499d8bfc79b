"""Values checked against the type hints of the config dataclasses: an int taken for a float,
strings converted where they come from the command line, every other mismatch a UserError naming
the key."""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal, get_args, get_origin

from transduce.errors import UserError


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _typed(where: str, hint: Any, value: Any, *, from_text: bool) -> Any:
    """``value`` checked against the type ``hint`` of key ``where``; an int is taken for a float,
    and with ``from_text`` strings are converted (command-line values). A UserError otherwise."""
    origin = get_origin(hint)
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise UserError(f"{where} must be one of {', '.join(map(str, allowed))}; got {value!r}")
        return value
    if origin in (types.UnionType, typing.Union):  # the first alternative that takes it
        choices = sorted(get_args(hint), key=lambda h: get_origin(h) is not Literal)
        for choice in choices:  # a Literal first: "auto" is no integer, "false" no mode
            try:
                return _typed(where, choice, value, from_text=from_text)
            except UserError:
                pass
        wanted = " or ".join(_described(choice) for choice in choices)
        raise UserError(f"{where} must be {wanted}; got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if from_text and isinstance(value, str):
            if value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
        raise UserError(f"{where} must be true or false; got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and from_text:
            return int(value)
        if from_text and isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise UserError(f"{where} must be an integer; got {value!r}")
    if hint is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if type(value) is not float else value
        elif from_text and isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise UserError(f"{where} must be a number; got {value!r}")
        if not math.isfinite(number):  # no key has a use for nan or inf
            raise UserError(f"{where} must be a finite number; got {value!r}")
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where} must be a string; got {value!r}")
    raise AssertionError(f"unsupported config type {hint} for {where}")


def _described(hint: Any) -> str:
    """What a value of type ``hint`` must be, in words (for a union's UserError)."""
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(map(str, get_args(hint)))
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return words[hint]

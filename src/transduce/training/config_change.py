"""Resuming with a changed config: what may change freely, what must be asked for by name.

A resumed run continues exactly only with the model, the data order and the updates it started
with. So ``--resume`` compares the config given with the one stored in the checkpoint. Keys in
``FREE`` change none of those (the budget and the stopping rules, how often things happen, the
device, logging, validation and decoding) and may change: the changes are printed. Any other
change is refused (a ``UserError``: exit code 2, each key with its old and new value) unless
every such key is named in ``allow_change`` (``--allow-change KEY``; naming one that did not
change is refused too: it allows nothing, so it is a mistake). That includes ``precision``
(other numerics; fp16 keeps a loss scale the others lack), unless it resolves here to what the
saved run trained with ("auto" named as what it resolved to, or the reverse). The number of
processes, not part of the config, may change (training/resume.py); ``update_freq`` may change
freely only to keep the tokens per update (processes x update_freq) as they were. Three free
keys are free only where they are: the budget (``max_steps``, ``max_epochs``, ``max_minutes``)
sets every later learning rate when ``cooldown`` anneals over its last share, and ``device``
must not change the precision that ``precision: auto`` resolved to (``Setting``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transduce.config import Config, from_dict, resolve_key
from transduce.errors import UserError
from transduce.training.resume import saved_processes

FREE: frozenset[str] = frozenset(
    {
        "train.max_steps",
        "train.max_epochs",
        "train.max_minutes",
        "train.patience",
        "train.target_seq_accuracy",
        "train.save_every",
        "train.log_every",
        "train.eval_every",
        "train.keep_last",
        "train.average_last",
        "train.device",
        "train.tensorboard",
        "train.max_bad_updates",
        "train.valid_beam",
        "train.update_freq",
        "task.max_valid_sentences",
        "task.constrained",  # what validation reads and how it decodes
        "decode.beam",
        "decode.alpha",
        "decode.max_len_offset",
        "decode.decode_batch",
        "decode.batch_tokens",
        "decode.sampling",  # the saved model's decoding defaults: validation searches
        "decode.temperature",
        "decode.top_k",
        "decode.top_p",
        "decode.sampling_seed",
    }
)

# Keys a resumed run cannot act on: its vocabulary is its checkpoint's (the run folder's files),
# so a change would only make config.json lie about the model
FIXED: frozenset[str] = frozenset(
    {
        "task.vocab_size",
        "task.vocab_sample",
        "task.shared_vocab",
        "task.src_vocab_size",
        "task.vocab_model",
    }
)

_ABSENT = "(absent)"  # a key of another task
_BUDGET = frozenset({"train.max_steps", "train.max_epochs", "train.max_minutes"})


@dataclass(frozen=True)
class Setting:
    """What a run trains with beyond its config: its number of processes, and its precision as
    resolved on its device (``precision: auto`` -> bf16-weights, bf16 or fp32; None: a
    checkpoint older than the record of it)."""

    processes: int = 1
    precision: str | None = None


def allowed_keys(names: Sequence[str]) -> frozenset[str]:
    """``--allow-change`` names (``lr_factor`` or ``train.lr_factor``) as ``section.key``; an
    unknown one is a UserError naming it."""
    return frozenset(".".join(resolve_key(name)) for name in names)


def _flat(cfg: Config) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, keys in cfg.to_dict().items() for k, v in keys.items()}


def differences(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(``section.key``, old value, new value) of each key that differs, in config order."""
    a, b = _flat(old), _flat(new)
    keys = list(a) + [k for k in b if k not in a]
    return [
        (k, a.get(k, _ABSENT), b.get(k, _ABSENT))
        for k in keys
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    ]


def _listed(changes: Sequence[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)


def _free(key: str, old: Config, new: Config, before: Setting, now: Setting) -> bool:
    """Whether changing ``key`` leaves the model, the data order and the updates as they were."""
    if key == "train.update_freq":
        return before.processes * old.train.update_freq == now.processes * new.train.update_freq
    if key in _BUDGET:
        return new.train.cooldown == 0  # else the lr of every later update moves
    if key == "train.precision":  # "auto" <-> what it resolved to here: the same numerics
        return before.precision is not None and before.precision == now.precision
    return key in FREE


def check_resume(
    stored: dict[str, Any],
    new: Config,
    allow_change: Sequence[str],
    source: Path,
    before: Setting = Setting(),
    now: Setting = Setting(),
) -> str:
    """The changes from the config ``stored`` in checkpoint ``source`` (``Config.to_dict``) to
    ``new``, as a line to print ('' when none); a UserError listing those not free (``FREE``,
    with the conditions of ``_free``) and not in ``allow_change``, or naming a key of
    ``allow_change`` that did not change. ``before``/``now``: the saving run's and this run's
    processes and resolved precision."""
    allowed = allowed_keys(allow_change)
    old = from_dict(stored, source=str(source), stored=True)
    changes = differences(old, new)
    if before.precision is not None and before.precision != now.precision:
        changes.append(
            ("train.precision (as resolved on the device)", before.precision, now.precision)
        )
    idle = sorted(allowed - {c[0].split(" ")[0] for c in changes})
    if idle:  # an --allow-change that allows nothing is a mistake (a typo'd value, a wrong run)
        raise UserError(
            f"--allow-change {', '.join(idle)}: not changed from the config of {source} "
            f"({', '.join(f'{k} = {_flat(old).get(k, _ABSENT)!r}' for k in idle)}); "
            "name only keys whose new value differs"
        )
    refused = [
        c
        for c in changes
        if not _free(c[0], old, new, before, now) and c[0].split(" ")[0] not in allowed
    ]
    if refused:
        raise UserError(
            f"{source} was trained with another config; resuming would change the model, the "
            f"data order or the updates: {_listed(refused)}. Resume with the run's config "
            "(its config.json), or name each key with --allow-change KEY to change it anyway"
        )
    fixed = [c for c in changes if c[0] in FIXED]
    if fixed:
        raise UserError(
            f"{source}: a resumed run keeps its checkpoint's vocabulary, so it cannot change "
            f"{_listed(fixed)} (--allow-change or not); a new vocabulary needs a new run"
        )
    if not changes:
        return ""
    return f"resuming {source} with a changed config: {_listed(changes)}"


def check_checkpoint(
    state: dict[str, Any],
    path: Path,
    cfg: Config,
    allow_change: Sequence[str],
    now: Setting,
    is_main: bool,
) -> None:
    """``check_resume`` of ``cfg`` (and ``now``: this run's processes and precision) against
    the step checkpoint ``state`` read from ``path``; the changes let through are printed
    (rank 0: ``is_main``)."""
    before = Setting(saved_processes(state), state.get("precision"))
    change = check_resume(state["config"], cfg, allow_change, path, before, now)
    if change and is_main:
        print(f"transduce: {change}", file=sys.stderr)


__all__ = ["FREE", "Setting", "allowed_keys", "check_checkpoint", "check_resume", "differences"]

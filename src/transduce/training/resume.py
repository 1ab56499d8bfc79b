"""Resuming a run from its last checkpoint: the training state, and a new number of processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from transduce.errors import UserError
from transduce.training.distributed import World
from transduce.training.optimizer import saved_state_for
from transduce.training.progress import Progress
from transduce.training.rng import seed_all, set_rng_state


def load_training_state(
    state: dict[str, Any],
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
) -> None:
    """Load a checkpoint's weights, optimizer and loss-scaler state; a checkpoint that does not
    fit the configured model is a UserError naming it."""
    try:
        model.load_state_dict(state["model"])
        # the config's betas, eps and weight decay (--allow-change), the saved moments
        optimizer.load_state_dict(saved_state_for(state["optimizer"], optimizer, model))
        if scaler.is_enabled() and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
    except (RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[-1].strip()
        raise UserError(
            f"{path} does not fit the configured model (was the config changed since the "
            f"run started?): {first}"
        ) from None


def change_world_size(
    p: Progress,
    saved_size: int,
    rank0_rng: dict[str, Any],
    world: World,
    seed: int,
    device: torch.device,
) -> None:
    """Resume a run saved by ``saved_size`` processes on ``world``'s number.

    ``batch_index`` counts batches of one rank's share of the epoch, so it becomes the same
    place in the epoch's batch list for the new shares (at most one batch per rank is seen
    twice). Random streams cannot carry over: rank 0 continues the saved rank 0's, the other
    ranks start streams seeded by (seed, rank, step).
    """
    old_index = p.batch_index
    p.batch_index = old_index * saved_size // world.size
    set_rng_state(rank0_rng, device)
    if not world.is_main:
        seed_all(seed + world.rank + 1_000_003 * p.step)
    else:
        print(
            f"transduce: resuming a run of {saved_size} process(es) on {world.size}: "
            f"epoch {p.epoch} continues at batch {p.batch_index} of each rank's share "
            f"(was {old_index}); tokens per update change with the number of processes "
            "unless update_freq is changed to match",
            file=sys.stderr,
        )


def saved_processes(state: dict[str, Any]) -> int:
    """How many processes wrote the step checkpoint ``state`` (one random state each)."""
    return len(state.get("rng_ranks") or [state.get("rng")])


def restore_position(
    state: dict[str, Any], path: Path, world: World, seed: int, device: torch.device
) -> Progress:
    """The run's progress and this rank's random state from a step checkpoint (for another
    number of processes: ``change_world_size``); a UserError naming a damaged checkpoint."""
    try:
        progress = Progress(**state["progress"])
        rngs = state.get("rng_ranks") or [state["rng"]]  # one per rank of the saving run
        if len(rngs) == world.size:
            set_rng_state(rngs[world.rank], device)
        else:
            change_world_size(progress, len(rngs), state["rng"], world, seed, device)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise UserError(
            f"{path}: not a complete training checkpoint ({type(e).__name__}: {e})"
        ) from None
    return progress


__all__ = ["change_world_size", "load_training_state", "restore_position", "saved_processes"]

"""Writing the run's files so that a full disk stops the run cleanly.

Every checkpoint and model file is written atomically (``checkpoint.save``: a temporary file,
fsync, rename), so a write that fails, for a full disk (ENOSPC) or a quota, leaves the file it
was to replace as it was and no partial file under the name, and the temporary file is removed.
``write_on_main`` runs such a write on rank 0 and lets every rank know how it went: a failure
raises ``CheckpointNotWritten`` (exit code 74) on all ranks together, naming the file and the
last good checkpoint, instead of rank 0 dying while the others wait for it.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transduce import checkpoint
from transduce.errors import CheckpointNotWritten, RunStopped
from transduce.training import distributed, guard


def last_good(ckpt_dir: Path, but: Path | None = None) -> Path | None:
    """The newest step checkpoint in ``ckpt_dir`` other than ``but`` (None: there is none)."""
    saved = [p for p in checkpoint.step_checkpoints(ckpt_dir) if p != but]
    return saved[-1] if saved else None


def _failure(path: Path, error: OSError, ckpt_dir: Path) -> str:
    saved = last_good(ckpt_dir, but=path)
    last = f"the last good checkpoint, {saved}, is intact" if saved else "no checkpoint yet"
    space = error.errno in (errno.ENOSPC, errno.EDQUOT)  # a full disk or quota: make room
    fix = "Free some space" if space else "Mend that"
    return (
        f"cannot write {path}: {error.strerror or error} (errno {error.errno}); {last}. "
        f"{fix}, then resume with --resume"
    )


def write_on_main(
    world: distributed.World, path: Path, write: Callable[[], None], ckpt_dir: Path
) -> None:
    """Run ``write`` (which writes ``path``) on rank 0; every rank must call it. An OSError
    there raises ``CheckpointNotWritten`` on every rank (``ckpt_dir``: where the last good
    checkpoint is looked for), as does any ``RunStopped`` that ``write`` raises (``Diverged``
    for non-finite weights). Any other error there is raised on rank 0 as it is (its traceback
    kept) and as ``CheckpointNotWritten`` on the other ranks, which would otherwise wait for rank
    0 forever. Also a barrier: no rank goes on before the file is written."""
    failure: RunStopped | None = None
    unexpected: Exception | None = None
    if world.is_main:
        try:
            write()
        except OSError as e:
            failure = CheckpointNotWritten(_failure(path, e, ckpt_dir))
        except RunStopped as e:
            failure = e
        except Exception as e:
            unexpected = e
            failure = CheckpointNotWritten(f"cannot write {path}: {type(e).__name__}: {e}")
    failure = distributed.all_gather_objects(failure, world)[0]
    if unexpected is not None:
        raise unexpected
    if failure is not None:
        raise failure


def write_model_file(
    world: distributed.World,
    path: Path,
    state: Callable[[], dict[str, Any]],
    ckpt_dir: Path,
    save: Callable[[dict[str, Any], Path], None] = checkpoint.save,
) -> None:
    """Write the model file ``state()`` (made on rank 0 only) to ``path`` with ``save``, never
    from weights that are not finite (``Diverged``); see ``write_on_main``."""

    def write() -> None:
        data = state()
        guard.require_finite(data["model"].values(), path, last_good(ckpt_dir, but=path))
        save(data, path)

    write_on_main(world, path, write, ckpt_dir)


__all__ = ["last_good", "write_model_file", "write_on_main"]

"""Entry script for the tests that kill a training process.

    python killed_run.py CONFIG OUT [--resume] [--die-at-step N]

Trains as ``transduce train --config CONFIG --out OUT --quiet [--resume]`` does, through the Python
API, and with ``--die-at-step N`` kills itself with SIGKILL right after update N (and the
checkpoint due then, if any), as a crashed or killed process dies: nothing of the kind lives in
the training loop itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from transduce.config import load_config
from transduce.training import distributed
from transduce.training.progress import Progress
from transduce.training.run import train


def die_at(step: int):  # noqa: ANN201 - a StepCallback
    def callback(progress: Progress) -> None:
        if progress.step == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return callback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--die-at-step", type=int, default=0)
    args = parser.parse_args(argv)
    callbacks = [die_at(args.die_at_step)] if args.die_at_step else []
    summary = train(
        load_config(args.config),
        args.out,
        resume=args.resume,
        show_progress=False,
        callbacks=callbacks,
    )
    distributed.shutdown()
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

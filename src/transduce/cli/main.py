"""``transduce`` entry point: one command, subcommands, no logic beyond argument handling.

User errors (``UserError``) print one line ``transduce: error: ...`` and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from transduce.cli import (
    analysis_commands,
    parsing_commands,
    prepare_commands,
    serve_commands,
    training_commands,
    translation_commands,
)
from transduce.errors import UserError

# Each module adds its subcommands with register(subparsers).
COMMAND_MODULES = [
    training_commands, translation_commands, parsing_commands, serve_commands, analysis_commands,
    prepare_commands,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transduce", description="The Transformer of 'Attention Is All You Need'."
    )
    no_tuning = "leave glibc malloc and oneDNN's kernel cache as they are (see transduce.runtime)"
    parser.add_argument("--no-malloc-tuning", action="store_true", help=no_tuning)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    # Also accepted after the subcommand (nested ones too, e.g. data multi30k); SUPPRESS keeps
    # the value given before it.
    pending = list(sub.choices.values())
    while pending:
        subparser = pending.pop()
        subparser.add_argument(
            "--no-malloc-tuning", action="store_true", default=argparse.SUPPRESS, help=no_tuning
        )
        for action in subparser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.no_malloc_tuning:
        from transduce.runtime import enlarge_onednn_cache, tune_malloc

        tune_malloc()
        enlarge_onednn_cache()
    try:
        return args.func(args)
    except UserError as e:
        print(f"transduce: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("transduce: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``transduce`` entry point: one command, subcommands, no logic beyond argument handling.

User errors (``UserError``, and ``OSError``s such as a file name too long) print one line
``transduce: error: ...`` and exit with code 2; so do argument errors (argparse's own usage
message would be two or more lines: the usage, then the error; here it is one line naming the
subcommand's ``--help``). A training run that stops itself (``RunStopped``: diverged, preempted,
a full disk) prints ``transduce: stopped: ...`` and exits with its own code (3, 143, 74); a
preempted one also prints the command that resumes it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from transduce.cli import (
    analysis_commands,
    data_commands,
    exchange_commands,
    parsing_commands,
    score_commands,
    serve_commands,
    training_commands,
    translation_commands,
)
from transduce.errors import Preempted, RunStopped, UserError

# Each adds its subcommands to the subparsers, in the order `transduce --help` lists them.
REGISTER = [
    training_commands.register,
    data_commands.register,
    translation_commands.register,
    score_commands.register,
    parsing_commands.register,
    serve_commands.register,
    exchange_commands.register,
    analysis_commands.register,
    data_commands.register_prepare,
]


def one_line(message: str) -> str:
    """``message`` as one line: line breaks become spaces and other control characters (in a
    file name, say) their escapes, so that an error is always exactly one line."""
    text = "".join(c if c.isprintable() or c in " \n" else ascii(c)[1:-1] for c in message)
    return " ".join(part.strip() for part in text.split("\n") if part.strip())


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (exit status 2, as argparse's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"transduce: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="transduce", description="The Transformer of 'Attention Is All You Need'."
    )
    no_tuning = (
        "leave glibc malloc and the matrix library's kernel cache as they are "
        "(see transduce.runtime)"
    )
    parser.add_argument("--no-malloc-tuning", action="store_true", help=no_tuning)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in REGISTER:
        register(sub)
    # Also accepted after the subcommand (nested ones too, e.g. data multi30k); SUPPRESS keeps
    # the value given before it.
    pending = list(sub.choices.values())
    while pending:
        subparser = pending.pop()
        subparser.add_argument(
            "--no-malloc-tuning", action="store_true", default=argparse.SUPPRESS, help=no_tuning
        )
        # the innermost subcommand's parser, whose --help an unknown argument points to (a
        # nested one's default is set after its parent's: it wins)
        subparser.set_defaults(_subcommand_parser=subparser)
        for action in subparser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is not None and any("\0" in arg for arg in argv):  # (no shell can pass one)
        print("transduce: error: an argument contains a NUL character", file=sys.stderr)
        return 2
    given = list(sys.argv[1:] if argv is None else argv)
    # argparse reads "--minutes=--" as an empty list, which the commands then fail on
    empty = next((arg for arg in given if re.fullmatch(r"--[A-Za-z][\w-]*=--", arg)), None)
    if empty is not None:
        flag = empty.split("=", 1)[0]
        print(f"transduce: error: {empty}: give {flag} a value", file=sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(argv)
    command_parser = vars(args).pop("_subcommand_parser", parser)
    if unknown:  # argparse's own would name the top-level --help
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.no_malloc_tuning:
        from transduce.kernels.process import enlarge_onednn_cache
        from transduce.runtime import tune_malloc

        tune_malloc()
        enlarge_onednn_cache()
    try:
        return args.func(args)
    except UserError as e:
        print(f"transduce: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except RunStopped as e:
        print(f"transduce: stopped: {one_line(str(e))}", file=sys.stderr)
        if isinstance(e, Preempted):
            from transduce.training.preemption import resume_command

            print(f"transduce: resume with: {resume_command(given)}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # what the system says of a path or a device (a name too long, ...)
        where = f"{e.filename}: " if e.filename else ""
        print(f"transduce: error: {one_line(f'{where}{e.strerror or e}')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("transduce: interrupted", file=sys.stderr)
        return 130
    finally:  # a rank that stops on an error leaves its process group too (not together)
        if "transduce.training.distributed" in sys.modules:
            sys.modules["transduce.training.distributed"].shutdown(together=False)


if __name__ == "__main__":
    sys.exit(main())

"""The decoding toolbox's options of ``transduce translate``: sampling, prefixes, ensembles
(loading), line-by-line answers. The work is done in ``transduce.inference`` (``Translator``),
where the server can call it too; here are the flags and the loop over stdin.

Not a command module: ``translation_commands`` and ``score_commands`` import it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from transduce.cli.common import GRAPHS, stdin_line
from transduce.errors import UserError

if TYPE_CHECKING:
    from transduce.config import DecodeConfig
    from transduce.inference.translator import Translator


def check_alpha(
    alpha: float | None, decode: DecodeConfig, nbest: int = 1, *, has_nbest: bool = True
) -> None:
    """A UserError where ``--alpha`` (``alpha``; None: not given) would change nothing: the
    length penalty ranks a beam's hypotheses, or n-best samples, and greedy search or a single
    sample has none to rank. ``has_nbest``: whether the command has ``--nbest``."""
    if alpha is None:
        return
    if decode.sampling and nbest == 1:
        more = "(--nbest 2 or more)" if has_nbest else "(this command draws one a sentence)"
        raise UserError(f"--alpha ranks n-best samples {more}; one sample has no rival")
    if not decode.sampling and decode.beam == 1:
        raise UserError("--alpha ranks a beam's hypotheses; greedy search (beam 1) has none")


def load_translator(args: argparse.Namespace) -> Translator:
    """The Translator of ``--model`` (several: their ensemble), ``--device``, ``--precision``,
    ``--graphs`` (where the command has it; else the Translator's default)."""
    from transduce.inference.translator import Translator

    graphs = GRAPHS[getattr(args, "graphs", "auto")]
    return Translator.load_ensemble(
        args.model, device=args.device, weights=args.weights, graphs=graphs
    )


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sampling",
        action="store_true",
        help="draw each next token from the model's distribution instead of searching (with "
        "--nbest K: K samples per line, best score first); needs --seed",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="sampling: divide the log-probabilities by T (default 1: the model's distribution)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        metavar="K",
        help="sampling: draw from the K most probable tokens only (default 0: all)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=None,
        metavar="P",
        help="sampling: draw from the smallest set of most probable tokens holding probability "
        "P (default 1: all)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="sampling: the seed of each batch's draws (the same seed, input and --batch-tokens "
        "give the same samples)",
    )


def with_sampling(args: argparse.Namespace, decode: DecodeConfig, samples: bool) -> DecodeConfig:
    """``decode`` with the sampling flags' settings (checked as config keys are).

    ``--sampling`` samples; so does a checkpoint whose ``decode`` section samples (``samples``),
    unless ``--beam`` asks for a search. The sampling flags act wherever sampling does, and are
    refused where it does not."""
    given = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    beam = getattr(args, "beam", None)
    if args.sampling and beam is not None:  # a sample is drawn, not searched: no beam
        raise UserError("--beam goes with search, not --sampling")
    sampling = args.sampling or (samples and beam is None)
    if not sampling:
        stray = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        if args.seed is not None:
            stray.append("--seed")
        if stray:
            verb = "goes" if len(stray) == 1 else "go"
            why = " (--beam asks for a search)" if samples else ""
            raise UserError(f"{', '.join(stray)} {verb} with --sampling{why}")
        return decode.searching()
    if args.sampling and args.seed is None:
        raise UserError("--sampling needs --seed N (samples are reproducible for a seed)")
    changes = {k: v for k, v in given.items() if v is not None}
    if args.seed is not None:
        changes["sampling_seed"] = args.seed
    try:
        return replace(decode, sampling=True, **changes)
    except UserError as e:
        raise _naming_flags(e) from None


def flag_settings(translator: Translator, *, scoring: bool = False, **flags: Any) -> DecodeConfig:
    """``translator.decode_config`` of the search flags' values (``beam``, ``alpha``,
    ``batch_tokens``, ``max_len_offset``; None keeps the model's), an error naming the flag.
    ``scoring``: for forced decoding, which searches nothing, so the model's beam is not held
    against the vocabulary (a beam too wide for it refused ``score``, which has no --beam)."""
    try:
        if scoring:
            changes = {key: value for key, value in flags.items() if value is not None}
            return replace(translator.cfg.decode, **changes)  # types and ranges checked
        return translator.decode_config(**flags)
    except UserError as e:
        raise _naming_flags(e) from None


def _naming_flags(e: UserError) -> UserError:
    """``e`` of DecodeConfig's checks, which name its keys, naming the flags that set them."""
    message = str(e)
    for key, flag in _FLAGS.items():
        message = re.sub(rf"(?:\bdecode\.)?\b{key}\b", flag, message)
    return UserError(message)


# the decoding flags by the DecodeConfig keys they set
_FLAGS = {
    "sampling_seed": "--seed",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "beam": "--beam",
    "alpha": "--alpha",
    "batch_tokens": "--batch-tokens",
    "max_len_offset": "--max-len-offset",
}


def add_prefix_file(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefix-file",
        default=None,
        metavar="FILE",
        help="a target prefix per input line (an empty line: none): each translation starts "
        "with its prefix's tokens and the search continues after them",
    )


def read_prefixes(path: str | None, lines: int) -> list[str] | None:
    """The prefixes of ``--prefix-file`` (None without one); a UserError unless there is one
    per input line."""
    if path is None:
        return None
    from transduce.data.parallel import read_lines

    prefixes = read_lines(path)
    if len(prefixes) != lines:
        raise UserError(f"{path}: {len(prefixes)} prefixes for {lines} input lines")
    return prefixes


def add_line_by_line(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interactive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="answer each line of stdin as it arrives (default: when stdin is a terminal)",
    )
    p.add_argument(
        "--unbuffered",
        action="store_true",
        help="the same for a pipe: each input line's answer written and flushed at once",
    )


def line_by_line(args: argparse.Namespace) -> bool:
    """Whether ``translate`` answers stdin a line at a time on stdout: ``--unbuffered``,
    ``--interactive``, or by default when stdin (the input) is a terminal and the answers go to
    stdout."""
    reads_stdin = args.input is None or args.input == "-"
    writes_stdout = args.output is None or args.output == "-"
    if args.interactive is False and (args.unbuffered or not (reads_stdin and writes_stdout)):
        raise UserError(  # it would change nothing: say so, not ignore it
            "--no-interactive reads a whole stdin before answering on stdout: not with "
            "--unbuffered, --input or --output"
        )
    if args.unbuffered or args.interactive:
        if not (reads_stdin and writes_stdout):
            raise UserError(
                "--interactive and --unbuffered answer stdin on stdout: "
                "not with --input or --output"
            )
        return True
    from transduce.console import is_terminal

    on_terminal = sys.stdin is not None and is_terminal(sys.stdin)
    return args.interactive is None and reads_stdin and writes_stdout and on_terminal


def answer_lines(
    answer: Callable[[list[str], int], list[str]],
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> None:
    """For each line of ``stdin`` as it arrives (read with ``readline``, not the read-ahead
    iterator, so a line is answered before the next is typed), write ``answer([line], index)``
    (index: the 0-based line number; the line stripped) and flush."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    if stdin is None or stdout is None:  # started with the stream closed (<&- or >&-)
        raise UserError(f"{'stdin' if stdin is None else 'stdout'} is closed")
    # lines as bytes where there are bytes underneath: each decoded alone, so a bad one is named
    buffer = getattr(stdin, "buffer", None)
    index = 0
    while True:
        raw: bytes | str = stdin.readline() if buffer is None else buffer.readline()
        if not raw:
            return
        line = stdin_line(raw, index + 1)  # as a whole input's: UTF-8, no NUL, no BOM
        for out in answer([line.strip()], index):
            stdout.write(out + "\n")
        stdout.flush()
        index += 1


__all__ = [
    "add_line_by_line",
    "add_prefix_file",
    "add_sampling",
    "answer_lines",
    "check_alpha",
    "line_by_line",
    "load_translator",
    "read_prefixes",
    "with_sampling",
]

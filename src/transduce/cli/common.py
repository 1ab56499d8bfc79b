"""What the command modules share: the options several commands take (a config's ``--set``, the
model, device, weights and decoding options) and reading input lines and writing output lines.

Command modules import this one and never each other; ``main`` puts them together.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transduce.data.parallel import check_line
from transduce.errors import UserError


def add_set(
    p: argparse.ArgumentParser,
    help: str = "override a config key (e.g. --set d_model=256 or --set train.max_steps=100)",
) -> None:
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")


def add_precision(p: argparse.ArgumentParser) -> None:
    """``--precision``: the dtype of the weights a model decodes with (``args.weights``; not
    training's autocast ``train.precision``)."""
    p.add_argument(
        "--precision",
        dest="weights",
        choices=("fp32", "bf16", "fp16", "int8"),
        default="fp32",
        help="weights for decoding: fp32 (as trained, the default), bf16 (faster for batches "
        "where the hardware has bfloat16, slower one sentence at a time on CPUs; a nearly tied "
        "translation may change), fp16 (CUDA GPUs only, for those without bfloat16) or int8 "
        "(a Transformer on a CPU with int8 dot-product "
        "instructions: its projections' weights in int8, one scale per output channel, its "
        "activations one scale per row, faster; "
        "BLEU within a few tenths; TRANSDUCE_FORCE_INT8=1 runs it on other CPUs)",
    )


# --graphs: what it asks of the Translator (its ``graphs``)
GRAPHS: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def add_graphs(p: argparse.ArgumentParser) -> None:
    """``--graphs``: decoding steps replayed as CUDA graphs, or not (``args.graphs``)."""
    p.add_argument(
        "--graphs",
        choices=tuple(GRAPHS),
        default="auto",
        help="decoding steps replayed as CUDA graphs: auto (the default: for a Transformer "
        "translating on a CUDA GPU, measured faster there), on (refused where they cannot be: "
        "off CUDA, for a parsing model) or off (the engine step by step; less memory)",
    )


def add_models(p: argparse.ArgumentParser) -> None:
    """``--model``, once or more (``args.model``: a list of paths; several: an ensemble)."""
    p.add_argument(
        "--model",
        required=True,
        action="append",
        metavar="CKPT",
        help="checkpoint file (model.pt, best.pt) or run folder; given more than once, an "
        "ensemble: the mean of the models' next-token probabilities (one vocabulary)",
    )


class Once(argparse.Action):
    """An option that may be given once: a second time is an error, not a silent last-wins
    (``--model`` twice, say, where another command would make an ensemble of the two)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given more than once; this command takes one")
        setattr(namespace, self.dest, values)


def models_shown(paths: Sequence[str]) -> str | list[str]:
    """``--model`` as a JSON report shows it: the path, or the list of an ensemble's."""
    return str(paths[0]) if len(paths) == 1 else [str(p) for p in paths]


def add_decoding(p: argparse.ArgumentParser) -> None:
    """The options of decoding a file with a checkpoint (``translate``, ``evaluate``)."""
    add_models(p)
    p.add_argument(
        "--beam",
        type=int,
        default=None,
        help="beam size; 1 = greedy (default: the checkpoint's decode.beam, 4 unless its config "
        "set another)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="length penalty alpha (default: the checkpoint's decode.alpha: 0.6 unless its config "
        "set another, e.g. 1.6 in configs/multi30k_en_de.yaml)",
    )
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        metavar="N",
        help="padded source tokens per batch (default: the model's decode.batch_tokens, 4000)",
    )
    add_device(p)
    add_precision(p)
    add_graphs(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def stdin_line(raw: bytes | str, lineno: int) -> str:
    """Line ``lineno`` (1-based) of stdin as text, with a named file's checks: UTF-8 (for bytes),
    no NUL byte, the byte order mark of line 1 dropped. A UserError names the line."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(
                f"<stdin>: line {lineno}: invalid UTF-8 at byte {e.start} of the line"
            ) from None
    check_line(raw, "<stdin>", lineno)
    return raw[1:] if lineno == 1 and raw.startswith("\ufeff") else raw


def _read_stdin() -> list[str]:
    """Lines of stdin, stripped, each checked by ``stdin_line``."""
    if sys.stdin is None:
        raise UserError("stdin is closed: give --input FILE")
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream without bytes underneath (an embedding application)
        lines = sys.stdin.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # after the final newline
    else:
        lines = list(buffer)
    return [stdin_line(line, lineno).strip() for lineno, line in enumerate(lines, start=1)]


def read_input(path: str | None) -> list[str]:
    """Lines of ``path`` (plain or .gz) or, when None or '-', of stdin."""
    from transduce.data.parallel import read_lines

    if path is None or path == "-":
        return _read_stdin()
    return read_lines(path)


def refuse_stdout(path: str, option: str, what: str) -> None:
    """A UserError where ``path`` is '-': ``option`` names a ``what`` (a model file, a folder),
    which cannot go to stdout (and a file named '-' is not what '-' asks for)."""
    if path == "-":
        raise UserError(f"{option} names the {what} to write (not -)")


def refuse_empty_out(out: str, what: str) -> None:
    """A UserError when ``--out`` is empty ("$RUN" unset): ``what`` would be written into the
    current directory."""
    if not out.strip():
        raise UserError(f"--out is empty (an unset variable?): name {what}")


def check_output(path: str | None) -> None:
    """A UserError when ``--output`` ``path`` cannot be written as a file: a folder, or in a
    folder that does not exist. Asked before any work, so that a wrong path does not cost a
    whole run's work first (stdout, None or '-', always can)."""
    if path is None or path == "-":
        return
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{out}: is a folder; --output names the file to write")
    if not out.parent.is_dir():
        raise UserError(f"{out}: no such folder {out.parent} (--output names the file to write)")


def write_output(path: str | None, lines: Sequence[str]) -> None:
    """Write ``lines`` (each + newline) to ``path`` or, when None or '-', stdout; a ``.gz``
    path gzip-compressed, as such inputs are read. A regular file (or a new one) is written
    whole or not at all (a temporary file renamed over it); anything else the path names (a
    device such as /dev/null, a pipe, a symbolic link) is written into, not replaced."""
    text = "".join(line + "\n" for line in lines)
    if path is None or path == "-":
        if sys.stdout is None:
            raise UserError("stdout is closed: give --output FILE")
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    out = Path(path)
    data = text.encode("utf-8")
    if out.suffix.lower() == ".gz":  # as data/parallel.py reads .gz and .GZ
        data = gzip.compress(data, mtime=0)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        try:
            with open(out, "wb") as f:
                f.write(data)
        except OSError as e:
            raise UserError(f"{out}: cannot write ({e.strerror or e})") from None
        return
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{out}: cannot write ({e.strerror or e})") from None


def refuse_parser(task_name: str, model: str, command: str) -> None:
    """A UserError when ``model`` (its ``task.name``) is a parser: ``command`` gives text, and a
    parser's output is a tree, which ``transduce parse`` builds (raw bracket tokens are not)."""
    if task_name == "parsing":
        raise UserError(
            f"{model} is a parsing model: `transduce {command}` gives text; use "
            "`transduce parse` for its trees"
        )


def unknown_warning(
    vocab: Any, sentences: Sequence[str], where: str = "", *, target: bool = False
) -> str | None:
    """A warning line when ``sentences`` hold characters (a character vocabulary) or pieces the
    model's source vocabulary (``target``: its target vocabulary) lacks (read as <unk>), or
    None: a model of digits given English would otherwise answer without a word. ``where``
    (e.g. "line 3: ") goes before the count."""
    from transduce.data.vocab import UNK, CharVocab, VocabPair

    side = (vocab.target if target else vocab.source) if isinstance(vocab, VocabPair) else vocab
    n = sum(ids.count(UNK) for ids in (side.encode(s) for s in sentences if s))
    if not n:
        return None
    what = "characters" if isinstance(side, CharVocab) else "pieces"
    alphabet = f" ({''.join(side.symbols)})" if isinstance(side, CharVocab) else ""
    noun = "target" if target else "input"
    return (
        f"transduce: warning: {where}{n} {noun} {what} not in the model's vocabulary{alphabet}, "
        "read as <unk>"
    )


def one_output_line(text: str) -> str:
    """``text`` with its line breaks made spaces. A translation never holds a newline (the
    vocabulary folds whitespace), but an output line per input line is the contract, so make
    sure of it."""
    return " ".join(text.splitlines())


__all__ = [
    "GRAPHS",
    "Once",
    "add_decoding",
    "add_device",
    "add_graphs",
    "add_models",
    "add_precision",
    "add_set",
    "models_shown",
    "one_output_line",
    "read_input",
    "refuse_parser",
    "require",
    "unknown_warning",
    "write_output",
]


def require(modules: tuple[str, ...], extra: str, what: str) -> None:
    """A one-line UserError naming the missing ``modules`` and the extra that installs them."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{what} needs {', '.join(missing)}: pip install 'transduce[{extra}]'")

"""One rule for options: every option a command accepts either acts or is refused in one line
naming it (exit 2). Walks each model command's options, as ``cli/main.py build_parser`` builds
them, against each kind of model (conftest ``model_kinds``) and fails on a silent no-op: an
option whose run exits 0 and looks exactly like the run without it.

"Looks like" is everything a user or a caller could see: the exit code, stdout, stderr, the
files written, and what reached the decoder (its settings, the weights' dtype, whether the
search was constrained, whether progress was shown, the alignment layer), the last through spies
on ``Translator``, so that an option of speed (``--batch-tokens``) counts once it arrives. Each
option's probe is a value other than its default; a new option without a probe fails the test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from transduce.cli.main import build_parser, main
from transduce.inference.translator import Translator

# What every model command of this walk takes besides the probed option (per model kind: the
# input the kind reads). {src}, {ref}, {src2}: files made in each run's folder.
BASE = {
    "translate": ["--input", "{src}"],
    "evaluate": ["--src", "{src}", "--ref", "{ref}"],
    "parse": ["--input", "{src}"],
    "attention": ["--src", "{line}", "--output", "a.html"],
    "score": ["--src", "{src}", "--tgt", "{ref}"],
}
# command -> option dest -> the arguments that give it a value other than its default (and,
# after a "|", the arguments it goes with, added to both runs)
PROBES: dict[str, dict[str, list[str]]] = {
    "translate": {
        "beam": ["--beam", "1"],
        "alpha": ["--alpha", "1.5"],
        "batch_tokens": ["--batch-tokens", "7"],
        "weights": ["--precision", "bf16"],
        "graphs": ["--graphs", "on"],  # a CPU: refused
        "quiet": ["--quiet"],
        "input": ["--input", "{src2}"],
        "output": ["--output", "out.txt"],
        "nbest": ["--nbest", "2"],
        "max_len_offset": ["--max-len-offset", "1"],
        "alignments": ["--alignments"],
        "alignment_layer": ["--alignment-layer", "0", "|", "--alignments"],
        "sampling": ["--sampling", "--seed", "3"],
        "temperature": ["--temperature", "0.5", "|", "--sampling", "--seed", "3"],
        "top_k": ["--top-k", "1", "|", "--sampling", "--seed", "3"],
        "top_p": ["--top-p", "0.1", "|", "--sampling", "--seed", "3"],
        "seed": ["--seed", "4", "|", "--sampling", "--seed", "3"],
        "prefix_file": ["--prefix-file", "{pre}"],
        "interactive": ["--interactive"],
        "unbuffered": ["--unbuffered"],
    },
    "evaluate": {
        "beam": ["--beam", "1"],
        "alpha": ["--alpha", "1.5"],
        "batch_tokens": ["--batch-tokens", "7"],
        "weights": ["--precision", "bf16"],
        "graphs": ["--graphs", "on"],  # a CPU: refused
        "quiet": ["--quiet"],
        "lowercase": ["--lowercase"],
        "constrained": ["--constrained"],
        "output": ["--output", "out.txt"],
    },
    "parse": {
        "beam": ["--beam", "1"],
        "alpha": ["--alpha", "1.5"],
        "quiet": ["--quiet"],
        "input": ["--input", "{src2}"],
        "output": ["--output", "out.txt"],
        "max_len_offset": ["--max-len-offset", "1"],
        "constrained": ["--constrained"],
    },
    "score": {
        "normalize": ["--normalize"],
        "alpha": ["--alpha", "1.5"],
        "batch_tokens": ["--batch-tokens", "7"],
        "weights": ["--precision", "bf16"],
        "output": ["--output", "out.txt"],
    },
    "attention": {
        "tgt": ["--tgt", "{line}"],
        "kind": ["--kind", "encoder"],
        "layer": ["--layer", "0"],
        "head": ["--head", "1"],
        "style": ["--style", "lines"],
    },
}
# more values of an option to probe besides PROBES' (each its own run)
MORE_PROBES: dict[str, dict[str, list[list[str]]]] = {
    command: {"weights": [["--precision", "int8"], ["--precision", "fp16"]]}
    for command in ("translate", "evaluate", "score")
}
# options the walk leaves out, with the reason
NOT_PROBED = {
    "model": "the model itself (required)",
    "src": "the command's input (required)",
    "ref": "the command's input (required)",
    "tgt": "score's input (required; attention's --tgt is probed)",
    "output": "the command's output (required)",
    "device": "one device on this machine, the default cpu",
    "no_malloc_tuning": "tunes the process's allocator: nothing a run shows",
}
KINDS = ("synthetic", "shared", "separate", "parser", "recurrent")
INPUTS = {"synthetic": ["12+34", "5+678"], "parser": ["the dog runs", "a red ball"]}
OTHER_INPUTS = {"synthetic": ["9+9", "11+2"], "parser": ["the man sits", "a big cat"]}
PREFIXES = {"synthetic": ["4", "6"], "parser": ["(TOP", "(TOP"]}
REFERENCES = {
    "synthetic": ["46", "683"],
    "parser": [
        "(TOP (S (NP (DT the) (NN dog)) (VP (VBZ runs))))",
        "(TOP (NP (DT a) (JJ red) (NN ball)))",
    ],
}


def _lines(table: dict[str, list[str]], kind: str, default: list[str]) -> list[str]:
    return table.get(kind, default)


def _options(command: str) -> list[argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        a
        for a in sub.choices[command]._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


class Seen:
    """What reached the decoder in one run (the spies' record)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


@contextlib.contextmanager
def _spies(seen: Seen) -> Iterator[None]:
    decode, align, score = Translator._decode, Translator.align, Translator.score

    def spy_decode(
        self: Translator, sentences: Any, cfg: Any, nbest: int, show: Any, prefixes: Any = None
    ) -> Any:
        dtype = next(self.model.parameters()).dtype
        engine = type(self.decoding).__name__, getattr(self.decoding, "int8", None)
        seen.calls.append(
            ("decode", list(sentences), cfg, nbest, show, str(dtype), engine, prefixes)
        )
        return decode(self, sentences, cfg, nbest, show, prefixes)

    def spy_align(self: Translator, sentences: Any, translations: Any, *, layer: int = -1) -> Any:
        seen.calls.append(("align", layer))
        return align(self, sentences, translations, layer=layer)

    def spy_score(self: Translator, sources: Any, targets: Any, cfg: Any = None) -> Any:
        int8 = getattr(self.decoding, "int8", None)
        seen.calls.append(("score", cfg, str(next(self.model.parameters()).dtype), int8))
        return score(self, sources, targets, cfg)

    with (
        mock.patch.object(Translator, "score", spy_score),
        mock.patch.object(Translator, "_decode", spy_decode),
        mock.patch.object(Translator, "align", spy_align),
    ):
        yield


def _run(folder: Path, kind: str, argv: list[str]) -> tuple[Any, ...]:
    """Everything a run of ``argv`` in a fresh ``folder`` shows."""
    folder.mkdir(parents=True)
    src = _lines(INPUTS, kind, ["the dog runs", "a red ball"])
    files = {
        "src": src,
        "src2": _lines(OTHER_INPUTS, kind, ["the man sits", "a big cat"]),
        "pre": _lines(PREFIXES, kind, ["der", "ein"]),
        "ref": _lines(REFERENCES, kind, ["der hund rennt", "ein roter ball"]),
    }
    for name, lines in files.items():
        (folder / f"{name}.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    values = {"src": "src.txt", "src2": "src2.txt", "ref": "ref.txt", "pre": "pre.txt"}
    values["line"] = src[0]
    argv = [a.format(**values) for a in argv]
    out, err, seen = io.StringIO(), io.StringIO(), Seen()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(folder))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(mock.patch.object(sys, "stdin", io.StringIO("")))
        stack.enter_context(_spies(seen))
        try:
            code = main(["--no-malloc-tuning", *argv])
        except SystemExit as e:
            code = e.code
    written = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    return code, out.getvalue(), err.getvalue(), written, repr(seen.calls)


def _names(action: argparse.Action) -> list[str]:
    """How a refusal may name the option: as given, or its words (``alignment layer``)."""
    out = []
    for o in action.option_strings:
        out += [o, o.lstrip("-").replace("-", " "), o.lstrip("-").replace("-", "_")]
    return out


def test_every_option_has_a_probe_or_a_reason() -> None:
    for command, probes in PROBES.items():
        for action in _options(command):
            assert action.dest in probes or action.dest in NOT_PROBED, (command, action.dest)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", list(PROBES))
def test_each_option_acts_or_is_refused(model_kinds, tmp_path, kind: str, command: str) -> None:
    base = [command, "--model", str(model_kinds[kind]), *BASE[command]]
    first = _run(tmp_path / "base", kind, base)
    if first[0] != 0:  # the command refuses this kind of model: one line, before any option
        assert first[0] == 2 and len(first[2].splitlines()) == 1, first
        assert first[2].startswith("transduce: error: ") and not first[3].get("out.txt"), first
        return
    assert _run(tmp_path / "again", kind, base) == first  # a run shows the same each time
    silent = []
    for action in _options(command):
        if action.dest not in PROBES[command]:
            continue
        more = MORE_PROBES.get(command, {}).get(action.dest, [])
        for m, given in enumerate([PROBES[command][action.dest], *more]):
            silent += _probe(tmp_path / f"{action.dest}{m}", kind, base, first, action, given)
    assert not silent, f"{command} on a {kind} model: no effect and no refusal: {silent}"


def _probe(
    folder: Path,
    kind: str,
    base: list[str],
    first: tuple[Any, ...],
    action: argparse.Action,
    probe: list[str],
) -> list[str]:
    """The runs of one probe (alone, then with the option it goes with, unless that one is
    refused) that showed nothing and were not refused."""
    goes_with = probe[probe.index("|") + 1 :] if "|" in probe else []
    probe = probe[: probe.index("|")] if "|" in probe else probe
    tries = [([], first)]
    if goes_with:
        before = _run(folder / "with", kind, base + goes_with)
        tries += [(goes_with, before)] if before[0] == 0 else []
    silent = []
    for n, (extra, before) in enumerate(tries):
        shown = _run(folder / str(n), kind, base + extra + probe)
        if shown[0] == 2:  # refused: one line naming the option
            line = shown[2].splitlines()
            assert len(line) == 1 and any(x in line[0] for x in _names(action)), shown[2]
        else:
            assert shown[0] == 0, (probe, shown)
            if shown == before:
                silent.append(" ".join(extra + probe))
    return silent

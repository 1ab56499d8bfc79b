"""Subcommands about real translation: data (fetch corpora), translate, evaluate.

``transduce translate`` reads raw text (one sentence per line, UTF-8) from ``--input`` or stdin
and writes detokenized translations to ``--output`` or stdout, one line per input line in the
same order; an empty input line gives an empty output line. With ``--nbest K`` (K > 1) each input
line gives up to K lines ``INDEX<TAB>SCORE<TAB>TEXT``, best first: INDEX is the 0-based input
line number, SCORE the length-normalised log-probability ``log P / lp`` the beam ranks by (an
empty input line gives the single line ``INDEX<TAB>0.0000<TAB>``).

``transduce evaluate`` translates ``--src`` and prints one JSON object with sacreBLEU's BLEU and
chrF against ``--ref`` (cased, detokenized, 13a; see ``transduce.evaluation.bleu``), their
signatures, ``bleu_lowercase`` and the number of lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from transduce.cli.parsing_commands import add_data_command
from transduce.cli.prepare_commands import add_data_command as add_wmt14_command
from transduce.errors import UserError


def _read_stdin() -> list[str]:
    """Lines of stdin, stripped, decoded as UTF-8 (an invalid line is a UserError naming it)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream without bytes underneath (an embedding application)
        lines = sys.stdin.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # after the final newline
        return [line.strip() for line in lines]
    lines = []
    for lineno, raw in enumerate(buffer, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(
                f"<stdin>: line {lineno}: invalid UTF-8 at byte {e.start} of the line"
            ) from None
        if lineno == 1 and text.startswith("\ufeff"):
            text = text[1:]
        lines.append(text.strip())
    return lines


def _read_input(path: str | None) -> list[str]:
    from transduce.data.parallel import read_lines

    if path is None or path == "-":
        return _read_stdin()
    return read_lines(path)


def _write_output(path: str | None, lines: Sequence[str]) -> None:
    """Write ``lines`` (each + newline) to ``path`` or, when None or '-', stdout."""
    text = "".join(line + "\n" for line in lines)
    if path is None or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{out}: cannot write ({e.strerror or e})") from None


def _one_line(text: str) -> str:
    # A translation never holds a newline (the vocabulary folds whitespace), but an output line
    # per input line is the contract, so make sure of it.
    return " ".join(text.splitlines())


def _cmd_translate(args: argparse.Namespace) -> int:
    from transduce.inference.translator import Translator

    if args.nbest < 1:
        raise UserError(f"--nbest must be at least 1; got {args.nbest}")
    translator = Translator.load(args.model, device=args.device, precision=args.precision)  # a bad --model: before stdin
    sentences = _read_input(args.input)
    options = {
        "beam": args.beam, "alpha": args.alpha, "batch_tokens": args.batch_tokens,
        "max_len_offset": args.max_len_offset, "show_progress": None if not args.quiet else False,
    }  # fmt: skip
    if args.alignments and args.nbest != 1:
        raise UserError("--alignments goes with one translation per line (--nbest 1)")
    if args.nbest == 1:
        out = [_one_line(t) for t in translator.translate(sentences, **options)]
        if args.alignments:
            aligned = translator.align(sentences, out, layer=args.alignment_layer)
            out = [f"{t}\t{a}" for t, a in zip(out, aligned, strict=True)]
    else:
        out = [
            f"{i}\t{h.score:.4f}\t{_one_line(h.text)}"
            for i, hyps in enumerate(translator.translate_nbest(sentences, args.nbest, **options))
            for h in hyps
        ]
    _write_output(args.output, out)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from transduce.inference.parsing import evaluate_checkpoint

    scores, hyps = evaluate_checkpoint(
        args.model, args.src, args.ref, device=args.device, precision=args.precision,
        beam=args.beam, alpha=args.alpha, batch_tokens=args.batch_tokens,
        lowercase=args.lowercase, constrained=args.constrained,
        show_progress=None if not args.quiet else False,
    )  # fmt: skip
    if args.output:
        _write_output(args.output, [_one_line(h) for h in hyps])
    print(json.dumps({"model": str(args.model), "src": str(args.src), "ref": str(args.ref),
                      **scores}))  # fmt: skip
    return 0


def _cmd_data_multi30k(args: argparse.Namespace) -> int:
    from transduce.data.multi30k import SPLIT_SIZES, fetch_multi30k

    data = fetch_multi30k(
        args.dest, src=args.src, tgt=args.tgt, from_dir=args.from_dir, progress=not args.quiet,
        force=args.force,
    )  # fmt: skip
    print(json.dumps({
        "dest": str(data.root), "src": data.src, "tgt": data.tgt,
        "splits": {split: {"lines": SPLIT_SIZES[split], **{lang: str(p) for lang, p in f.items()}}
                   for split, f in data.files.items()},
    }))  # fmt: skip
    return 0


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="checkpoint file (model.pt, best.pt) or run folder"
    )
    p.add_argument(
        "--beam", type=int, default=None,
        help="beam size; 1 = greedy (default: the checkpoint's decode.beam, 4 unless its config "
        "set another)",
    )  # fmt: skip
    p.add_argument(
        "--alpha", type=float, default=None,
        help="length penalty alpha (default: the checkpoint's decode.alpha: 0.6 unless its config "
        "set another, e.g. 1.6 in configs/multi30k_en_de.yaml)",
    )  # fmt: skip
    p.add_argument(
        "--batch-tokens", type=int, default=None, metavar="N",
        help="padded source tokens per batch (default: the model's decode.batch_tokens, 4000)",
    )  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    add_precision(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32",
        help="weights for decoding: fp32 (as trained, the default) or bf16 (faster for batches "
        "where the hardware has bfloat16, slower one sentence at a time on CPUs; a nearly tied "
        "translation may change)",
    )  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="fetch a corpus")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="CORPUS")
    m = data_sub.add_parser(
        "multi30k",
        help="Multi30k task 1 (en, de, fr, cs), checked and gzip-compressed",
        description="Put the train, val and test files of one Multi30k language pair into DEST, "
        "copied from a local mirror (--from) or downloaded; every file is checked.",
    )
    m.add_argument("--dest", required=True, help="folder to put the files in (e.g. data/multi30k)")
    m.add_argument(
        "--from", dest="from_dir", default=None, metavar="DIR",
        help="local mirror holding the .gz files (or a multi30k/ folder of them)",
    )  # fmt: skip
    m.add_argument("--src", default="en", help="source language: en, de, fr or cs (default: en)")
    m.add_argument("--tgt", default="de", help="target language: en, de, fr or cs (default: de)")
    m.add_argument("--force", action="store_true", help="fetch again files already there")
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    m.set_defaults(func=_cmd_data_multi30k)
    add_data_command(data_sub)
    add_wmt14_command(data_sub)

    p = sub.add_parser(
        "translate",
        help="translate raw text with a trained model",
        description="Translate one sentence per line from --input (or stdin) to --output (or "
        "stdout), in order, an empty line for an empty line. With --nbest K > 1 each input line "
        "gives up to K lines 'INDEX<TAB>SCORE<TAB>TEXT' (INDEX: 0-based input line; SCORE: "
        "log-probability / length penalty, best first).",
    )
    _add_decoding(p)
    p.add_argument("--input", default=None, help="text file, plain or .gz (default: stdin)")
    p.add_argument("--output", default=None, help="file to write (default: stdout)")
    p.add_argument(
        "--nbest", type=int, default=1, metavar="K", help="hypotheses per line (<= beam)"
    )
    p.add_argument(
        "--max-len-offset", type=int, default=None, metavar="N",
        help="outputs have at most source tokens + N tokens (default: the model's, 50)",
    )  # fmt: skip
    p.add_argument(
        "--alignments", action="store_true",
        help="append a TAB and the word alignment in Pharaoh format (i-j: source word i, target "
        "word j), from encoder-decoder attention averaged over the heads of one layer",
    )  # fmt: skip
    p.add_argument(
        "--alignment-layer", type=int, default=-1, metavar="L",
        help="the layer whose attention aligns (default: the last, -1)",
    )  # fmt: skip
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser(
        "evaluate",
        help="sacreBLEU BLEU and chrF of a model on a test set (EVALB F1 for a parser)",
        description="Translate --src and score it against --ref with sacreBLEU; prints one JSON "
        "object (bleu, chrf, their signatures, bleu_lowercase, lines). For a parsing model "
        "(--src: words, --ref: trees) EVALB's precision, recall, F1, exact match, F1 on "
        "sentences of at most 40 words, the share well-formed and the repairs.",
    )
    _add_decoding(p)
    p.add_argument("--src", required=True, help="source file, one sentence per line (plain or .gz)")
    p.add_argument("--ref", required=True, help="reference translations, line-aligned with --src")
    p.add_argument("--lowercase", action="store_true", help="case-insensitive bleu and chrf")
    p.add_argument(
        "--constrained", action=argparse.BooleanOptionalAction, default=None,
        help="a parsing model: decode only continuations that can still become a well-formed "
        "tree with the input's words (default: the model's task.constrained)",
    )  # fmt: skip
    p.add_argument("--output", default=None, help="also write the translations to this file")
    p.set_defaults(func=_cmd_evaluate)


__all__ = ["register"]

"""Subcommands about real translation: translate, evaluate (a parsing model's too).

``transduce translate`` reads raw text (one sentence per line, UTF-8) from ``--input`` or stdin
and writes detokenized translations to ``--output`` or stdout, one line per input line in the
same order; an empty input line gives an empty output line. With ``--nbest K`` (K > 1) each input
line gives up to K lines ``INDEX<TAB>SCORE<TAB>TEXT``, best first: INDEX is the 0-based input
line number, SCORE the length-normalised log-probability ``log P / lp`` the beam ranks by (an
empty input line gives the single line ``INDEX<TAB>0.0000<TAB>``). The decoding toolbox's
options (``--sampling``, ``--prefix-file``, ``--model`` twice for an ensemble, ``--unbuffered``
and ``--interactive``) are in ``transduce.cli.decoding_tools``.

``transduce evaluate`` translates ``--src`` and prints one JSON object with sacreBLEU's BLEU and
chrF against ``--ref`` (cased, detokenized, 13a; see ``transduce.evaluation.bleu``), their
signatures, ``bleu_lowercase`` and the number of lines; for a parsing model (by the
checkpoint's task) EVALB's scores of the trees instead (``transduce.parsing.parser``).
"""

from __future__ import annotations

import argparse
import json
import sys

from transduce.cli import decoding_tools as tools
from transduce.cli.common import (
    GRAPHS,
    add_decoding,
    check_output,
    models_shown,
    one_output_line,
    read_input,
    refuse_parser,
    unknown_warning,
    write_output,
)
from transduce.errors import SentenceError, UserError


def _cmd_translate(args: argparse.Namespace) -> int:
    if args.nbest < 1:
        raise UserError(f"--nbest must be at least 1; got {args.nbest}")
    check_output(args.output)
    # a bad --model: before reading stdin
    translator = tools.load_translator(args)
    refuse_parser(translator.cfg.task.name, args.model[0], "translate")
    if args.alignments and args.nbest != 1:
        raise UserError("--alignments goes with one translation per line (--nbest 1)")
    if args.alignments and len(args.model) > 1:  # whose attention? each member's differs
        raise UserError("--alignments read one model's attention: give one --model, not several")
    if args.alignment_layer is not None and not args.alignments:
        raise UserError("--alignment-layer goes with --alignments")
    if args.alignments:  # refused before decoding, not after the whole input
        translator.check_alignment(-1 if args.alignment_layer is None else args.alignment_layer)
    decode = tools.flag_settings(
        translator,
        beam=args.beam,
        alpha=args.alpha,
        batch_tokens=args.batch_tokens,
        max_len_offset=args.max_len_offset,
    )
    decode = tools.with_sampling(args, decode, translator.cfg.decode.sampling)
    tools.check_alpha(args.alpha, decode, args.nbest)
    show_progress = None if not args.quiet else False

    def answer(sentences: list[str], first: int, prefixes: list[str] | None = None) -> list[str]:
        """The output lines of ``sentences`` (``first``: the input line number of the first)."""
        if args.nbest == 1:
            translations = translator.translate(
                sentences, decode, show_progress=show_progress, prefixes=prefixes
            )
            out = [one_output_line(t) for t in translations]
            if args.alignments:
                layer = -1 if args.alignment_layer is None else args.alignment_layer
                aligned = translator.align(sentences, out, layer=layer)
                out = [f"{t}\t{a}" for t, a in zip(out, aligned, strict=True)]
            return out
        nbest = translator.translate_nbest(
            sentences, args.nbest, decode, show_progress=show_progress, prefixes=prefixes
        )
        return [
            f"{first + i}\t{h.score:.4f}\t{one_output_line(h.text)}"
            for i, hyps in enumerate(nbest)
            for h in hyps
        ]

    if tools.line_by_line(args):
        if args.prefix_file is not None:
            raise UserError("--prefix-file goes with a whole input, not line by line")
        for given, option in (
            (args.batch_tokens is not None, "--batch-tokens"),
            (args.quiet, "--quiet"),
        ):
            if given:  # each line is a batch of its own, with no progress bar
                raise UserError(f"{option} goes with a whole input, not line by line")
        show_progress = False

        def answer_warned(sentences: list[str], first: int) -> list[str]:
            warning = unknown_warning(translator.vocab, sentences, f"line {first + 1}: ")
            if warning:  # as the line is answered: the whole input is never seen at once
                print(warning, file=sys.stderr, flush=True)
            try:
                return answer(sentences, first)
            except SentenceError as e:  # the line of stdin, not "sentence 1" of one
                raise e.at_line("<stdin>", first + e.sentence) from None

        tools.answer_lines(answer_warned)
        return 0
    sentences = read_input(args.input)
    prefixes = tools.read_prefixes(args.prefix_file, len(sentences))
    try:
        answers = answer(sentences, 0, prefixes)
    except SentenceError as e:  # sentence K is line K of the input, prefix K of the prefixes
        name = "<stdin>" if args.input in (None, "-") else args.input
        raise e.at_line(args.prefix_file if e.noun == "prefix" else name, e.sentence) from None
    write_output(args.output, answers)
    warning = unknown_warning(translator.vocab, sentences)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def _refuse_for_kind(args: argparse.Namespace, parsing: bool) -> None:
    """A UserError naming an option that the model's kind would leave without effect."""
    if parsing and args.lowercase:
        raise UserError(
            "--lowercase is for BLEU and chrF; a parsing model is scored by EVALB, "
            "whose labels and words are compared as written"
        )
    if not parsing and args.constrained is not None:
        flag = "--constrained" if args.constrained else "--no-constrained"
        raise UserError(
            f"{flag} is for a parsing model (tree-constrained search); this model translates"
        )


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from transduce.checkpoint import load_model
    from transduce.device import resolve_device
    from transduce.inference.weights import check_device, check_int8, weight_dtype

    check_output(args.output)
    model, vocab, cfg = load_model(args.model[0], device=resolve_device(args.device))
    _refuse_for_kind(args, cfg.task.name == "parsing")
    show_progress = None if not args.quiet else False
    if cfg.task.name == "parsing":  # EVALB of the trees; the trees are the outputs
        from transduce.data.trees import to_brackets
        from transduce.parsing.parser import Parser, evaluate_parser

        if len(args.model) > 1:
            raise UserError("a parsing model is evaluated alone, not in an ensemble")
        if args.weights == "int8":  # the parser's searches run the float model's own engine
            raise UserError(
                "--precision int8 is for translation models; a parser takes fp32, bf16 or fp16"
            )
        if args.graphs == "on":  # the Parser decodes step by step, on its own Translator
            raise UserError("--graphs on is for translation models; a parser decodes without")
        check_device(args.weights, resolve_device(args.device))
        parser = Parser(model.to(weight_dtype(args.weights)), vocab, cfg)
        decode = tools.flag_settings(
            parser.translator, beam=args.beam, alpha=args.alpha, batch_tokens=args.batch_tokens
        )
        tools.check_alpha(args.alpha, decode, has_nbest=False)
        scores, parses = evaluate_parser(
            parser,
            args.src,
            args.ref,
            decode,
            constrained=args.constrained,
            show_progress=show_progress,
        )
        hyps = [to_brackets(p.tree) for p in parses]
    else:
        from transduce.inference.evaluation import evaluate_files
        from transduce.inference.translator import Translator

        if len(args.model) == 1:
            if args.weights == "int8":  # as Translator.load: the model's kind, naming it
                check_int8(model, args.model[0])
            translator = Translator.of_model(
                model, vocab, cfg, args.weights, graphs=GRAPHS[args.graphs]
            )
        else:
            translator = tools.load_translator(args)
        # (a model that samples: --beam searches)
        decode = tools.flag_settings(
            translator, beam=args.beam, alpha=args.alpha, batch_tokens=args.batch_tokens
        )
        tools.check_alpha(args.alpha, decode, has_nbest=False)
        try:
            scores, hyps = evaluate_files(
                translator,
                args.src,
                args.ref,
                decode,
                lowercase=args.lowercase,
                show_progress=show_progress,
            )
        except SentenceError as e:  # sentence K is line K of --src
            raise e.at_line(args.src, e.sentence) from None
        from transduce.data.parallel import read_lines

        warning = unknown_warning(vocab, read_lines(args.src))
        if warning:
            print(warning, file=sys.stderr)
    if args.output:
        write_output(args.output, [one_output_line(h) for h in hyps])
    print(
        json.dumps(
            {
                "model": models_shown(args.model),
                "src": str(args.src),
                "ref": str(args.ref),
                **scores,
            }
        )
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate raw text with a trained model",
        description="Translate one sentence per line from --input (or stdin) to --output (or "
        "stdout), in order, an empty line for an empty line. With --nbest K > 1 each input line "
        "gives up to K lines 'INDEX<TAB>SCORE<TAB>TEXT' (INDEX: 0-based input line; SCORE: "
        "log-probability / length penalty, best first).",
    )
    add_decoding(p)
    tools.add_sampling(p)
    tools.add_prefix_file(p)
    tools.add_line_by_line(p)
    p.add_argument("--input", default=None, help="text file, plain or .gz (default: stdin)")
    p.add_argument(
        "--output", default=None, help="file to write (default: stdout; a .gz name: gzip)"
    )
    p.add_argument(
        "--nbest",
        type=int,
        default=1,
        metavar="K",
        help="hypotheses per line (<= beam; with --sampling, samples)",
    )
    p.add_argument(
        "--max-len-offset",
        type=int,
        default=None,
        metavar="N",
        help="outputs have at most source tokens + EOS + N tokens (default: the model's, 50)",
    )
    p.add_argument(
        "--alignments",
        action="store_true",
        help="append a TAB and the word alignment in Pharaoh format (i-j: source word i, target "
        "word j), from encoder-decoder attention averaged over the heads of one layer",
    )
    p.add_argument(
        "--alignment-layer",
        type=int,
        default=None,
        metavar="L",
        help="the layer whose attention aligns (default: the last, -1)",
    )
    p.set_defaults(func=_cmd_translate)

    p = sub.add_parser(
        "evaluate",
        help="sacreBLEU BLEU and chrF of a model on a test set (EVALB F1 for a parser)",
        description="Translate --src and score it against --ref with sacreBLEU; prints one JSON "
        "object (bleu, chrf, their signatures, bleu_lowercase, lines). For a parsing model "
        "(--src: words, --ref: trees) EVALB's precision, recall, F1, exact match, F1 on "
        "sentences of at most 40 words, the share well-formed and the repairs.",
    )
    add_decoding(p)
    p.add_argument("--src", required=True, help="source file, one sentence per line (plain or .gz)")
    p.add_argument("--ref", required=True, help="reference translations, line-aligned with --src")
    p.add_argument(
        "--lowercase",
        action="store_true",
        help="case-insensitive bleu and chrf (a translation model; refused for a parser)",
    )
    p.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a parsing model: decode only continuations that can still become a well-formed "
        "tree with the input's words (default: the model's task.constrained; refused for a "
        "translation model)",
    )
    p.add_argument(
        "--output",
        default=None,
        help="also write the translations (a parser's trees, one a line) to this file (a .gz "
        "name: gzip)",
    )
    p.set_defaults(func=_cmd_evaluate)


__all__ = ["register"]

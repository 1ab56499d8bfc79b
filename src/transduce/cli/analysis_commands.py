"""Subcommands that show what a model learned: attention, plot curves, experiment reversal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from transduce.cli.common import Once, refuse_empty_out, unknown_warning
from transduce.errors import UserError


def _cmd_attention(args: argparse.Namespace) -> int:
    from transduce.checkpoint import load_model
    from transduce.inference.attention_maps import draw_attention
    from transduce.inference.text_inputs import as_read

    if args.kind == "encoder" and args.tgt is not None:
        raise UserError("--tgt: encoder self-attention reads the source alone (give no --tgt)")
    for name, text in (("--src", args.src), ("--tgt", args.tgt)):
        _check_text(name, text)
    model, vocab, cfg = load_model(args.model)
    heads = getattr(cfg.model, "n_heads", None)  # (the recurrent model's is refused below)
    if args.head is not None and heads is not None and not 0 <= args.head < heads:
        raise UserError(f"--head {args.head}: the model's heads are 0 to {heads - 1}")
    target = args.tgt
    if target is not None and cfg.task.name == "parsing":  # a tree, linearised as trained
        target = _parser_target(model, vocab, cfg, args.src, target)
    path = draw_attention(
        model,
        vocab,
        as_read(args.src, cfg.task),  # as the model reads it (a reversed synthetic task)
        Path(args.output),
        target=target,
        kind=args.kind,
        layer=args.layer,
        head=args.head,
        style=args.style,
        max_len_offset=cfg.decode.max_len_offset,  # the model's output limit, as translate's
    )
    for text, is_target in ((args.src, False), (target, True)):  # once drawn: an error alone
        warning = None if text is None else unknown_warning(vocab, [text], target=is_target)
        if warning is not None:  # drawn as <unk>, as translate reads them
            print(warning, file=sys.stderr)
    print(json.dumps({"output": str(path)}))
    return 0


def _check_text(name: str, text: str | None) -> None:
    """A UserError naming the option whose text holds what UTF-8 cannot write (bytes of another
    encoding on the command line arrive as lone surrogates)."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(
            f"{name}: character {e.start + 1} is not text (bytes that are not UTF-8?); give "
            "UTF-8 text"
        ) from None


def _parser_target(model: Any, vocab: Any, cfg: Any, words: str, text: str) -> str:
    """--tgt's bracketed tree for --src's words as a parsing model's target text (``score``
    reads trees so too); a target text already (every token the model's, as ``(S XX )S``) as
    it is."""
    from transduce.data.trees import parse_trees
    from transduce.data.vocab import UNK
    from transduce.parsing.parser import Parser

    if UNK not in vocab.target.encode(text):
        return text

    trees = parse_trees(text, name="--tgt")
    if len(trees) != 1:
        raise UserError(f"--tgt: a parser's target is one bracketed tree, not {len(trees)}")
    try:
        return Parser(model, vocab, cfg).target_texts([words.split()], trees)[0]
    except UserError as e:  # about "tree 1"
        raise UserError(f"--tgt: {e}") from None


def _cmd_plot_curves(args: argparse.Namespace) -> int:
    from transduce.plotting.curves import plot_curves

    metrics = None
    if args.metrics is not None:
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
        if not metrics:
            raise UserError(f"--metrics {args.metrics!r} names no metric (e.g. loss,bleu)")
    path = plot_curves([Path(r) for r in args.runs], Path(args.output), x=args.x, metrics=metrics)
    print(json.dumps({"output": str(path)}))
    return 0


def _cmd_reversal(args: argparse.Namespace) -> int:
    from transduce.errors import UserError
    from transduce.experiments import reversal

    refuse_empty_out(args.out, "the experiment's folder")
    if args.minutes <= 0:
        raise UserError(f"--minutes must be positive; got {args.minutes}")
    summary = reversal(
        args.out,
        task=args.task,
        minutes=args.minutes,
        resume=args.resume,
        show_progress=not args.quiet,
    )
    print(json.dumps(summary))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="draw a model's attention on one sentence",
        description="Draw the attention weights of a checkpoint (translation or synthetic task) "
        "on --src (and --tgt; without it the model's greedy output): heat maps per head (grid) "
        "or the paper's appendix style (lines). Outputs .png, .svg, .pdf or .html.",
    )
    p.add_argument("--model", required=True, action=Once, help="checkpoint file or run folder")
    p.add_argument("--src", required=True, help="the source sentence")
    p.add_argument("--tgt", default=None, help="the target sentence (default: greedy output)")
    p.add_argument("--kind", choices=("cross", "encoder", "decoder"), default="cross")
    p.add_argument("--layer", type=int, default=-1, help="0-based; -1 (default) is the last")
    p.add_argument("--head", type=int, default=None, help="0-based head (default: all)")
    p.add_argument("--style", choices=("grid", "lines"), default="grid")
    p.add_argument("--output", required=True, help="FILE.png, .svg, .pdf or .html")
    p.set_defaults(func=_cmd_attention)

    plot = sub.add_parser("plot", help="draw figures of runs")
    plot_sub = plot.add_subparsers(dest="figure", required=True, metavar="FIGURE")
    p = plot_sub.add_parser(
        "curves",
        help="learning curves of one or more runs",
        description="Training and validation curves from each run's metrics.jsonl (a run still "
        "training too), runs overlaid, one panel per metric.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (or metrics.jsonl)")
    p.add_argument("--x", choices=("step", "epoch", "time"), default="step")
    p.add_argument(
        "--metrics", default=None, help="comma-separated, e.g. loss,bleu (default: all present)"
    )
    p.add_argument("--output", required=True, help="FILE.png, .svg or .pdf")
    p.set_defaults(func=_cmd_plot_curves)

    exp = sub.add_parser("experiment", help="train several runs and draw what they show")
    exp_sub = exp.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    p = exp_sub.add_parser(
        "reversal",
        help="does reversing the input help a Transformer? (a few minutes)",
        description="Train a synthetic task as is and with reversed input, same split, seed and "
        "budget; write DIR/reversal.png and DIR/summary.json.",
    )
    p.add_argument("--task", choices=("addition", "copy", "reverse"), default="addition")
    p.add_argument("--minutes", type=float, default=2.5, help="per run (default: 2.5)")
    p.add_argument("--out", default="runs/reversal", help="folder (default: runs/reversal)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the stopped experiment in --out (a finished run kept as it is)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_reversal)

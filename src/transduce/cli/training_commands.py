"""Subcommands about training: demo, train, params, average, convert."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from transduce.cli.common import add_set, check_output, refuse_empty_out, refuse_stdout
from transduce.errors import UserError


def _cmd_demo(args: argparse.Namespace) -> int:
    refuse_empty_out(args.out, "the demo's run folder")
    from transduce.config import parse_overrides
    from transduce.demo import run_demo

    summary = run_demo(
        args.out, parse_overrides(args.overrides), resume=args.resume, show_progress=not args.quiet
    )
    print(json.dumps(summary))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    refuse_empty_out(args.out, "the run folder")
    from transduce.config import load_config, parse_overrides, update

    cfg = update(load_config(args.config), parse_overrides(args.overrides))
    if args.resume:
        from transduce.training.config_change import allowed_keys
        from transduce.training.fit import check_resumable

        allowed_keys(args.allow_change)  # a misspelt key first: it is wrong wherever the run is
        check_resumable(args.out)
    from transduce.training import distributed
    from transduce.training.run import (
        train,  # imports torch: after the config is known good
    )

    summary = train(
        cfg,
        args.out,
        resume=args.resume,
        show_progress=not args.quiet,
        allow_change=args.allow_change,
    )
    # not after an error: a rank that failed would wait for the others here, and they may never
    # come (torchrun ends the job when this process exits instead)
    distributed.shutdown()
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary line, from rank 0
        print(json.dumps(summary))
    return 0


# model keys no parameter count depends on (max_positions too, unless positions are learned)
_NO_PARAMETERS = ("dropout", "attention_dropout", "activation_dropout", "activation")


def _cmd_params(args: argparse.Namespace) -> int:
    from transduce.architectures import parameter_counts
    from transduce.config import (
        check_preset_acts,
        parse_overrides,
        preset_config,
        resolve_key,
        update,
    )
    from transduce.data.vocab import SPECIALS

    if args.vocab_size < len(SPECIALS):  # as a model's config refuses it
        raise UserError(
            f"--vocab-size must be at least {len(SPECIALS)} (the special tokens); got "
            f"{args.vocab_size}"
        )
    overrides = parse_overrides(args.overrides)
    elsewhere = [key for key in overrides if resolve_key(key)[0] != "model"]
    if elsewhere:  # the count is the model section's, for one vocabulary of --vocab-size
        raise UserError(
            f"--set {elsewhere[0]}: params counts the model section's parameters for one "
            "shared vocabulary of --vocab-size; other sections change nothing here"
        )
    cfg = update(preset_config(args.preset), overrides)
    check_preset_acts(args.preset, cfg)
    inert = set(_NO_PARAMETERS)
    if cfg.model.positional != "learned":  # the sinusoids are computed, not parameters
        inert.add("max_positions")
    if named := [key for key in overrides if resolve_key(key)[1] in inert]:
        raise UserError(
            f"--set {named[0]}: the count is the same for every value of "
            f"{resolve_key(named[0])[1]} here (it holds no parameters); leave it out"
        )
    parts = parameter_counts(cfg.model, args.vocab_size)
    print(
        json.dumps(
            {
                "preset": args.preset,
                "vocab_size": args.vocab_size,
                "parameters": parts["total"],
                "breakdown": parts,
            }
        )
    )
    return 0


def _cmd_average(args: argparse.Namespace) -> int:
    from transduce import checkpoint

    refuse_stdout(args.output, "--output", "model file")  # a model file, not text
    check_output(args.output)  # before every checkpoint is read
    _check_model_output(Path(args.output), args.force)
    if Path(args.output).name.startswith("step_") and Path(args.output).parent.name == (
        "checkpoints"
    ):  # a resume would take it for the run's newest checkpoint
        raise UserError(
            f"{args.output}: a step checkpoint's name in a run's checkpoints/; a resume would "
            "read it as the run's state: write the average elsewhere"
        )
    if args.checkpoints:
        if args.last is not None:
            raise UserError("--last goes with --run (--checkpoints names the files to average)")
        paths = [Path(p) for p in args.checkpoints]
        seen = {p.resolve() for p in paths}
        if len(seen) != len(paths):  # a file twice would weigh twice in silence
            raise UserError("--checkpoints names a file more than once; name each once")
    else:
        wanted = 5 if args.last is None else args.last
        paths = checkpoint.last_checkpoints(args.run, wanted)
        if len(paths) < wanted:
            print(
                f"transduce: note: {args.run} holds {len(paths)} step checkpoints, not the "
                f"{wanted} asked for: averaging {len(paths)}",
                file=sys.stderr,
            )
    averaged = checkpoint.average(paths)
    checkpoint.save_model_file(averaged, args.output)  # .safetensors: that format
    print(json.dumps({"output": str(args.output), "averaged": [str(p) for p in paths]}))
    return 0


def _check_model_output(path: Path, force: bool) -> None:
    """A UserError where ``path`` is a file already and ``force`` is not given: a model file
    (a run's model.pt, a checkpoint) replaced without a word is a model lost."""
    if path.is_file() and not force:
        raise UserError(f"{path} exists; --force replaces it")


def _cmd_convert(args: argparse.Namespace) -> int:
    from transduce import checkpoint

    refuse_stdout(args.new, "NEW", "model file")
    old = Path(args.old) / "model.pt" if Path(args.old).is_dir() else Path(args.old)
    in_place = Path(args.new).resolve() == old.resolve()  # asked for by name
    _check_model_output(Path(args.new), args.force or in_place)
    print(json.dumps(checkpoint.convert(args.old, args.new, trust=args.trust)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small Transformer on addition (CPU, minutes)")
    p.add_argument("--out", default="runs/demo", help="run folder (default: runs/demo)")
    p.add_argument(
        "--resume", action="store_true", help="continue the stopped demo in --out (same --set)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_set(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("train", help="train from a YAML or TOML config")
    p.add_argument("--config", required=True, help="YAML or TOML (.toml) file (see configs/)")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run's last checkpoint (refused where --out has none)",
    )
    p.add_argument(
        "--allow-change",
        action="append",
        default=[],
        metavar="KEY",
        help="with --resume: let config key KEY differ from the run's (repeatable; the budget, "
        "stopping rules, *_every keys, device, validation and decoding may change without it)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_set(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("params", help="count a preset's parameters")
    p.add_argument("--preset", default="base", help="base, big or a Table 3 row (A1 .. E)")
    p.add_argument("--vocab-size", type=int, default=37000, help="shared vocabulary size")
    add_set(p, "override a model key (e.g. --set d_model=256 or --set model.n_layers=3)")
    p.set_defaults(func=_cmd_params)

    p = sub.add_parser("average", help="average the last K checkpoints of a run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run folder whose checkpoints/ to average")
    src.add_argument("--checkpoints", nargs="+", help="explicit checkpoint files")
    p.add_argument(
        "--last", type=int, default=None, help="with --run: how many of its last (default 5)"
    )
    p.add_argument("--output", required=True, help="file to write the averaged model to")
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    p.set_defaults(func=_cmd_average)

    p = sub.add_parser(
        "convert",
        help="rewrite a checkpoint of an older transduce in the safe format",
        description="Rewrite OLD (a model file or training checkpoint) as NEW in the safe format "
        "(tensors and plain data only, loaded without running code); NEW ending in .safetensors "
        "gets the model alone as safetensors. A file holding other Python objects (checkpoints "
        "of a transduce before the safe format) is read only with --trust, which unpickles it "
        "the general way and so runs any code it names: use it only for files you trust.",
    )
    p.add_argument("old", help="checkpoint file (or run folder: its model.pt) to read")
    p.add_argument("new", help="file to write (.pt, or .safetensors for the model alone)")
    p.add_argument(
        "--trust",
        action="store_true",
        help="unpickle OLD even though that runs code it names (only for files you trust)",
    )
    p.add_argument("--force", action="store_true", help="replace NEW if it exists")
    p.set_defaults(func=_cmd_convert)

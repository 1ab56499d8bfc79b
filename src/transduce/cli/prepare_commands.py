"""Subcommands for data at scale: prepare, vocab, and data wmt14 (under ``data``)."""

from __future__ import annotations

import argparse
import json
import sys

from transduce.cli.training_commands import add_set
from transduce.config import Config, load_config, parse_overrides, update


def _config(args: argparse.Namespace) -> Config:
    return update(load_config(args.config), parse_overrides(args.overrides))


def _log(message: str) -> None:
    print(f"transduce: {message}", file=sys.stderr, flush=True)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from transduce.data.prepare import prepare

    manifest = prepare(
        _config(args), args.out, workers=args.workers, shard_pairs=args.shard_pairs,
        show_progress=False if args.quiet else None, log=_log,
    )  # fmt: skip
    splits = manifest["splits"]
    print(json.dumps({"out": args.out, "dtype": manifest["dtype"],
                      **{k: {"pairs": v["pairs"], "removed": v["removed"],
                             "shards": len(v["shards"]), "seconds": v["seconds"]}
                         for k, v in splits.items()}}))  # fmt: skip
    return 0


def _cmd_vocab(args: argparse.Namespace) -> int:
    from transduce.data.prepare import write_vocabulary

    paths = write_vocabulary(_config(args), args.out, log=_log)
    print(json.dumps({"vocabulary": [str(p) for p in paths]}))
    return 0


def _cmd_data_wmt14(args: argparse.Namespace) -> int:
    from transduce.data.wmt14 import fetch_wmt14

    record = fetch_wmt14(args.dest, pair=args.pair, from_dir=args.from_dir,
                         progress=not args.quiet)  # fmt: skip
    print(json.dumps({"dest": args.dest, "pair": record["pair"], "lines": record["files"]}))
    return 0


def add_data_command(data_sub: argparse._SubParsersAction) -> None:
    """``transduce data wmt14``."""
    d = data_sub.add_parser(
        "wmt14",
        help="WMT 2014 en-de or en-fr: training corpora, newstest2013 and newstest2014",
        description="Download (resumably) the paper's WMT14 corpora from statmt.org, or copy "
        "them from a local mirror (--from), check the published MD5s, and write train.SRC, "
        "train.TGT, newstest2013.* and newstest2014.* into DEST.",
    )
    d.add_argument("--pair", default="en-de", choices=("en-de", "en-fr"))
    d.add_argument("--dest", required=True, help="folder for the files (e.g. data/wmt14_en_de)")
    d.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="local mirror holding the archives under their public names")  # fmt: skip
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    d.set_defaults(func=_cmd_data_wmt14)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="encode a config's corpus once into a memory-mapped folder for task.prepared",
        description="Read the config's train and valid files, learn the vocabulary on a sample "
        "(or reuse task.vocab_model), clean (task.clean_*) and encode every pair once in worker "
        "processes into --out; train from it with --set prepared=DIR.",
    )
    p.add_argument("--config", required=True, help="YAML or TOML config of a translation task")
    p.add_argument("--out", required=True, help="new (or empty) folder for the prepared data")
    p.add_argument("--workers", type=int, default=0,
                   help="encoding processes (default 0: one per CPU core)")  # fmt: skip
    p.add_argument("--shard-pairs", type=int, default=1_000_000, metavar="N",
                   help="sentence pairs per shard (default 1,000,000)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    add_set(p)
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser(
        "vocab",
        help="learn a config's SentencePiece vocabulary (on a sample) into a folder",
        description="Learn the vocabulary transduce prepare would (vocab.model, or "
        "vocab.src.model and vocab.tgt.model) into --out, for task.vocab_model.",
    )
    p.add_argument("--config", required=True, help="YAML or TOML config of a translation task")
    p.add_argument("--out", required=True, help="folder for the .model file(s)")
    add_set(p)
    p.set_defaults(func=_cmd_vocab)


__all__ = ["add_data_command", "register"]

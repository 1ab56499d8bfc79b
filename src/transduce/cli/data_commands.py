"""Subcommands about data: fetch a corpus (``data multi30k``, ``data ptb-sample``, ``data
wmt14``), and for data at scale, ``prepare`` (encode a corpus once) and ``vocab``."""

from __future__ import annotations

import argparse
import json
import sys

from transduce.cli.common import add_set
from transduce.config import Config, load_config, parse_overrides, resolve_key, update
from transduce.errors import UserError

# what each command reads of a (training) config; a --set of any other key would change nothing
_FILES = ("name", "train_src", "train_tgt", "vocab_size", "vocab_sample", "shared_vocab")
_CLEANING = ("clean_max_len", "clean_ratio", "clean_identical", "clean_dedup")
READS = {
    "prepare": {("train", "seed")}
    | {("task", key) for key in (*_FILES, "valid_src", "valid_tgt", "vocab_model", *_CLEANING)},
    "vocab": {("train", "seed")} | {("task", key) for key in (*_FILES, "vocab_model")},
}


def _config(args: argparse.Namespace, command: str) -> Config:
    overrides = parse_overrides(args.overrides)
    for key in overrides:
        if resolve_key(key) not in READS[command]:
            raise UserError(
                f"--set {key}: {command} reads only the task's files, vocabulary"
                f"{' and cleaning' if command == 'prepare' else ''} keys (and train.seed); "
                "this one changes nothing here"
            )
    return update(load_config(args.config), overrides)


def _log(message: str) -> None:
    print(f"transduce: {message}", file=sys.stderr, flush=True)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from transduce.data.prepare import prepare

    if args.workers < 0:  # (the API's own checks name its arguments)
        raise UserError(f"--workers must be 0 (one per CPU core) or more; got {args.workers}")
    if args.shard_pairs <= 0:
        raise UserError(f"--shard-pairs must be positive; got {args.shard_pairs}")
    manifest = prepare(
        _config(args, "prepare"),
        args.out,
        workers=args.workers,
        shard_pairs=args.shard_pairs,
        show_progress=False if args.quiet else None,
        log=_log,
    )
    splits = manifest["splits"]
    print(
        json.dumps(
            {
                "out": args.out,
                "dtype": manifest["dtype"],
                **{
                    k: {
                        "pairs": v["pairs"],
                        "removed": v["removed"],
                        "shards": len(v["shards"]),
                        "seconds": v["seconds"],
                    }
                    for k, v in splits.items()
                },
            }
        )
    )
    return 0


def _cmd_vocab(args: argparse.Namespace) -> int:
    from transduce.data.prepare import write_vocabulary

    paths = write_vocabulary(_config(args, "vocab"), args.out, log=_log, force=args.force)
    print(json.dumps({"vocabulary": [str(p) for p in paths]}))
    return 0


def _cmd_data_multi30k(args: argparse.Namespace) -> int:
    from transduce.data.multi30k import SPLIT_SIZES, fetch_multi30k

    data = fetch_multi30k(
        args.dest,
        src=args.src,
        tgt=args.tgt,
        from_dir=args.from_dir,
        progress=not args.quiet,
        force=args.force,
    )
    print(
        json.dumps(
            {
                "dest": str(data.root),
                "src": data.src,
                "tgt": data.tgt,
                "splits": {
                    split: {"lines": SPLIT_SIZES[split], **{lang: str(p) for lang, p in f.items()}}
                    for split, f in data.files.items()
                },
            }
        )
    )
    return 0


def _cmd_data_ptb(args: argparse.Namespace) -> int:
    from transduce.data.ptb import prepare_ptb_sample

    counts = prepare_ptb_sample(args.dest, args.from_dir, force=args.force)
    print(json.dumps({"dest": str(args.dest), "sentences": counts}))
    return 0


def _cmd_data_wmt14(args: argparse.Namespace) -> int:
    from transduce.data.wmt14 import fetch_wmt14

    record = fetch_wmt14(args.dest, pair=args.pair, from_dir=args.from_dir, progress=not args.quiet)
    print(json.dumps({"dest": args.dest, "pair": record["pair"], "lines": record["files"]}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """``transduce data CORPUS``."""
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
        "--from",
        dest="from_dir",
        default=None,
        metavar="DIR",
        help="local mirror holding the .gz files (or a multi30k/ folder of them)",
    )
    m.add_argument("--src", default="en", help="source language: en, de, fr or cs (default: en)")
    m.add_argument("--tgt", default="de", help="target language: en, de, fr or cs (default: de)")
    m.add_argument("--force", action="store_true", help="fetch again files already there")
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    m.set_defaults(func=_cmd_data_multi30k)

    d = data_sub.add_parser(
        "ptb-sample",
        help="NLTK's Penn Treebank sample (WSJ 0001-0199) split for parsing",
        description="Put treebank.zip into DEST (downloaded, or copied from --from FOLDER; one "
        "already there that reads is kept unless --force) and write {train,dev,test}.words "
        "and .trees: wsj_0001-0159 train, 0160-0179 dev, 0180-0199 test.",
    )
    d.add_argument("--dest", required=True, help="folder to write (e.g. data/ptb-sample)")
    d.add_argument(
        "--from",
        dest="from_dir",
        default=None,
        metavar="FOLDER",
        help="a folder holding treebank.zip, instead of downloading it",
    )
    d.add_argument(
        "--force", action="store_true", help="fetch again a treebank.zip already in DEST"
    )
    d.set_defaults(func=_cmd_data_ptb)

    d = data_sub.add_parser(
        "wmt14",
        help="WMT 2014 en-de or en-fr: training corpora, newstest2013 and newstest2014",
        description="Download (resumably) the paper's WMT14 corpora from statmt.org, or copy "
        "them from a local mirror (--from), check the published MD5s, and write train.SRC, "
        "train.TGT, newstest2013.* and newstest2014.* into DEST.",
    )
    d.add_argument("--pair", default="en-de", choices=("en-de", "en-fr"))
    d.add_argument("--dest", required=True, help="folder for the files (e.g. data/wmt14_en_de)")
    d.add_argument(
        "--from",
        dest="from_dir",
        default=None,
        metavar="DIR",
        help="local mirror holding the archives under their public names",
    )
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    d.set_defaults(func=_cmd_data_wmt14)


def register_prepare(sub: argparse._SubParsersAction) -> None:
    """``transduce prepare`` and ``transduce vocab``."""
    p = sub.add_parser(
        "prepare",
        help="encode a config's corpus once into a memory-mapped folder for task.prepared",
        description="Read the config's train and valid files, learn the vocabulary on a sample "
        "(or reuse task.vocab_model), clean (task.clean_*) and encode every pair once in worker "
        "processes into --out; train from it with --set prepared=DIR.",
    )
    p.add_argument("--config", required=True, help="YAML or TOML config of a translation task")
    p.add_argument("--out", required=True, help="new (or empty) folder for the prepared data")
    p.add_argument(
        "--workers", type=int, default=0, help="encoding processes (default 0: one per CPU core)"
    )
    p.add_argument(
        "--shard-pairs",
        type=int,
        default=1_000_000,
        metavar="N",
        help="sentence pairs per shard (default 1,000,000)",
    )
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
    p.add_argument("--force", action="store_true", help="replace a vocabulary already in --out")
    add_set(p)
    p.set_defaults(func=_cmd_vocab)


__all__ = ["register", "register_prepare"]

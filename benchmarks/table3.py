"""The paper's Table 3 in miniature: every variant of the base model, scaled down, trained on
Multi30k for the same budget, with parameters, dev perplexity and dev BLEU in a Markdown table.

    python benchmarks/table3.py [--rows base,A1,...] [--steps 800 | --minutes M]
                                [--width 4] [--depth 2] [--out runs/table3] [--set key=value ...]

Each row is a preset of ``transduce.presets`` (the paper's base model changed as in one row of
Table 3) with the same relative changes at a smaller size: d_model, d_ff, d_k and d_v divided by
``--width``, the number of layers by ``--depth`` (at least 1); heads, dropout, label smoothing
and positional encoding exactly as in the row. With the defaults the base row is d_model 128,
3+3 layers, 8 heads of d_k = d_v = 16, d_ff 512 (rows A1-A4 keep h * d_k = d_model, C4/C5 halve
and double d_model, C1-C3 use 1, 2 and 4 layers).

Training follows the recipe of ``--recipe`` (default ``configs/multi30k_en_de.yaml``: data
files, batch size, warm-up, learning-rate factor, cool-down, precision) except for the model
section, which comes from the row; every row trains for ``--steps`` updates (as the paper gave
every row the same 100k steps) or, with ``--minutes``, for that much wall clock. The shared BPE
vocabulary is learned once and reused by every row. Dev figures are on the recipe's validation
split (Multi30k val): perplexity of the reference under the model and sacreBLEU with beam
``--beam`` and length penalty ``--alpha`` (defaults 4 and 0.6, as the paper's Table 3; the
recipe's own decode.alpha is not used). The model is the last state (no
checkpoint averaging), as in the paper's Table 3.

Data: the recipe's files (``data/multi30k/...``: fetch them with ``transduce data multi30k
--dest data/multi30k``), or ``--set train_src=... --set ...``. Writes ``OUT/table3.md`` and
``OUT/table3.json`` and prints the table; every row's run folder stays under ``OUT/<row>``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROWS = (
    "base",
    "A1",
    "A2",
    "A3",
    "A4",
    "B1",
    "B2",
    "C1",
    "C2",
    "C3",
    "C4",
    "C5",
    "C6",
    "C7",
    "D1",
    "D2",
    "D3",
    "D4",
    "E",
)
SCALED = ("d_model", "d_ff", "d_k", "d_v")


def scaled_model(row: str, width: int, depth: int) -> dict[str, Any]:
    """The model section of preset ``row`` with its sizes divided by width / depth."""
    from transduce.config import preset_config

    model = preset_config(row).model
    changes: dict[str, Any] = {k: max(getattr(model, k) // width, 1) for k in SCALED}
    changes["n_layers"] = max(round(model.n_layers / depth), 1)
    for key in ("n_heads", "dropout", "positional", "tie_embeddings", "norm"):
        changes[key] = getattr(model, key)
    return changes


def row_config(row: str, args: argparse.Namespace, recipe: dict[str, Any]):  # noqa: ANN201
    """The Config a row trains with: the recipe, the scaled model of the row, the row's label
    smoothing, the fixed budget, and only the final validation."""
    from transduce.config import from_dict, parse_overrides, preset_config, update

    sections = {k: v for k, v in recipe.items() if k != "model"}
    sections["decode"] = {**sections.get("decode", {}), "alpha": args.alpha}
    train = dict(sections.get("train", {}))
    train.update(
        label_smoothing=preset_config(row).train.label_smoothing,
        max_steps=args.steps if not args.minutes else 10**9,
        max_minutes=args.minutes,
        max_epochs=0,
        eval_every=0,
        patience=0,
        average_last=0,
        keep_last=1,
        save_every=10**9,
        tensorboard=False,
        valid_beam=args.beam,
    )
    cfg = from_dict(
        {**sections, "train": train, "model": scaled_model(row, args.width, args.depth)}
    )
    return update(cfg, parse_overrides(args.set))


def describe(row: str) -> str:
    from transduce.presets import PRESETS

    return ", ".join(f"{k}={v}" for k, v in PRESETS[row].items()) or "(base)"


def run_row(row: str, args: argparse.Namespace, recipe: dict, vocab_file: Path | None) -> dict:
    from transduce import checkpoint
    from transduce.model.transformer import parameter_breakdown
    from transduce.training.run import train_translation

    cfg = row_config(row, args, recipe)
    out = args.out / row
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if vocab_file is not None:
        shutil.copy(vocab_file, out / "vocab.model")  # a resumed run reuses the run's vocabulary
    started = time.monotonic()
    summary = train_translation(
        cfg, out, resume=vocab_file is not None, show_progress=False, log=lambda _: None
    )
    minutes = (time.monotonic() - started) / 60
    model, _, _ = checkpoint.load_model(out / "model.pt")
    m = cfg.model
    return {
        "row": row,
        "changes": describe(row),
        "n_layers": m.n_layers,
        "d_model": m.d_model,
        "d_ff": m.d_ff,
        "n_heads": m.n_heads,
        "d_k": m.d_k,
        "d_v": m.d_v,
        "dropout": m.dropout,
        "label_smoothing": cfg.train.label_smoothing,
        "positional": m.positional,
        "params_m": parameter_breakdown(model)["total"] / 1e6,
        "steps": summary["step"],
        "dev_ppl": summary.get("valid_ppl", math.nan),
        "dev_bleu": summary.get("bleu", math.nan),
        "minutes": minutes,
    }


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    budget = f"{args.minutes:g} minutes" if args.minutes else f"{args.steps} updates"
    lines = [
        f"Table 3 in miniature: widths / {args.width}, depth / {args.depth}, {budget} per row, "
        f"dev = validation split, BLEU with beam {args.beam}, alpha {args.alpha:g}.",
        "",
        "| row | change | N | d_model | d_ff | h | d_k | d_v | P_drop | eps_ls | pos | "
        "params (M) | steps | dev PPL | dev BLEU | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['row']} | {r['changes']} | {r['n_layers']} | {r['d_model']} | {r['d_ff']} | "
            f"{r['n_heads']} | {r['d_k']} | {r['d_v']} | {r['dropout']:g} | "
            f"{r['label_smoothing']:g} | {r['positional']} | {r['params_m']:.2f} | {r['steps']} | "
            f"{r['dev_ppl']:.2f} | {r['dev_bleu']:.1f} | {r['minutes']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated preset names")
    parser.add_argument("--steps", type=int, default=800, help="updates per row")
    parser.add_argument("--minutes", type=float, default=0.0, help="wall clock per row instead")
    parser.add_argument("--width", type=int, default=4, help="divide d_model, d_ff, d_k, d_v")
    parser.add_argument("--depth", type=int, default=2, help="divide the number of layers")
    parser.add_argument("--beam", type=int, default=4, help="beam for dev BLEU (1 = greedy)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty for dev BLEU")
    parser.add_argument("--recipe", type=Path, default=Path("configs/multi30k_en_de.yaml"))
    parser.add_argument("--out", type=Path, default=Path("runs/table3"))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key (any section)",
    )
    args = parser.parse_args(argv)

    import yaml

    from transduce.errors import UserError
    from transduce.kernels.process import enlarge_onednn_cache
    from transduce.presets import PRESETS
    from transduce.runtime import tune_malloc

    tune_malloc()
    enlarge_onednn_cache()  # bfloat16 training on token batches (see transduce.kernels.process)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in PRESETS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(PRESETS)}")
    try:
        recipe = yaml.safe_load(args.recipe.read_text())
        results: list[dict] = []
        vocab_file: Path | None = None
        for row in rows:
            print(f"table3: training {row} ({describe(row)})", file=sys.stderr, flush=True)
            results.append(run_row(row, args, recipe, vocab_file))
            vocab_file = vocab_file or args.out / row / "vocab.model"
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    except (UserError, OSError) as e:
        print(f"table3: error: {e}", file=sys.stderr)
        return 2
    table = markdown(results, args)
    (args.out / "table3.md").write_text(table)
    (args.out / "table3.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

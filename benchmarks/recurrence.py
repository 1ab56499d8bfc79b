"""The paper's comparison at our scale: the Transformer against the recurrent baseline
(``architecture: rnn``), trained for the same wall-clock budget on the same data, vocabulary,
batching, loss, optimizer and search, one after the other so that each has the whole machine.

    python benchmarks/recurrence.py [--task multi30k|addition] [--minutes 30] [--out DIR]
                                    [--only transformer|rnn] [--plot-only]
                                    [--transformer-set KEY=VALUE ...] [--rnn-set KEY=VALUE ...]

multi30k: ``configs/multi30k_en_de.yaml`` for both (data from ``transduce data multi30k`` in
data/multi30k, copied from $TRANSDUCE_DATA/multi30k when set), validation greedy BLEU every
``--eval-every`` updates, then test_2016_flickr scored with beam 4 on each run's model.pt.
addition: ``configs/addition.yaml`` (stops at 99.5% sequence accuracy or the budget). The arms'
settings are ARMS below, each chosen on val (benchmarks/RESULTS.md says what was tried);
``--*-set`` adds overrides (for tuning runs). The budget includes validation, as a user's would.

Writes DIR/<task>/{transformer,rnn}/ (the runs), DIR/<task>/recurrence.png (validation score
against wall-clock minutes and against updates, both models on the same axes, parameters and
the test score in the legend) and DIR/<task>/summary.json; prints a Markdown table (parameters,
training tokens/s, updates, best and last validation score, test score, minutes to a target).
A finished run is not trained again: ``--plot-only`` redraws from the folders.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from transduce.checkpoint import load_model
from transduce.plotting._figure import new_figure, save, style
from transduce.plotting.records import RunMetrics, minutes_map, read_metrics

ROOT = Path(__file__).resolve().parent.parent
DATA = Path("data/multi30k")
TEST = ("test_2016_flickr.en.gz", "test_2016_flickr.de.gz")

# Per task: the config, the validation score, the target for "minutes to", and each arm's
# overrides. Multi30k: the Transformer takes the recipe's choice for ~1,500-2,700 updates
# (dropout 0.1); the LSTM the settings that won its tuning runs (RESULTS).
TASKS: dict[str, dict[str, Any]] = {
    "multi30k": {
        "config": "configs/multi30k_en_de.yaml",
        "score": "bleu",
        "target": 30.0,
        "arms": {
            "transformer": ["dropout=0.1"],
            "rnn": [
                "architecture=rnn",
                "n_layers=2",
                "d_model=256",
                "dropout=0.1",
                "clip_norm=1.0",
                "lr_factor=1.92",
                "input_feeding=false",
                "rnn_attention=additive",
            ],
        },
    },
    "addition": {
        "config": "configs/addition.yaml",
        "score": "seq_accuracy",
        "target": 0.99,
        "arms": {
            "transformer": ["max_steps=1000000"],  # the budget or the target stops them
            "rnn": [
                "architecture=rnn",
                "n_layers=1",
                "d_model=128",
                "clip_norm=1.0",
                "max_steps=1000000",
            ],
        },
    },
}
LABELS = {"transformer": "Transformer", "rnn": "LSTM + attention"}


def transduce(*args: str) -> subprocess.CompletedProcess[str]:
    """``transduce ARGS`` in the repository root; stderr (the progress) passes through."""
    command = [sys.executable, "-m", "transduce", *args]
    print("$ transduce " + " ".join(args), file=sys.stderr, flush=True)
    return subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)


def train(
    task: dict[str, Any], arm: str, extra: list[str], run: Path, args: argparse.Namespace
) -> None:
    """Train one arm unless its run folder already holds a finished model.pt."""
    if (run / "model.pt").exists():
        print(f"{run}: trained already", file=sys.stderr)
        return
    sets = [*task["arms"][arm], *extra, f"max_minutes={args.minutes}"]
    if args.eval_every:
        sets.append(f"eval_every={args.eval_every}")
    merged: dict[str, str] = {}  # a key once, the last setting of it (--set refuses a key twice)
    for kv in sets:
        key, _, value = kv.partition("=")
        merged[key.strip().rsplit(".", 1)[-1]] = f"{key.strip()}={value}"
    options = [o for kv in merged.values() for o in ("--set", kv)]
    transduce("train", "--config", task["config"], "--out", str(run), *options)


def test_score(run: Path) -> float | None:
    """sacreBLEU of the run's model.pt on test_2016_flickr with beam 4 (cached in the run)."""
    cached = run / "test_bleu_beam4.json"
    if not cached.exists():
        src, ref = (str(DATA / name) for name in TEST)
        out = transduce(
            "evaluate",
            "--model",
            str(run / "model.pt"),
            "--src",
            src,
            "--ref",
            ref,
            "--beam",
            "4",
            "--quiet",
        )
        cached.write_text(out.stdout.strip().splitlines()[-1] + "\n")
    return float(json.loads(cached.read_text())["bleu"])


def summarise(run: Path, score: str, target: float, test: float | None) -> dict[str, Any]:
    """The table's row of one run, from its metrics.jsonl and model.pt."""
    metrics = read_metrics(run)
    model, _, _ = load_model(run / "model.pt")
    speeds = [v for r in metrics.train if (v := r.scalar("tokens_per_s")) is not None]
    valid = [(r.step, v) for r in metrics.valid if (v := r.scalar(score)) is not None]
    to_minutes = minutes_map(metrics.train)
    reached = [step for step, v in valid if v >= target]
    minutes = float(to_minutes(reached[0])) if reached and to_minutes else None
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "updates": max((r.step for r in [*metrics.train, *metrics.valid]), default=0),
        "minutes": float(to_minutes(metrics.train[-1].step)) if to_minutes else None,
        "valid_seconds": sum(r.scalar("valid_seconds") or 0.0 for r in metrics.valid),
        f"best_valid_{score}": max((v for _, v in valid), default=None),
        f"last_valid_{score}": valid[-1][1] if valid else None,
        "test_bleu_beam4": test,
        f"minutes_to_{score}_{target:g}": minutes,
    }


def draw(
    runs: dict[str, RunMetrics], rows: dict[str, dict[str, Any]], task: dict[str, Any], output: Path
) -> None:
    """Validation score against wall-clock minutes and against updates, one line per model, the
    target dotted."""
    score = task["score"]
    with style():
        fig = new_figure(11, 4.2)
        by_time, by_step = fig.subplots(1, 2, sharey=True)
        for arm, metrics in runs.items():
            row = rows[arm]
            label = f"{LABELS[arm]}, {row['parameters'] / 1e6:.1f}M parameters"
            if row["test_bleu_beam4"] is not None:
                label += f", test BLEU {row['test_bleu_beam4']:.1f} (beam 4)"
            steps = [r.step for r in metrics.valid if r.scalar(score) is not None]
            values = [r.scalar(score) for r in metrics.valid if r.scalar(score) is not None]
            to_minutes = minutes_map(metrics.train)
            minutes = to_minutes(steps) if to_minutes else steps
            by_time.plot(minutes, values, marker="o", label=label)
            by_step.plot(steps, values, marker="o", label=label)
        name = "validation BLEU (greedy)" if score == "bleu" else "validation sequence accuracy"
        by_time.set(xlabel="wall-clock minutes (validation included)", ylabel=name, xlim=(0, None))
        by_step.set(xlabel="updates", xlim=(0, None))
        for ax in (by_time, by_step):
            ax.axhline(task["target"], linestyle=":", color="grey", linewidth=1)
        by_time.legend(loc="lower right", fontsize=8)
        save(fig, output)


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The rows as a Markdown table, columns in the rows' key order."""
    keys = list(next(iter(rows.values())))
    lines = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for arm, row in rows.items():
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append(f"| {LABELS[arm]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="multi30k")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--eval-every", type=int, default=250, help="0: the config's")
    parser.add_argument("--out", type=Path, default=Path("runs/recurrence"))
    parser.add_argument("--only", choices=sorted(LABELS), help="train only this arm")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--transformer-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rnn-set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    task = TASKS[args.task]
    out = (args.out if args.out.is_absolute() else Path.cwd() / args.out) / args.task
    if args.task == "multi30k" and not args.plot_only:
        mirror = os.environ.get("TRANSDUCE_DATA")
        transduce(
            "data",
            "multi30k",
            "--dest",
            str(DATA),
            "--src",
            "en",
            "--tgt",
            "de",
            "--quiet",
            *(["--from", mirror] if mirror else []),
        )
    arms = [args.only] if args.only else list(LABELS)
    extra = {"transformer": args.transformer_set, "rnn": args.rnn_set}
    if not args.plot_only:
        for arm in arms:
            train(task, arm, extra[arm], out / arm, args)
    done = [arm for arm in LABELS if (out / arm / "model.pt").exists()]
    rows, runs = {}, {}
    for arm in done:
        test = test_score(out / arm) if args.task == "multi30k" else None
        rows[arm] = summarise(out / arm, task["score"], task["target"], test)
        runs[arm] = read_metrics(out / arm)
    if not rows:
        sys.exit(f"no finished run under {out}")
    draw(runs, rows, task, out / "recurrence.png")
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))
    print(f"figure: {out / 'recurrence.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Data at WMT scale: a synthetic parallel corpus, ``transduce prepare`` on it, and what training
from the prepared folder costs before and between updates.

    python benchmarks/prepare_scale.py generate --pairs 1000000 --out /tmp/corpus_1m
    python benchmarks/prepare_scale.py prepare --corpus /tmp/corpus_1m --out /tmp/prep_1m \\
        --workers 2 [--vocab /tmp/prep_1m_vocab]
    python benchmarks/prepare_scale.py load --prepared /tmp/prep_1m --device cuda
    python benchmarks/prepare_scale.py load --prepared /tmp/prep_1m --simulate-ms 300

``generate`` writes ``train.src``, ``train.tgt``, ``valid.*`` (3,000 pairs) and ``config.yaml``
(the base model, vocabulary 32,000 learned on 1,000,000 sampled lines, max_tokens 25,000,
the cleaning of fairseq's WMT14 recipe: at most 250 pieces a side, ratio 1.5; dedup): a
Zipfian vocabulary of 60,000 made-up words, sentence lengths log-normal around WMT14 En-De's
(median about 21 words, a long tail to 150; 1% of the lines empty or repeated so that cleaning
has work), the target the source's words mapped to other words, dropped or doubled at random
(a length ratio that varies as real ones do). About 140 bytes a side per pair.

``prepare`` times ``transduce.data.prepare.prepare`` and prints pairs per second overall and per
encoding worker (the vocabulary's learning is timed apart: fairseq-preprocess's figure, the
anchor, excludes BPE learning too).

``load`` measures, in one process, the time from start to the first batch (opening the folder,
the max_len filter, the epoch's batches from the length index) and then, over ``--steps``
batches of ``max_tokens`` a block, the time the loop waits for each batch, read and collated on
the training thread or read ahead on a background thread as the trainer does, against a training
step of the base model on ``--device`` (or ``--simulate-ms``: a wait that holds no GIL, as a
GPU step looks to the host): data loading's share of a step.

For peak resident memory run the commands under ``/usr/bin/time -v`` (benchmarks/RESULTS.md):
``transduce prepare --config CORPUS/config.yaml --out DIR`` and ``transduce train --config
CORPUS/config.yaml --set prepared=DIR --set max_steps=2 ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

SYLLABLES = [c + v for c in "bdfgklmnprstvwz" for v in "aeiou"] + ["an", "er", "in", "st", "ch"]


def _words(n: int, rng: np.random.Generator) -> list[str]:
    lengths = rng.integers(1, 5, size=n)
    picks = rng.integers(0, len(SYLLABLES), size=int(lengths.sum()))
    out, at = [], 0
    for k in lengths.tolist():
        out.append("".join(SYLLABLES[i] for i in picks[at : at + k].tolist()))
        at += k
    return out


def generate(pairs: int, out: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    src_words, tgt_words = np.array(_words(60000, rng)), np.array(_words(60000, rng))
    ranks = np.arange(1, 60001)
    probs = 1.0 / ranks**1.05
    probs /= probs.sum()
    out.mkdir(parents=True, exist_ok=True)

    def pair_lines(n: int) -> tuple[list[str], list[str]]:
        lengths = np.clip(np.round(rng.lognormal(math.log(21), 0.55, size=n)), 1, 150).astype(int)
        ids = rng.choice(60000, size=int(lengths.sum()), p=probs)
        keep = rng.random(len(ids)) > 0.08  # the target drops some words, doubles others
        double = rng.random(len(ids)) < 0.1
        src, tgt, at = [], [], 0
        for k in lengths.tolist():
            w = ids[at : at + k]
            src.append(" ".join(src_words[w].tolist()))
            t = w[keep[at : at + k]]
            t = np.concatenate([t, w[double[at : at + k]]])
            tgt.append(" ".join(tgt_words[t].tolist()).capitalize())
            at += k
        for i in np.flatnonzero(rng.random(n) < 0.005).tolist():  # empty or repeated lines
            src[i] = "" if i % 2 else src[i - 1]
            tgt[i] = tgt[i] if i % 2 else tgt[i - 1]
        return src, tgt

    with open(out / "train.src", "w") as fs, open(out / "train.tgt", "w") as ft:
        for start in range(0, pairs, 100_000):
            src, tgt = pair_lines(min(100_000, pairs - start))
            fs.write("\n".join(src) + "\n")
            ft.write("\n".join(tgt) + "\n")
    src, tgt = pair_lines(3000)
    (out / "valid.src").write_text("\n".join(src) + "\n")
    (out / "valid.tgt").write_text("\n".join(tgt) + "\n")
    (out / "config.yaml").write_text(
        "preset: base\n"
        "train: {max_tokens: 25000, max_steps: 2, eval_every: 0, save_every: 1000, "
        "tensorboard: false, device: cpu}\n"
        f"task: {{name: translation, train_src: {out / 'train.src'}, train_tgt: "
        f"{out / 'train.tgt'}, valid_src: {out / 'valid.src'}, valid_tgt: {out / 'valid.tgt'}, "
        "vocab_size: 32000, vocab_sample: 1000000, clean_max_len: 250, clean_ratio: 1.5, "
        "clean_dedup: true, "
        "max_valid_sentences: 100}\n"
    )


def bench_prepare(corpus: Path, out: Path, workers: int, vocab: Path | None) -> dict[str, float]:
    """Learn the vocabulary into OUT_vocab (or reuse ``vocab``, a folder ``transduce vocab``
    wrote), then prepare the corpus into ``out``; the two timed apart."""
    from transduce.config import load_config, update
    from transduce.data.prepare import prepare, write_vocabulary

    cfg = load_config(corpus / "config.yaml")
    started = time.monotonic()
    if vocab is None:
        vocab = out.with_name(out.name + "_vocab")
        write_vocabulary(cfg, vocab, log=lambda _: None, force=True)  # its own scratch folder
    vocab_s = time.monotonic() - started
    # reused: the sample it was learned on no longer applies (refused beside vocab_model)
    cfg = update(cfg, {"vocab_model": str(vocab), "vocab_sample": 0})
    started = time.monotonic()
    manifest = prepare(cfg, out, workers=workers, show_progress=False, log=print)
    total_s = time.monotonic() - started
    lines = manifest["splits"]["train"]["lines"]
    encode_s = manifest["splits"]["train"]["seconds"]
    return {
        "pairs": lines,
        "vocab_seconds": round(vocab_s, 1),
        "prepare_seconds": round(total_s, 1),
        "encode_seconds": encode_s,
        "pairs_per_s": round(lines / encode_s),
        "workers": workers,
        "pairs_per_s_per_worker": round(lines / encode_s / workers),
    }


def bench_load(
    prepared: Path, device: str, steps: int, max_tokens: int, simulate_ms: float | None
) -> dict[str, float]:
    """Start to first batch, then the data wait per step, read on the training thread and read
    ahead on a background thread as the trainer does (``data/read_ahead.py``), the two
    alternating in blocks of ``steps`` over the same batches. The step is the base model's on
    ``device`` or, with ``simulate_ms``, a wait that holds no GIL (a GPU step as the host sees
    it)."""
    import torch

    from transduce.architectures import build_model
    from transduce.config import preset_config
    from transduce.data.batching import (
        Batch,
        group_reader,
        length_index,
        select_pairs,
        token_batch_arrays,
    )
    from transduce.data.prepared import PreparedSplit
    from transduce.data.read_ahead import ReadAhead
    from transduce.data.vocab import PAD
    from transduce.training.loss import label_smoothed_nll

    started = time.monotonic()
    split = PreparedSplit(prepared, "train")
    lengths = length_index(split)
    kept = np.flatnonzero(lengths.max(axis=1) <= 256)
    pairs = select_pairs(split, kept)
    batches = token_batch_arrays(lengths[kept], max_tokens, seed=1, epoch=0)
    first_batch_s = time.monotonic() - started
    read = group_reader(pairs, batches, 1, pin=device.startswith("cuda"))
    cfg = preset_config("base")
    model = build_model(cfg.model, src_vocab_size=max(split.manifest["vocab"]["sizes"])).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(batch: Batch) -> None:
        if simulate_ms is not None:
            time.sleep(simulate_ms / 1000)
            return
        batch = batch.to(device)
        sums = label_smoothed_nll(
            model(batch.src, batch.tgt_in), batch.tgt_out, epsilon=0.1, ignore_index=PAD
        )
        (sums.loss / batch.n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    steps = min(steps, (len(batches) - 1) // 4 - 1)  # a warm-up batch, 4 blocks of steps + 1
    if steps < 1:
        raise SystemExit(f"{prepared}: {len(batches)} batches of {max_tokens} tokens; 9 needed")
    step(read(0)[0])  # warm-up
    waits = {"on_thread": 0.0, "read_ahead": 0.0}
    total = {"on_thread": 0.0, "read_ahead": 0.0}
    with ReadAhead(read) as reader:  # one thread for the run, as in the trainer
        for block in range(4):  # alternating; each block reads batches it has not read before
            way = ("on_thread", "read_ahead")[block % 2]
            keys = list(range(1 + block * (steps + 1), 1 + (block + 1) * (steps + 1)))
            # the block's first batch is read on the thread either way (nothing is ahead yet)
            group = reader.get(keys[0], keys[1] if way == "read_ahead" else None)
            step(group[0])
            for k, ahead in zip(keys[1:], [*keys[2:], None], strict=True):
                t0 = time.monotonic()
                group = reader.get(k, ahead if way == "read_ahead" else None)
                waited = time.monotonic() - t0
                step(group[0])
                waits[way] += waited
                total[way] += time.monotonic() - t0
    n = 2 * steps
    return {
        "pairs": len(split),
        "batches": len(batches),
        "start_to_first_batch_s": round(first_batch_s, 2),
        "device": device,
        "step": f"sleep {simulate_ms} ms" if simulate_ms is not None else "base model",
        **{f"data_ms_per_step_{w}": round(1000 * waits[w] / n, 2) for w in waits},
        **{f"ms_per_step_with_wait_{w}": round(1000 * total[w] / n, 1) for w in total},
        **{f"data_share_{w}": round(waits[w] / total[w], 4) for w in waits},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--pairs", type=int, default=1_000_000)
    g.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--vocab", type=Path, help="reuse this vocabulary folder (default: learn one)")
    m = sub.add_parser("load")
    m.add_argument("--prepared", type=Path, required=True)
    m.add_argument("--device", default="cpu")
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--max-tokens", type=int, default=25000)
    m.add_argument("--simulate-ms", type=float, help="a GIL-free wait instead of a model step")
    args = parser.parse_args()
    if args.what == "generate":
        generate(args.pairs, args.out)
        print(json.dumps({"out": str(args.out), "pairs": args.pairs}))
    elif args.what == "prepare":
        print(json.dumps(bench_prepare(args.corpus, args.out, args.workers, args.vocab)))
    else:
        print(
            json.dumps(
                bench_load(
                    args.prepared, args.device, args.steps, args.max_tokens, args.simulate_ms
                )
            )
        )


if __name__ == "__main__":
    main()

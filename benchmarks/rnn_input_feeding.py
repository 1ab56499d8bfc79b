"""What Luong's input feeding costs the recurrent baseline in training: forward + backward time
per batch with and without it, at a Multi30k-like shape.

    python benchmarks/rnn_input_feeding.py [--threads 2] [--rounds 10] [--layers 1 2]
                                           [--attention general] [--device cpu]

Batch 64 sentence pairs, source and target lengths drawn uniformly from 10-20 (mean 15, right
padded), embed 256, hidden 256, a shared vocabulary of 8000 tied to the output, dropout 0.1,
float32. A step is forward (teacher forcing), cross-entropy, backward and zero_grad: no optimizer
step, which input feeding does not change. Without input feeding the decoder LSTM runs fused over
the T positions and attention is one batched product; with it, one LSTM call and one attention
per position (h~_{t-1} is an input at t). The two models (same seed, so the same weights apart
from the decoder LSTM's extra input columns) run interleaved in one process, alternating which
goes first each round, so load from other processes on a shared machine hits both alike; the
ratio is the median of per-round ratios (its spread printed), and "best" the ratio of the two
fastest steps. Times are medians. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.data.vocab import BOS, PAD
from transduce.recurrent import AttentionKind, RecurrentSeq2Seq, parameter_count

BATCH, MIN_LEN, MAX_LEN, EMBED, HIDDEN, VOCAB = 64, 10, 20, 256, 256, 8000


def make_batch(gen: torch.Generator, device: str) -> tuple[Tensor, Tensor, Tensor]:
    """src (B, S), tgt (B, T) shifted right and gold (B, T), right padded."""

    def padded(lengths: Tensor) -> Tensor:
        x = torch.randint(4, VOCAB, (BATCH, int(lengths.max())), generator=gen)
        return x.masked_fill(torch.arange(x.size(1)) >= lengths[:, None], PAD)

    src = padded(torch.randint(MIN_LEN, MAX_LEN + 1, (BATCH,), generator=gen))
    gold = padded(torch.randint(MIN_LEN, MAX_LEN + 1, (BATCH,), generator=gen))
    tgt = torch.cat([torch.full((BATCH, 1), BOS), gold[:, :-1]], dim=1)  # (B, T) shifted right
    return src.to(device), tgt.to(device), gold.to(device)


def step_seconds(
    model: RecurrentSeq2Seq, batch: tuple[Tensor, Tensor, Tensor], device: str
) -> float:
    """One forward + loss + backward + zero_grad on batch = (src, tgt, gold), in seconds."""
    src, tgt, gold = batch
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    logits = model(src, tgt)  # (B, T, V)
    F.cross_entropy(logits.flatten(0, 1), gold.flatten(), ignore_index=PAD).backward()
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def build(layers: int, feeding: bool, attention: AttentionKind, device: str) -> RecurrentSeq2Seq:
    """The benchmark's model in training mode (dropout on), seeded alike for both settings."""
    torch.manual_seed(0)
    model = RecurrentSeq2Seq(
        vocab_size=VOCAB,
        embed_dim=EMBED,
        hidden_size=HIDDEN,
        n_layers=layers,
        dropout=0.1,
        attention=attention,
        input_feeding=feeding,
        tie_embeddings=True,
    )
    return model.to(device).train()


def compare(layers: int, args: argparse.Namespace) -> dict:
    """Time both settings on the same batches, interleaved; medians and per-round ratios."""
    models = {f: build(layers, f, args.attention, args.device) for f in (False, True)}
    gen = torch.Generator().manual_seed(1)
    batches = [make_batch(gen, args.device) for _ in range(args.rounds)]
    for f in (False, True):  # warm-up: allocator, oneDNN / cuDNN plans
        for _ in range(2):
            step_seconds(models[f], batches[0], args.device)
    times: dict[bool, list[float]] = {False: [], True: []}
    for r, batch in enumerate(batches):
        for f in (False, True) if r % 2 == 0 else (True, False):  # alternate who goes first
            times[f].append(step_seconds(models[f], batch, args.device))
    ratios = [a / b for a, b in zip(times[True], times[False], strict=True)]
    return {
        "layers": layers,
        "params_no_feed": parameter_count(models[False]),
        "params_feed": parameter_count(models[True]),
        "ms_no_feed": 1e3 * statistics.median(times[False]),
        "ms_feed": 1e3 * statistics.median(times[True]),
        "ratio_feed_over_no_feed": statistics.median(ratios),
        # the fastest step of each: least disturbed by other processes
        "ratio_of_best": min(times[True]) / min(times[False]),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--attention", choices=["general", "additive"], default="general")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict = {
        "threads": args.threads,
        "device": args.device,
        "attention": args.attention,
        "batch": BATCH,
        "lengths": [MIN_LEN, MAX_LEN],
        "rounds": args.rounds,
        "runs": [],
    }
    print(
        f"{'layers':>6} {'no feed ms':>11} {'feed ms':>9} {'ratio':>6} {'(min-max)':>12} {'best':>5}"
    )
    for layers in args.layers:
        r = compare(layers, args)
        result["runs"].append(r)
        spread = f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        print(
            f"{layers:>6} {r['ms_no_feed']:>11.1f} {r['ms_feed']:>9.1f} "
            f"{r['ratio_feed_over_no_feed']:>6.2f} {spread:>12} {r['ratio_of_best']:>5.2f}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

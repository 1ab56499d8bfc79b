"""Where one sentence's decoding time goes: a fixed cost and a cost per step, ours against
CTranslate2, and how much of our step is its matrix products.

    python benchmarks/step_cost.py [--size small|base] [--threads 2] [--repeats 5]

Needs ``pip install -e '.[bench]'`` (ctranslate2). The model is benchmarks/decode.py's (random
weights, seeded), exported to CTranslate2 as there. One source sentence of 20 tokens is decoded
greedily with exactly L output tokens (EOS suppressed before, as in decode.py), L = 2, 30 and 60:

    fixed      the time at L = 2 (encoder, first step, setup)
    per step   (time at 60 - time at 30) / 30: a step's cost at 30-60 cached positions

for ``transduce`` (``greedy_search`` on the ``DecodingModel``, what ``Translator`` runs; where the
native kernels are built, its step is one native call, inference/engine/native_row.py) and for
``ct2`` (``translate_batch``, in a process of its own, each figure the faster of its MKL and oneDNN
backends, as decode.py). For ours also ``products``: the step's matrix products alone (every
decoder projection and the pre-softmax one, on the engine's own layout, one row each), timed in
a loop of steps (PyTorch's one-row products, which the native step replaces by its own), and
``rest`` = per step - products. Each time is the best of ``--repeats``
rounds of 10 searches.

Prints a table and one JSON line: per system ``fixed_ms`` and ``step_us``; ours ``products_us``
and ``rest_us``; ``step_vs_ct2`` (ours over theirs: > 1 means our step is slower) and
``products_vs_ct2_step`` (our products alone over CTranslate2's whole step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (benchmarks/decode.py: the model sizes, EOS suppression, CT2's process)

LENGTHS = (2, 30, 60)
ROUND = 10  # searches a timed round


def best_round(fn: Any, repeats: int) -> float:
    """The fastest of ``repeats`` rounds of ``ROUND`` calls of ``fn``, after one round of
    warm-up: seconds a call."""
    for _ in range(ROUND):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(ROUND):
            fn()
        best = min(best, (time.perf_counter() - start) / ROUND)
    return best


def split(times: dict[int, float]) -> dict[str, float]:
    """Seconds at each length -> the fixed cost (ms, L = 2) and the cost a step (us)."""
    return {
        "fixed_ms": 1e3 * times[LENGTHS[0]],
        "step_us": 1e6 * (times[LENGTHS[2]] - times[LENGTHS[1]]) / (LENGTHS[2] - LENGTHS[1]),
    }


def ct2_worker(spec_path: str) -> None:
    """Time CTranslate2 on the job in ``spec_path``; print one JSON line of seconds by length."""
    import ctranslate2

    job = json.loads(Path(spec_path).read_text())
    translator = ctranslate2.Translator(
        job["model_dir"], device="cpu", intra_threads=job["threads"], inter_threads=1
    )
    out = {}
    for length in LENGTHS:
        options = {
            "min_decoding_length": length,
            "max_decoding_length": length,
            "suppress_sequences": [["<pad>"], ["<s>"]],
        }
        out[str(length)] = best_round(
            lambda o=options: translator.translate_batch([job["source"]], beam_size=1, **o),
            job["repeats"],
        )
    print(json.dumps(out))


def run_ct2(model_dir: str, source: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """CTranslate2's seconds by length, each the faster of its two backends."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(
            {
                "model_dir": model_dir,
                "threads": args.threads,
                "source": source,
                "repeats": args.repeats,
            },
            f,
        )
    try:
        threads = {"OMP_NUM_THREADS": str(args.threads)}
        runs = {}
        for name, env in decode.CT2_BACKENDS.items():
            for isa in decode.cpu_isas():  # the fastest ISA that runs here
                r = decode.ct2_process(
                    f.name, {**threads, **env, "CT2_FORCE_CPU_ISA": isa}, args.timeout, __file__
                )
                if r is not None:
                    runs[name] = {int(k): v for k, v in r.items()}
                    break
        if not runs:
            raise RuntimeError("CTranslate2 failed with every ISA")
        return {length: min(r[length] for r in runs.values()) for length in LENGTHS}
    finally:
        os.unlink(f.name)


def products_per_step(engine: Any, repeats: int) -> float:
    """Seconds of one step's matrix products alone: each decoder layer's projections (W^Q W^K
    W^V stacked, W^O, the FFN's two) and the pre-softmax one, one row each, in a step's order.
    The fold's products (the sentence's A and M) are left out: they are small."""
    import torch

    x = torch.randn(1, engine.model.config.d_model)
    hidden = torch.randn(1, engine.model.config.d_ff)

    def step() -> None:
        for w in engine.layers:
            w.qkv(x)
            w.self_out(x)
            w.ffn_in(x)
            w.ffn_out(hidden)
        engine.generator(x)

    steps = 30
    return best_round(lambda: [step() for _ in range(steps)], repeats) / steps


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """Run the benchmark; returns the summary it printed as the last JSON line (None in a
    CTranslate2 worker)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(decode.SIZES), default="small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (the best is kept)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for a ct2 process")
    parser.add_argument("--ct2-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ct2_worker:
        ct2_worker(args.ct2_worker)
        return None

    import torch

    from transduce.data.vocab import EOS, SPECIALS
    from transduce.export.ctranslate2 import export_model
    from transduce.inference import greedy_search
    from transduce.inference.engine import DecodingModel

    size = decode.SIZES[args.size]
    ours = decode.build_ours(size)
    g = torch.Generator().manual_seed(1)
    body = torch.randint(4, size["vocab"], (1, decode.SRC_LEN - 1), generator=g)
    src = torch.cat([body, torch.full((1, 1), EOS)], 1)  # (1, 20)
    tokens = [*SPECIALS, *(f"t{i}" for i in range(4, size["vocab"]))]
    torch.set_num_threads(args.threads)
    engine = DecodingModel(ours)

    def ours_at(length: int) -> float:
        steps = decode.SuppressEarlyEOS(engine, length - 1)
        return best_round(lambda: greedy_search(steps, src, max_len=length - 1), args.repeats)

    print(f"[{args.size}] timing transduce ...", file=sys.stderr, flush=True)
    transduce = split({length: ours_at(length) for length in LENGTHS})
    # PyTorch's one-row products, on their own layout (the native step keeps none)
    torch_products = DecodingModel(ours, native_row_step=False)
    transduce["products_us"] = 1e6 * products_per_step(torch_products, args.repeats)
    transduce["rest_us"] = transduce["step_us"] - transduce["products_us"]
    print(f"[{args.size}] exporting and timing ct2 ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        export_model(ours, tokens, Path(tmp) / "ct2", max_positions=1024)
        source = [tokens[i] for i in body[0].tolist()]
        ct2 = split(run_ct2(str(Path(tmp) / "ct2"), source, args))

    print(
        f"\n{args.size.upper()}, one sentence of {decode.SRC_LEN} tokens, greedy, "
        f"{args.threads} threads"
    )
    print(f"{'system':10} {'fixed ms':>9} {'step us':>8} {'products us':>12} {'rest us':>8}")
    print(
        f"{'transduce':10} {transduce['fixed_ms']:9.2f} {transduce['step_us']:8.1f} "
        f"{transduce['products_us']:12.1f} {transduce['rest_us']:8.1f}"
    )
    print(f"{'ct2':10} {ct2['fixed_ms']:9.2f} {ct2['step_us']:8.1f}")
    summary = {
        "benchmark": "step_cost",
        "size": args.size,
        "threads": args.threads,
        "step_vs_ct2": round(transduce["step_us"] / ct2["step_us"], 3),
        "products_vs_ct2_step": round(transduce["products_us"] / ct2["step_us"], 3),
        "fixed_vs_ct2": round(transduce["fixed_ms"] / ct2["fixed_ms"], 3),
        "systems": {
            "transduce": {k: round(v, 2) for k, v in transduce.items()},
            "ct2": {k: round(v, 2) for k, v in ct2.items()},
        },
        "torch": torch.__version__,
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

"""A trained model translating a file through the Python API on a GPU: the engine's steps
replayed as CUDA graphs (``Translator.load(..., graphs=True)``; the default ``graphs=None``
takes them on CUDA) against the engine run step by step (``graphs=False``), on the same
sentences, batches and settings.

    python benchmarks/translate_gpu.py --model runs/multi30k_gpu/model.pt \\
        --src data/multi30k/test_2016_flickr.en.gz --ref data/multi30k/test_2016_flickr.de.gz \\
        [--device cuda] [--beam 4] [--rounds 2] [--precision fp32|bf16|fp16] [--max-slots N]

The two Translators share one model. Before any round the engine translates the file once: the
process's first decoding of its batches (the CUDA context, libraries' handles, the allocator's
growth, kernels chosen and loaded) is then paid by neither. Each round translates the whole file
with one and then the other, each going first in turn. The first round of the graphs includes
their own set-up and a capture for each shape of batch (``cold``); later rounds are ``warm``,
but they capture again any shape whose slot was let go (``MAX_SLOTS`` shapes kept: a file of
more shapes than that captures them all again each round). Reported: seconds and sentences per
second of each, the graphs' captures in each round and the host's seconds in them (a lower
bound: the warm-up steps run on the device after the host has gone on), the ratios (engine time
over graphs' time: > 1 means the graphs are faster), how many of the outputs are the same, and
the BLEU of each (sacreBLEU). One JSON line at the end. With ``--device cpu`` the "graphs"
Translator runs the engine too (a dry run of the plumbing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument(
        "--max-slots",
        type=int,
        help="shapes of batch whose graphs the decoder keeps (default: static.MAX_SLOTS)",
    )
    args = parser.parse_args(argv)

    import sacrebleu
    import torch

    from transduce import kernels
    from transduce.data.parallel import read_lines
    from transduce.device import resolve_device
    from transduce.inference.engine import static
    from transduce.inference.engine.static import StaticDecoder
    from transduce.inference.search import searchable
    from transduce.inference.translator import Translator

    if args.max_slots is not None:
        static.MAX_SLOTS = args.max_slots  # read by each claim of a slot
    on_graphs = kernels.graphs_capture(resolve_device(args.device))
    graphs = Translator.load(args.model, args.device, args.precision, graphs=on_graphs)
    engine = Translator(graphs.model, graphs.vocab, graphs.cfg, searchable(graphs.model))
    src, ref = read_lines(args.src), read_lines(args.ref)
    cfg = graphs.decode_config(beam=args.beam)
    device = graphs.device

    def run(translator: Translator) -> tuple[float, list[str]]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = translator.translate(src, decode=cfg, show_progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, out

    # the process's first decoding of these batches (CUDA context, libraries' handles, the
    # allocator's growth, kernels chosen and loaded) paid by neither: one pass of the engine
    # (the graphs' own set-up and captures stay in their first round)
    engine.translate(src, decode=cfg, show_progress=False)
    stream = getattr(graphs.decoding, "capture", None)  # a StaticDecoder's CaptureStream
    times: dict[str, list[float]] = {"graphs": [], "engine": []}
    captures: list[int] = []  # the graphs' captures in each round
    capture_seconds: list[float] = []  # the host's seconds in them
    outputs: dict[str, list[str]] = {}
    pair = [("graphs", graphs), ("engine", engine)]
    for r in range(args.rounds):
        for name, translator in pair if r % 2 == 0 else pair[::-1]:  # each goes first in turn
            before = (0, 0.0) if stream is None else (stream.captures, stream.seconds)
            seconds, outputs[name] = run(translator)
            times[name].append(seconds)
            if name == "graphs" and stream is not None:
                captures.append(stream.captures - before[0])
                capture_seconds.append(round(stream.seconds - before[1], 3))
            print(f"round {r + 1}: {name} {seconds:.2f} s", file=sys.stderr, flush=True)
    same = sum(a == b for a, b in zip(outputs["graphs"], outputs["engine"], strict=True))
    warm = {k: min(v[1:]) if len(v) > 1 else v[0] for k, v in times.items()}
    out = {
        "benchmark": "translate_gpu",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "graphs_used": isinstance(graphs.decoding, StaticDecoder),
        "precision": args.precision,
        "beam": args.beam,
        "sentences": len(src),
        "seconds": times,
        "graphs_vs_engine_cold": round(times["engine"][0] / times["graphs"][0], 3),
        "graphs_vs_engine_warm": round(warm["engine"] / warm["graphs"], 3),
        "sentences_per_s_warm": {k: round(len(src) / v, 1) for k, v in warm.items()},
        "same_outputs": same,
        "max_slots": static.MAX_SLOTS,
        "captures_per_round": None if stream is None else captures,
        "capture_seconds_per_round": None if stream is None else capture_seconds,
        "bleu": {k: round(sacrebleu.corpus_bleu(v, [ref]).score, 2) for k, v in outputs.items()},
        "torch": torch.__version__,
        "model": str(args.model),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

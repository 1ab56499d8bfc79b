"""Decoding on a GPU: transduce's engine against Hugging Face ``generate`` on the same device and
dtype, both from one ``MarianMTModel`` folder (decode_marian.py's OPUS-MT-sized model, random
seeded weights, nothing from a hub).

    python benchmarks/decode_gpu.py [--device cuda] [--dtype bf16|fp16|fp32] [--batches 32 128]
                                    [--repeats 3] [--quick] [--profile FILE]

Needs ``pip install -e '.[bench]'`` (transformers, sentencepiece). On a machine without a GPU
``--device cpu`` runs the same code (a dry run; use decode_marian.py for CPU figures).

    transduce  ``import_marian`` of the folder, its weights in ``--dtype`` on ``--device``, then
               ``greedy_search`` / ``beam_search`` (alpha 0.6) on a ``DecodingModel`` of it
    transduce_static  the same engine through ``StaticDecoder``: every step after the first on
               static buffers, captured once as a CUDA graph and replayed (on a CPU the same
               static steps run eagerly)
    transduce_static_plain  the same, each beam step's candidates from ``log_softmax`` and a
               top-k over the (N, V) log-probabilities, not from the logits' tiles
               (``kernels.log_softmax_topk``, CUDA with Triton): the two ways in one run
    hf         the folder's ``MarianMTModel`` in ``--dtype`` on ``--device``, ``generate``
               (greedy, num_beams=4)

The work is decode.py's: sources of 20 tokens (19 random pieces + ``</s>``), exactly 30 decoder
steps per sentence (EOS suppressed until then), each figure the median of ``--repeats`` runs
after a warm-up, with the device synchronised before the clock stops. Timed: greedy and beam 4
on each batch of ``--batches``. Before timing, both are checked to compute the same model in
float32 on the CPU (decode_marian.py's check, 1e-3), and on the device the share of equal greedy
tokens at the first batch is reported (bf16/fp16 rounding may part them).

Ends with one JSON line: the times, peak device memory per system (CUDA), the ratios
``gpu_beam4_b{N}_vs_hf`` and ``gpu_greedy_b{N}_vs_hf`` (their time over ours: > 1 means transduce
is faster), the same of the static steps (``gpu_*_b{N}_static_vs_hf``) and the static steps over
the engine's (``gpu_*_b{N}_static_vs_eager``) and over ``transduce_static_plain``'s
(``gpu_*_b{N}_static_vs_plain``), and ``static_agreement``: the share of tokens the
static steps choose as the engine does at the first batch, greedy and beam 4 (1.0 in float32;
bf16 rounding in attention over masked positions may part a few).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (benchmarks/decode.py: constants, EOS suppression, median_time)
import decode_marian  # noqa: E402  (the Marian folder, the systems and their float32 check)
from decode import ALPHA, BEAM, SRC_LEN, STEPS, median_time  # noqa: E402

DTYPES = ("bf16", "fp16", "fp32")


def _dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def draw_sources(systems: decode_marian.Systems, n: int, seed: int = 2) -> list[list[str]]:
    """``n`` sources of SRC_LEN - 1 ordinary pieces (``</s>`` appended per system)."""
    ordinary = [p for p in systems.marian_ids if p not in ("</s>", "<unk>", "<pad>")]
    rng = random.Random(seed)
    return [[rng.choice(ordinary) for _ in range(SRC_LEN - 1)] for _ in range(n)]


def _synchronised(fn: Callable[[], Any], device: Any) -> Callable[[], None]:
    import torch

    def go() -> None:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return go


def ours_runner(
    systems: decode_marian.Systems, device: Any, static: bool = False
) -> Callable[[Any, int], list]:
    """``run(src, beam)`` -> token lists, on a ``DecodingModel`` of the model as it is now;
    ``static``: through a ``StaticDecoder`` of it (CUDA graphs on CUDA)."""
    from transduce.inference import beam_search, greedy_search
    from transduce.inference.engine import DecodingModel
    from transduce.inference.engine.static import StaticDecoder

    engine: Any = DecodingModel(systems.ours)
    if static:
        engine = StaticDecoder(engine)
    wrapped = decode.SuppressEarlyEOS(engine, STEPS - 1)

    def run(src: Any, beam: int) -> list:
        if beam == 1:
            return greedy_search(wrapped, src, max_len=STEPS - 1)
        return [
            h[0].tokens
            for h in beam_search(wrapped, src, beam=beam, alpha=ALPHA, max_len=STEPS - 1)
        ]

    return run


def hf_runner(systems: decode_marian.Systems) -> Callable[[Any, int], list]:
    """``run(src, beam)`` -> token lists (without the decoder start) of ``generate``."""

    def run(src: Any, beam: int) -> list:
        return decode_marian.hf_generate(systems.hf, src, beam)[:, 1:].tolist()

    return run


def _time(run: Callable[[Any, int], list], batches: dict[int, Any], args, device) -> dict:
    import torch

    out: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for n, src in batches.items():
        for beam, name in ((1, "greedy"), (BEAM, "beam4")):
            out[f"{name}_b{n}"] = median_time(
                _synchronised(lambda s=src, b=beam: run(s, b), device), args.repeats
            )
    if device.type == "cuda":
        out["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def agreement(
    ours: list[list[int]], theirs: list[list[int]], to_ours: dict[int, int] | None = None
) -> float:
    """The share of positions where both chose the same piece (``theirs`` mapped into our ids
    by ``to_ours``; None: both in our ids)."""
    same = total = 0
    for a, b in zip(ours, theirs, strict=True):
        mapped = b if to_ours is None else [to_ours.get(t, -1) for t in b]
        total += max(len(a), len(mapped))
        same += sum(x == y for x, y in zip(a, mapped, strict=False))
    return same / max(total, 1)


def profile_searches(path: Path, device: Any, runs: dict[str, tuple[Callable, Any]]) -> None:
    """Write to ``path`` a torch.profiler table of one beam-4 search per system (warm), with its
    wall time: host time spent launching against the device's kernel time."""
    import time

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with path.open("w") as f:
        for name, (run, src) in runs.items():
            go = _synchronised(lambda r=run, s=src: r(s, BEAM), device)
            go()  # warm: the static slots captured, the allocator settled
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                go()
                wall = time.perf_counter() - start
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
            f.write(f"== {name}: beam 4, batch {src.shape[0]}, {wall * 1e3:.1f} ms wall\n")
            f.write(table + "\n")
            if device.type == "cuda":  # the device's side: kernels by name, graphs' included
                table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
                f.write(f"== {name}, by device time\n{table}\n")


def plain_candidates(run: Callable[[Any, int], list]) -> Callable[[Any, int], list]:
    """``run`` with each beam step's candidates from ``log_softmax`` and a top-k over the
    (N, V) log-probabilities (the way before kernels/topk_tiles.py, and the CPU's)."""
    from unittest import mock

    from transduce import kernels

    def go(src: Any, beam: int) -> list:
        with mock.patch.object(kernels, "log_softmax_topk_pays", lambda device, k: False):
            return run(src, beam)

    return go


def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import torch

    from transduce.data.vocab import EOS
    from transduce.device import resolve_device

    device = resolve_device(args.device)
    size = decode_marian.SIZES["quick" if args.quick else "opus"]
    print(f"building the Marian folder {size} ...", file=sys.stderr, flush=True)
    folder = decode_marian.make_folder(workdir / "opus-mt", size)
    systems = decode_marian.load_systems(folder, workdir / "model.pt")
    sources, target = decode_marian.draw_pieces(systems)
    ref = decode_marian.ours_log_probs(systems, sources[0], target)
    hf_diff = decode_marian.max_diff(
        "hf", decode_marian.hf_log_probs(systems, sources[0], target), ref
    )

    dtype = _dtype(args.dtype)
    systems.ours.to(device=device, dtype=dtype).eval()
    systems.hf.to(device=device, dtype=dtype).eval()
    drawn = draw_sources(systems, max(args.batches))
    eos = systems.hf.config.eos_token_id
    ours_src = {
        n: torch.tensor([[*systems.ids(s, True), EOS] for s in drawn[:n]]) for n in args.batches
    }
    hf_src = {
        n: torch.tensor([[*systems.ids(s, False), eos] for s in drawn[:n]]) for n in args.batches
    }
    ours_src = {n: x.to(device) for n, x in ours_src.items()}
    hf_src = {n: x.to(device) for n, x in hf_src.items()}

    ours, hf = ours_runner(systems, device), hf_runner(systems)
    graphed = ours_runner(systems, device, static=True)
    graphed_plain = plain_candidates(graphed)
    first = args.batches[0]
    marian_to_ours = {
        systems.marian_ids[p]: i for p, i in systems.our_ids.items() if p in systems.marian_ids
    }
    ours_tokens = [list(t) for t in ours(ours_src[first], 1)]
    static_tokens = [list(t) for t in graphed(ours_src[first], 1)]
    hf_tokens = hf(hf_src[first], 1)
    for name, tokens in (("transduce", ours_tokens), ("static", static_tokens), ("hf", hf_tokens)):
        lengths = {len(t) + (name != "hf") for t in tokens}  # ours: + the final EOS
        if lengths != {STEPS}:
            raise RuntimeError(f"{name} did not generate exactly {STEPS} tokens: {sorted(lengths)}")
    same = agreement(
        [t[: STEPS - 1] for t in ours_tokens], [t[: STEPS - 1] for t in hf_tokens], marian_to_ours
    )
    beams = [graphed(ours_src[first], BEAM), ours(ours_src[first], BEAM)]
    static_same = {
        "greedy": agreement(static_tokens, ours_tokens),
        "beam4": agreement(*beams),
        "beam4_plain_candidates": agreement(beams[0], graphed_plain(ours_src[first], BEAM)),
    }

    results: dict[str, dict] = {}
    systems_timed = (
        ("transduce", ours, ours_src),
        ("transduce_static", graphed, ours_src),
        ("transduce_static_plain", graphed_plain, ours_src),
        ("hf", hf, hf_src),
    )
    for name, run, src in systems_timed:
        print(f"timing {name} on {device} in {args.dtype} ...", file=sys.stderr, flush=True)
        results[name] = _time(run, src, args, device)
    if args.profile is not None:
        last = max(args.batches)
        profile_searches(
            args.profile, device, {n: (r, s[last]) for n, r, s in systems_timed if n != "hf"}
        )
    return {
        "size": size,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor(),
        "systems": results,
        "check_max_abs_diff_fp32_cpu": hf_diff,
        "greedy_agreement": same,
        "static_agreement": static_same,
    }


def summary(res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    ours, hf = res["systems"]["transduce"], res["systems"]["hf"]
    static = res["systems"]["transduce_static"]
    plain = res["systems"]["transduce_static_plain"]
    out: dict[str, Any] = {
        "benchmark": "decode_gpu",
        "device": res["device"],
        "device_name": res["device_name"],
        "dtype": args.dtype,
        "quick": args.quick,
    }
    for n in args.batches:
        for name in ("beam4", "greedy"):
            out[f"gpu_{name}_b{n}_vs_hf"] = hf[f"{name}_b{n}"] / ours[f"{name}_b{n}"]
            out[f"gpu_{name}_b{n}_static_vs_hf"] = hf[f"{name}_b{n}"] / static[f"{name}_b{n}"]
            out[f"gpu_{name}_b{n}_static_vs_eager"] = ours[f"{name}_b{n}"] / static[f"{name}_b{n}"]
            out[f"gpu_{name}_b{n}_static_vs_plain"] = plain[f"{name}_b{n}"] / static[f"{name}_b{n}"]
    out["seconds"] = {
        k: {f: v for f, v in r.items() if f != "peak_memory_gb"} for k, r in res["systems"].items()
    }
    out["peak_memory_gb"] = {k: r.get("peak_memory_gb") for k, r in res["systems"].items()}
    out["greedy_agreement"] = res["greedy_agreement"]
    out["static_agreement"] = res["static_agreement"]
    out["check_max_abs_diff_fp32_cpu"] = res["check_max_abs_diff_fp32_cpu"]
    out["size"] = res["size"]
    out.update(
        {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "repeats": args.repeats,
        }
    )
    return {k: decode._round(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--quick", action="store_true", help="d_model 64, 2+2 layers, one repeat")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write a torch.profiler table of one beam-4 search at the largest batch, the engine "
        "and its static steps, to this file",
    )
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.batches):
        parser.error("--batches: every batch needs at least one sentence")
    if args.quick:
        args.repeats = 1

    import transformers

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        res = bench(args, Path(tmp))
    out = summary(res, args)
    for n in args.batches:
        print(
            f"batch {n}: beam 4 {out[f'gpu_beam4_b{n}_vs_hf']}x, greedy "
            f"{out[f'gpu_greedy_b{n}_vs_hf']}x Hugging Face generate; static steps "
            f"{out[f'gpu_beam4_b{n}_static_vs_hf']}x, {out[f'gpu_greedy_b{n}_static_vs_hf']}x "
            f"({args.dtype}, {res['device']})",
            file=sys.stderr,
        )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

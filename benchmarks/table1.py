"""The paper's Table 1 measured: one layer of each kind, timed over sequence lengths n.

    python benchmarks/table1.py [--quick] [--threads 2] [--device cpu|cuda]
                                [--lengths 16,32,...] [--output DIR] [--budget 1.0] [--fit-from 256]

The layers (``table1_layers.py``), all d = 512, batch 1, float32: transduce's multi-head
self-attention (8 heads of 64) and its attention core alone, ``nn.LSTM(512, 512)``,
``nn.Conv1d(512, 512, 3)`` (not separable, not dilated), and restricted self-attention over a
neighbourhood of r = 64 (|i - j| <= 32) computed banded in O(r n d), as a layer and as a core.

Timed: the forward pass under ``torch.no_grad`` and forward + backward (gradients of the inputs
and of every weight, from a fixed random output gradient); per case one warm-up call, then
``budget / warm-up time`` calls clamped to 3..20 (2..3 with ``--quick``), and their median. So a
slow case (the LSTM at n = 4096, seconds a call) runs 4 times in all and a fast one up to 21; the
full sweep, n = 16..4096, should take 4-6 minutes on 2 quiet cores (estimated from partial runs,
n = 4096 about a third of it). On a GPU every call is bracketed by ``torch.cuda.synchronize``.

Before timing, the FLOP formulas are checked against ``torch.utils.flop_counter.FlopCounterMode``
at the smallest n. Printed: per n the paper's three columns (complexity, sequential operations,
maximum path length, the last two evaluated with constants dropped) beside model FLOPs, times
and FLOP/s; the growth exponent of time in n (least squares of log time on log n over
n >= ``--fit-from``, else the last two lengths); where the measured self-attention and recurrent
curves cross (the last crossing, interpolated in log-log), in units of d = 512, against the
paper's argument that self-attention is faster when n < d, and where their model FLOPs cross
(2d for the whole layer: 8nd^2 + 4n^2 d = 16nd^2; 4d for the core). ``DIR/table1.png`` (default
DIR a new temporary folder) is the log-log figure; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

if str(Path(__file__).resolve().parent) not in sys.path:  # table1_layers.py lies beside this
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from table1_layers import (  # after the path above
    BATCH,
    D_MODEL,
    KERNEL,
    LAYERS,
    LENGTHS,
    NEIGHBOURHOOD,
    PAPER,
    QUICK_LENGTHS,
    RECURRENT,
    backward_flops,
    counted_flops,
    forward_flops,
    make_inputs,
    make_layers,
    max_path,
    sequential_ops,
)

# --- the arithmetic: pure functions --------------------------------------------------------------


def fit_line(lengths: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line of log(time) on log(n)."""
    xs, ys = [math.log(n) for n in lengths], [math.log(t) for t in times]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def fit_exponent(lengths: Sequence[float], times: Sequence[float]) -> float:
    """The growth exponent: time ~ n^slope, fitted by least squares in log-log."""
    return fit_line(lengths, times)[0]


def power_law_crossover(
    lengths: Sequence[float], a: Sequence[float], b: Sequence[float]
) -> float | None:
    """Where the power laws fitted to curves a and b meet (an extrapolation where the measured
    curves do not cross); None for parallel fits and for nearly parallel ones, whose meeting
    point lies past what a float holds (noise in a quick run makes such fits)."""
    (pa, ca), (pb, cb) = fit_line(lengths, a), fit_line(lengths, b)
    if abs(pa - pb) < 1e-9:
        return None
    log_n = (cb - ca) / (pa - pb)
    return None if log_n > math.log(sys.float_info.max) else math.exp(log_n)


def crossover(lengths: Sequence[float], a: Sequence[float], b: Sequence[float]) -> float | None:
    """The last n where curves a and b cross (the largest sign change of log(a / b): small
    lengths are the noisiest), interpolated linearly in log-log; None if they never cross."""
    gap = [math.log(x / y) for x, y in zip(a, b)]
    for i in reversed(range(len(gap) - 1)):
        if gap[i + 1] == 0.0:
            return float(lengths[i + 1])
        if gap[i] * gap[i + 1] < 0:
            lo, hi = math.log(lengths[i]), math.log(lengths[i + 1])
            return math.exp(lo + gap[i] / (gap[i] - gap[i + 1]) * (hi - lo))
    return float(lengths[0]) if gap and gap[0] == 0.0 else None


def fit_lengths(lengths: Sequence[int], fit_from: int) -> list[int]:
    """The lengths a growth exponent is fitted over: those >= fit_from, else the last two."""
    chosen = [n for n in lengths if n >= fit_from]
    return chosen if len(chosen) >= 2 else list(lengths[-2:])


# --- timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repeats:
    """How often a case runs: calls = budget_s / warm-up time, clamped to [least, most]."""

    budget_s: float = 1.0
    least: int = 3
    most: int = 20


def median_seconds(step: Callable[[], None], sync: Callable[[], None], repeats: Repeats) -> float:
    """The median wall time of ``step`` after one warm-up call (also the calls' estimate)."""

    def timed() -> float:
        sync()
        start = time.perf_counter()
        step()
        sync()
        return time.perf_counter() - start

    first = timed()  # warm-up: oneDNN primitives, allocator, caches
    calls = min(max(math.ceil(repeats.budget_s / max(first, 1e-6)), repeats.least), repeats.most)
    return statistics.median(timed() for _ in range(calls))


def time_layer(
    layer: nn.Module, inputs: tuple[Tensor, ...], sync: Callable[[], None], repeats: Repeats
) -> tuple[float, float]:
    """(forward, forward + backward) median seconds of ``layer`` on ``inputs``."""
    params = [*layer.parameters(), *inputs]
    grad = torch.randn_like(inputs[0])  # every layer's output has the shape of its first input

    def forward() -> None:
        with torch.no_grad():
            layer(*inputs)

    def forward_backward() -> None:
        for p in params:
            p.grad = None  # no accumulation into last call's gradients
        layer(*inputs).backward(grad)

    return median_seconds(forward, sync, repeats), median_seconds(forward_backward, sync, repeats)


# --- the run -------------------------------------------------------------------------------------


def measure(lengths: Sequence[int], device: torch.device, repeats: Repeats) -> dict[str, Any]:
    """Median seconds per layer and length: {"forward": {layer: [...]}, "forward_backward": ...}."""
    layers = make_layers(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, dict[str, list[float]]] = {"forward": {}, "forward_backward": {}}
    for n in lengths:  # lengths outside, so that slow drift of a shared machine hits every layer
        for name, layer in layers.items():
            fwd, both = time_layer(layer, make_inputs(name, n, device), sync, repeats)
            times["forward"].setdefault(name, []).append(fwd)
            times["forward_backward"].setdefault(name, []).append(both)
        print(f"  n = {n} timed", file=sys.stderr, flush=True)
    return times


def print_tables(lengths: Sequence[int], times: dict[str, Any]) -> None:
    """Per length: the paper's three columns beside model FLOPs, times and FLOP/s."""
    head = (
        f"{'layer':<20} {'complexity':<22} {'sequential':<13} {'max path':<18} "
        f"{'GFLOP fwd':>10} {'fwd ms':>9} {'f+b ms':>9} {'f+b GFLOP/s':>12}"
    )
    for i, n in enumerate(lengths):
        print(f"\nn = {n}, d = {D_MODEL}, k = {KERNEL}, r = {NEIGHBOURHOOD}, batch {BATCH}\n{head}")
        for name in LAYERS:
            cplx, seq, path = PAPER[name]
            fwd, both = times["forward"][name][i], times["forward_backward"][name][i]
            flops = forward_flops(name, n)
            rate = (flops + backward_flops(name, n)) / both / 1e9
            print(
                f"{name:<20} {cplx:<22} {f'{seq} = {sequential_ops(name, n)}':<13} "
                f"{f'{path} = {max_path(name, n):.3g}':<18} {flops / 1e9:>10.4f} "
                f"{fwd * 1e3:>9.3f} {both * 1e3:>9.3f} {rate:>12.1f}"
            )


def crossovers(
    lengths: Sequence[int], times: dict[str, Any], fitted: Sequence[int]
) -> dict[str, Any]:
    """Where self-attention (layer and core) and the LSTM cross: measured (None: not within the
    lengths); where their power laws fitted over ``fitted`` meet beyond the longest length, when
    the measured curves do not cross; and where their model FLOPs are equal."""
    idx = [list(lengths).index(n) for n in fitted]
    grid = range(1, 16 * D_MODEL)
    out: dict[str, Any] = {}
    for name in ("self-attention", "self-attention core"):
        found: dict[str, Any] = {}
        for mode, per in times.items():
            found[mode] = crossover(lengths, per[name], per[RECURRENT])
            a, b = [per[name][i] for i in idx], [per[RECURRENT][i] for i in idx]
            beyond = power_law_crossover(fitted, a, b)  # only an extrapolation past the data counts
            keep = beyond is not None and beyond > lengths[-1] and found[mode] is None
            found[f"{mode}_fitted"] = beyond if keep else None
        flops = [forward_flops(name, n) for n in grid], [forward_flops(RECURRENT, n) for n in grid]
        found["flops"] = crossover(grid, *flops)
        out[f"{name} vs recurrent"] = found
    return out


def describe_crossover(
    key: str, found: dict[str, Any], lengths: Sequence[int], times: dict[str, Any]
) -> list[str]:
    """Lines: where the measured curves cross, in units of d, or who is faster throughout."""
    name, flops = key.removesuffix(" vs recurrent"), found["flops"]
    lines = [f"{key} (model FLOPs equal at n = {flops:.0f} = {flops / D_MODEL:.2f} d):"]
    for mode in ("forward", "forward_backward"):
        n, fitted = found[mode], found[f"{mode}_fitted"]
        if n is None:
            who = name if times[mode][name][0] < times[mode][RECURRENT][0] else "the LSTM"
            what = f"no crossing in n = {lengths[0]}..{lengths[-1]}: {who} faster throughout"
        else:
            what = f"cross at n = {n:,.0f} = {n / D_MODEL:.2f} d"
        if fitted is not None:
            what += (
                f"; fitted power laws meet beyond, at n = {fitted:,.0f} = {fitted / D_MODEL:.1f} d"
            )
        lines.append(f"    {mode:<17} {what}")
    return lines


def exponents(
    lengths: Sequence[int], times: dict[str, Any], fitted: Sequence[int]
) -> dict[str, Any]:
    """{layer: {mode: growth exponent over the lengths ``fitted``}}."""
    idx = [list(lengths).index(n) for n in fitted]
    return {
        name: {
            mode: round(fit_exponent(fitted, [per[name][i] for i in idx]), 3)
            for mode, per in times.items()
        }
        for name in LAYERS
    }


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo where there is one."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def draw(lengths: Sequence[int], times: dict[str, Any], output: Path, title: str) -> Path:
    """Log-log time against n, one colour per layer, forward solid, forward + backward dashed."""
    # the house figure helpers (Agg canvas, no pyplot)
    from transduce.plotting._figure import distinct_colors, new_figure, save, style

    with style():
        fig = new_figure(7.2, 4.0)
        ax = fig.add_subplot()
        for name, colour in zip(LAYERS, distinct_colors(len(LAYERS))):
            ax.plot(lengths, times["forward"][name], "-o", color=colour, ms=3, label=name)
            ax.plot(lengths, times["forward_backward"][name], "--", color=colour)
        ax.axvline(D_MODEL, color="grey", lw=0.8, ls=":", label=f"n = d = {D_MODEL}")
        ax.set(yscale="log", xlabel="sequence length n", ylabel="seconds per call", title=title)
        ax.set_xscale("log", base=2)
        legend = "solid: forward\ndashed: fwd + bwd"
        ax.legend(title=legend, loc="center left", bbox_to_anchor=(1.0, 0.5))
        return save(fig, output / "table1.png")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="lengths 16, 64, 256 and 2-3 calls each")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="folder of table1.png (default: a new temporary one)",
    )
    p.add_argument(
        "--budget", type=float, default=None, help="seconds of calls per case (1.0; quick 0.05)"
    )
    p.add_argument("--fit-from", type=int, default=256, help="fit exponents over n >= this")
    return p.parse_args(argv)


def run(args: argparse.Namespace, lengths: Sequence[int]) -> tuple[bool, dict[str, Any]]:
    """On ``args.threads`` threads (restored after): whether the FLOP formulas equal PyTorch's
    counter at the smallest n (tests check more sizes), and the times of ``measure``."""
    repeats = Repeats(0.05, 2, 3) if args.quick else Repeats()
    repeats = Repeats(args.budget, repeats.least, repeats.most) if args.budget else repeats
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        n = lengths[0]
        checked = all(
            counted_flops(name, n) == (forward_flops(name, n), backward_flops(name, n))
            for name in LAYERS
        )
        return checked, measure(lengths, torch.device(args.device), repeats)
    finally:
        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark, prints the tables and the JSON line; returns that JSON object."""
    args = parse_args(argv)
    lengths = list(args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS))
    checked, times = run(args, lengths)
    where = device_name(torch.device(args.device))
    print(
        f"\nTable 1 measured on {where}, {args.threads} threads, torch {torch.__version__}, "
        f"float32; FLOP formulas = FlopCounterMode's count: {checked}"
    )
    print_tables(lengths, times)
    fitted = fit_lengths(lengths, args.fit_from)
    growth = exponents(lengths, times, fitted)
    print(f"\ngrowth exponent of time in n (least squares over n = {fitted[0]}..{fitted[-1]}):")
    for name, e in growth.items():
        print(
            f"  {name:<20} forward {e['forward']:.2f}   "
            f"forward+backward {e['forward_backward']:.2f}"
        )
    cross = crossovers(lengths, times, fitted)
    print(f"\nself-attention against recurrence (the paper: faster when n < d = {D_MODEL}):")
    for key, found in cross.items():
        print("\n".join("  " + line for line in describe_crossover(key, found, lengths, times)))
    print("  (convolution: a contiguous kernel's path is O(n/k); the paper's log_k(n) is dilated)")
    output = args.output or Path(tempfile.mkdtemp(prefix="table1-"))
    threads = f", {args.threads} threads" if args.device == "cpu" else ""
    title = f"Table 1 measured: d = {D_MODEL}, batch {BATCH}, {where}{threads}"
    figure = draw(lengths, times, output, title)
    print(f"\nfigure: {figure}")
    summary = {
        "device": where,
        "threads": args.threads,
        "d": D_MODEL,
        "lengths": lengths,
        "flops_checked": checked,
        "exponents": growth,
        "fit_lengths": fitted,
        "crossover_n": {
            k: {m: (None if v is None else round(v, 1)) for m, v in f.items()}
            for k, f in cross.items()
        },
        "times_ms": {
            m: {name: [round(t * 1e3, 4) for t in per[name]] for name in LAYERS}
            for m, per in times.items()
        },
        "figure": str(figure),
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

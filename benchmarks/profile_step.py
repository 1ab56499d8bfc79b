"""Where one training step's device time goes: train_step.py's step under torch.profiler, the
kernels grouped into kinds (matrix products, attention, the loss, casts, norms, optimizer, ...).

    python benchmarks/profile_step.py [--device cuda] [--size base] [--paper-batch]
                                      [--precision bf16-weights] [--system transduce] [--steps 5]

Prints the top kernels by device time, then one JSON line: the step's milliseconds (profiled,
so a little slower than train_step.py's), each kind's share of the device time and its kernel
count per step. Read with train_step.py's figures: this says why, that says how fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402  (the systems, sizes and step of the speed benchmark)

# the first pattern found in a kernel's lower-cased name names its kind
KINDS = (
    ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn")),
    ("loss", ("cross_entropy", "liger", "log_softmax", "logsumexp", "nll")),
    (
        "matmul",
        ("gemm", "xmma", "cutlass", "matmul", "cublas", "nvjet", "aten::mm", "addmm", "bmm"),
    ),
    ("cast", ("copy_", "to_copy", "direct_copy", "convert", "cast")),
    ("norm", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli", "philox")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("reduce", ("reduce", "sum_", "norm_kernel")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, patterns in KINDS:
        if any(p in low for p in patterns):
            return kind
    return "elementwise/other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", choices=list(train_step.SIZES), default="base")
    p.add_argument("--system", choices=train_step.SYSTEMS, default="transduce")
    p.add_argument("--precision", choices=train_step.PRECISIONS, default="bf16-weights")
    p.add_argument("--paper-batch", action="store_true", help="1024 x (24 + 24) tokens")
    p.add_argument("--batch", type=int, default=train_step.BATCH)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument(
        "--shapes",
        action="store_true",
        help="also the operators of most device time with their input shapes",
    )
    args = p.parse_args()
    batch = train_step.PAPER_BATCH if args.paper_batch else args.batch
    device = torch.device(args.device)
    if device.type == "cpu":  # as train_step.py's "--malloc on" and the Trainer run
        from transduce.runtime import tune_malloc

        tune_malloc()
    size = train_step.SIZES[args.size]
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, size["vocab"], (batch, train_step.SRC_LEN), generator=g).to(device)
    tgt = torch.randint(4, size["vocab"], (batch, train_step.TGT_LEN + 1), generator=g).to(device)
    tgt_in, tgt_out = tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()
    runner = train_step.make_runner(args.system, size, device)
    for _ in range(3):  # warm-up: allocator, cuDNN/cuBLAS plans, compiled graphs
        runner.step(src, tgt_in, tgt_out, args.precision)
    train_step.sync(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=args.shapes) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            runner.step(src, tgt_in, tgt_out, args.precision)
        train_step.sync(device)
        wall = (time.perf_counter() - t0) / args.steps
    events = [e for e in prof.key_averages() if e.device_type.name == device.type.upper()]
    if device.type == "cpu":  # no kernels: the operators' own CPU time stands in
        events = list(prof.key_averages())

    def dev_us(e: object) -> float:
        if device.type == "cuda":
            return float(getattr(e, "self_device_time_total", 0.0))
        return float(getattr(e, "self_cpu_time_total", 0.0))

    total = sum(dev_us(e) for e in events) or 1.0
    by_kind: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        by_kind[kind_of(e.key)] += dev_us(e)
        counts[kind_of(e.key)] += e.count
    print(f"{args.system} {args.size} {args.precision}, batch {batch}: {wall * 1e3:.1f} ms a step")
    for e in sorted(events, key=dev_us, reverse=True)[: args.top]:
        share = dev_us(e) / total
        print(f"{share:6.1%} {e.count // args.steps:5d}/step  {kind_of(e.key):18s} {e.key[:90]}")
    if args.shapes:  # which operators (and tensors) the kernels came from
        ops = [
            e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")
        ]
        ops.sort(key=dev_us, reverse=True)
        own = "device" if device.type == "cuda" else "CPU"
        print(f"operators by their own {own} time, with input shapes:")
        for e in ops[: args.top]:
            us = dev_us(e) / args.steps
            shapes = str(e.input_shapes)[:80]
            print(f"{us / 1e3:8.3f} ms {e.count // args.steps:5d}/step  {e.key:28s} {shapes}")
    print(
        json.dumps(
            {
                "benchmark": "profile_step",
                "system": args.system,
                "size": args.size,
                "precision": args.precision,
                "batch": batch,
                "ms_per_step_profiled": round(wall * 1e3, 2),
                "device_busy_share": round(total / 1e3 / args.steps / (wall * 1e3), 3),
                "share": {k: round(v / total, 3) for k, v in sorted(by_kind.items())},
                "kernels_per_step": {k: c // args.steps for k, c in sorted(counts.items())},
            }
        )
    )


if __name__ == "__main__":
    main()

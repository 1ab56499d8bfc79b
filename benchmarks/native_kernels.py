"""The native CPU kernels (``transduce.kernels.native``) against PyTorch's operators, paired.

    python benchmarks/native_kernels.py [--sizes small base] [--rounds 6] [--threads 2]
                                        [--parts operators searches training]

Four parts, each timed in one process with the kernels switched on and off in turns (rotated
order, median of the per-round ratios, so a shared machine's drift cancels):

- the operators alone: per-row int8 quantisation (``int8_rows``, ``guarded_rows``) at the
  engine's row and width counts, and the k best log-probabilities of a step's logits
  (``log_softmax_topk``, k = 4 and 1) against ``log_softmax`` then the top-k (or the max); a
  search step's attention (``decode_attention``) against PyTorch's fused kernel; and where it
  runs, our AMX int8 product against oneDNN's (32 rows and more) or fbgemm's;
- whole searches on benchmarks/decode.py's models and batch (32 sentences of 20 tokens, 30
  steps, random weights): beam 4 and greedy on the batch, greedy and beam 4 on one sentence
  (the engine's native step of one sentence's rows, ``native_row_step``, against its PyTorch
  step), float32 and int8, their outputs checked equal with and without the kernels; and
  beam 4 and greedy on the batch with one kernel switched off, the others on: the cache's
  lineage table (``lineage_steps``: a beam's reorder moves the table, not the cache) against
  the gathering cache, in int8 our AMX kernel against oneDNN's and fbgemm's (where it runs;
  the operator alone too, at the engine's shapes), and in float32 our product on W's panels
  against what "auto" took before it, MKL's ``addmm`` (Intel CPUs with AVX-512), and forced
  against "auto" (oneDNN) on other CPUs with AVX-512, for the rule's measurement there (the
  operator alone against MKL's wherever it is built), and a batch's step in one native call
  (``native_batch_step``) against the same operators called from Python; and beam 4 on the
  batch and on one sentence with beam search's choice of a step in one native call
  (``kernels.beam_select``) against PyTorch's operators;
- the training operators: the label-smoothed cross-entropy with its gradient (the paper's batch
  of 64 x 24 target tokens over 37,000 words, bfloat16, against training/loss.py's chunks),
  dropout's keep-and-scale tensor, layer norm forward and backward (bfloat16), the total
  norm of BASE's float32 gradients, and bf16-weights' update of BASE's parameters (the norm and
  Adam's one pass from the bfloat16 gradients, ``kernels.adam``, against their float32 copy,
  its norm, torch's fused Adam and the working copy cast anew);
- whole training steps (benchmarks/train_step.py's, bf16-weights) with the kernels on and off.

Prints a table and ends with one JSON line; ratios are PyTorch's time over the native one's
(> 1: the kernels are faster).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (benchmarks/decode.py: the models, the batch, the EOS suppression)


def paired(fn_on: Callable[[], object], fn_off: Callable[[], object], rounds: int) -> dict:
    """Median seconds of each and the median of per-round ratios off / on, turns rotated."""
    fn_on(), fn_off()  # warm-up
    on, off, ratios = [], [], []
    for r in range(rounds):
        t: dict[bool, float] = {}
        for flag in (True, False) if r % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            (fn_on if flag else fn_off)()
            t[flag] = time.perf_counter() - t0
        on.append(t[True])
        off.append(t[False])
        ratios.append(t[False] / t[True])
    return {
        "native_ms": round(statistics.median(on) * 1e3, 3),
        "torch_ms": round(statistics.median(off) * 1e3, 3),
        "speedup": round(statistics.median(ratios), 3),
    }


def repeat(fn: Callable[[], object], times: int) -> Callable[[], None]:
    def go() -> None:
        for _ in range(times):
            fn()

    return go


def operators(rounds: int) -> dict[str, dict]:
    from transduce.inference.common import next_token_log_probs
    from transduce.inference.topk import chunked_topk
    from transduce.kernels import native, quantized

    out: dict[str, dict] = {}
    g = torch.Generator().manual_seed(0)
    for rows, width in ((1, 256), (128, 256), (128, 512), (128, 2048)):
        x = torch.randn(rows, width, generator=g)
        out[f"int8_rows {rows}x{width}"] = paired(
            repeat(lambda x=x: native.int8_rows(x), 200),
            repeat(lambda x=x: quantized.int8_rows_torch(x), 200),
            rounds,
        )
        out[f"guarded_rows {rows}x{width}"] = paired(
            repeat(lambda x=x: native.guarded_rows(x), 200),
            repeat(lambda x=x: quantized.guarded_rows_torch(x), 200),
            rounds,
        )
    for rows, vocab in ((1, 8000), (128, 8000), (1, 37000), (128, 37000)):
        x = torch.randn(rows, vocab, generator=g) * 3
        out[f"log_softmax_topk4 {rows}x{vocab}"] = paired(
            repeat(lambda x=x: native.log_softmax_topk(x, 4, 0, 1), 20),
            repeat(lambda x=x: chunked_topk(next_token_log_probs(x, None), 4), 20),
            rounds,
        )
        out[f"log_softmax_max {rows}x{vocab}"] = paired(
            repeat(lambda x=x: native.log_softmax_topk(x, 1, 0, 1), 20),
            repeat(lambda x=x: next_token_log_probs(x, None).max(dim=-1), 20),
            rounds,
        )
    # a search step's attention: 128 rows (32 sentences x beam 4) over 30 cached positions
    # (the cache's strides), and the 4 hypotheses of 32 sentences over 20 source positions
    cache = torch.randn(128, 32, 4, 64, generator=g).narrow(1, 0, 30).transpose(1, 2)
    grouped = [torch.randn(32, 4, n, 64, generator=g) for n in (4, 20, 20)]
    for name, (q, k, v) in {
        "decode_attention 128x4x1 over 30": (torch.randn(128, 4, 1, 64, generator=g), cache, cache),
        "decode_attention 32x4x4 over 20": grouped,
    }.items():
        out[name] = paired(
            repeat(lambda q=q, k=k, v=v: native.decode_attention(q, k, v, None), 50),
            repeat(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), 50),
            rounds,
        )
    if quantized.amx_int8_available():  # the int8 products: ours on AMX against PyTorch's best
        for rows, width, outputs in (
            (4, 512, 2048),
            (32, 256, 8000),
            (128, 256, 768),
            (128, 512, 37000),
        ):
            x = torch.randn(rows, width, generator=g)
            q = quantized.quantize_weight(torch.randn(outputs, width, generator=g))
            b = torch.randn(outputs, generator=g)
            amx, fb = quantized.AmxInt8.of(q), quantized.fbgemm_packed(q, None)
            onednn = quantized.OnednnInt8.of(q) if quantized.onednn_int8_available() else None
            if onednn is not None and rows >= quantized.ONEDNN_MIN_ROWS:
                theirs = lambda x=x, w=onednn, b=b: quantized.onednn_linear_rows(x, w, b)  # noqa: E731
            else:
                theirs = lambda x=x, w=fb, b=b: quantized.fbgemm_linear_rows(x, w, b)  # noqa: E731
            out[f"amx_int8 {rows}x{width}->{outputs}"] = paired(
                repeat(lambda x=x, w=amx, b=b: quantized.amx_linear_rows(x, w, b), 20),
                repeat(theirs, 20),
                rounds,
            )
    if native.f32_gemm_available():  # float32 products: ours on W's panels against MKL's addmm
        from transduce.kernels.projection import transposed

        for rows, width, outputs in ((8, 512, 2048), (128, 256, 768), (128, 256, 8000)):
            x = torch.randn(rows, width, generator=g)
            w, b = torch.randn(outputs, width, generator=g), torch.randn(outputs, generator=g)
            panels, w_t = native.f32_pack(w), transposed(w)
            out[f"f32_linear {rows}x{width}->{outputs}"] = paired(
                repeat(lambda x=x, p=panels, b=b, n=outputs: native.f32_linear(x, p, b, n), 20),
                repeat(lambda x=x, w=w_t, b=b: torch.addmm(b, x, w), 20),
                rounds,
            )
    return out


def training_operators(rounds: int) -> dict[str, dict]:
    import torch.nn.functional as F

    from transduce.kernels import dropout, layer_norm, native, total_norm
    from transduce.training import loss

    out: dict[str, dict] = {}
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(64 * 24, 37000, generator=g) * 3).bfloat16()
    target = torch.randint(4, 37000, (64 * 24,), generator=g)
    keep = torch.rand(64 * 24, generator=g) > 0.1
    grad = torch.empty_like(logits)

    def chunked() -> None:
        loss._chunked_rows(logits, target, 0.1, 1.0, grad)
        loss._zero_rows(grad, keep)

    out["smoothed_ce 1536x37000 bf16"] = paired(
        lambda: native.smoothed_cross_entropy(logits, target, keep, 0.1, 1.0, grad),
        chunked,
        rounds,
    )
    x = torch.randn(64, 24, 512, generator=g).bfloat16()
    out["dropout 64x24x512 bf16"] = paired(
        repeat(lambda: dropout(x, 0.1, True), 50),
        repeat(switched(lambda: dropout(x, 0.1, True), False), 50),
        rounds,
    )
    xs = x.view(-1, 512).requires_grad_()
    w, b = torch.ones(512).bfloat16().requires_grad_(), torch.zeros(512).bfloat16().requires_grad_()
    dy = torch.randn(64 * 24, 512, generator=g).bfloat16()

    def norm_pass(fn: Callable[..., torch.Tensor]) -> Callable[[], None]:
        return repeat(lambda: torch.autograd.grad(fn(xs, (512,), w, b, 1e-5), (xs, w, b), dy), 20)

    out["layer_norm fwd+bwd 1536x512 bf16"] = paired(
        norm_pass(layer_norm), norm_pass(F.layer_norm), rounds
    )
    shapes = [(37000, 512)] + [(512, 512)] * 72 + [(2048, 512), (512, 2048)] * 12
    grads = [torch.randn(s, generator=g) for s in shapes + [(512,)] * 100]
    get_total_norm = torch.nn.utils.get_total_norm
    out["total_norm BASE grads"] = paired(
        lambda: total_norm(grads), lambda: get_total_norm(grads), rounds
    )
    out["adam bf16-weights BASE"] = paired(*adam_updates(shapes + [(512,)] * 100), rounds)
    return out


def adam_updates(shapes: list[tuple[int, ...]]) -> tuple[Callable[[], None], Callable[[], None]]:
    """bf16-weights' update after the backward pass, on parameters of ``shapes``: the norm of
    the bfloat16 gradients and ``kernels.adam``'s one pass (native), against the gradients
    widened into float32, their norm, torch's fused Adam and the working copy cast anew."""
    from transduce.kernels import adam, total_norm

    g = torch.Generator().manual_seed(4)
    params = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    opt = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    grads = [torch.randn(s, generator=g).bfloat16() for s in shapes]
    working = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad.float()
    opt.step()  # Adam's state made
    opt.zero_grad(set_to_none=True)
    masters = [p.detach() for p in params]
    states = [opt.state[p] for p in params]

    def one_pass() -> None:
        total_norm(grads)
        adam.adam_bf16_copy(
            masters, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
            [s["step"] for s in states], working,
            lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, grad_scale=1.0,
        )  # fmt: skip

    def three_passes() -> None:
        widened = [torch.empty_like(p) for p in masters]
        torch._foreach_copy_(widened, grads)
        for p, grad in zip(params, widened, strict=True):
            p.grad = grad
        total_norm(widened)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(working, masters)

    return one_pass, three_passes


def train_steps(size_name: str, rounds: int) -> dict[str, dict]:
    import train_step

    size = train_step.SIZES[size_name]
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, size["vocab"], (train_step.BATCH, train_step.SRC_LEN), generator=g)
    tgt = torch.randint(4, size["vocab"], (train_step.BATCH, train_step.TGT_LEN + 1), generator=g)
    tgt_in, tgt_out = tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()
    runner = train_step.make_runner("transduce", size, torch.device("cpu"))

    def step() -> None:
        runner.step(src, tgt_in, tgt_out, "bf16-weights")

    result = paired(step, switched(step, False), rounds)
    print(f"{size_name} train step", result, file=sys.stderr, flush=True)
    return {f"{size_name} train step bf16-weights": result}


def switched(fn: Callable[[], object], on: bool) -> Callable[[], object]:
    """``fn`` run with the native kernels on (as they are) or off (``native.available`` False)."""
    from transduce.kernels import native

    real = native.available

    def go() -> object:
        native.available = real if on else (lambda: False)  # type: ignore[assignment]
        try:
            return fn()
        finally:
            native.available = real  # type: ignore[assignment]

    return go


def searches(size_name: str, rounds: int) -> dict[str, dict]:
    from transduce.data.vocab import EOS
    from transduce.inference import beam_search, greedy_search
    from transduce.inference.engine import DecodingModel
    from transduce.kernels import native, quantized
    from transduce.kernels.matmul import use_native_f32

    size = decode.SIZES[size_name]
    ours = decode.build_ours(size)
    g = torch.Generator().manual_seed(1)
    body = torch.randint(4, size["vocab"], (decode.BATCH, decode.SRC_LEN - 1), generator=g)
    src = torch.cat([body, torch.full((decode.BATCH, 1), EOS)], 1)
    out: dict[str, dict] = {}
    for int8 in (False, True):
        max_len = decode.STEPS - 1
        # the engine decides on its kernels when made: one engine a side, the other made with
        # the native kernels off
        on = decode.SuppressEarlyEOS(DecodingModel(ours, int8=int8), max_len)
        off = decode.SuppressEarlyEOS(
            switched(lambda int8=int8: DecodingModel(ours, int8=int8), False)(), max_len
        )
        jobs = {
            "beam4": lambda s: [
                h[0].tokens
                for h in beam_search(s, src, beam=decode.BEAM, alpha=decode.ALPHA, max_len=max_len)
            ],
            "greedy": lambda s: greedy_search(s, src, max_len=max_len),
            "b1": lambda s: greedy_search(s, src[:1], max_len=max_len),
            "b1 beam4": lambda s: [
                h[0].tokens
                for h in beam_search(
                    s, src[:1], beam=decode.BEAM, alpha=decode.ALPHA, max_len=max_len
                )
            ],
        }
        for job, fn in jobs.items():
            key = f"{size_name} {'int8' if int8 else 'fp32'} {job}"
            fn_on, fn_off = switched(lambda f=fn: f(on), True), switched(lambda f=fn: f(off), False)
            with torch.no_grad():
                same = fn_on() == fn_off()
                out[key] = paired(fn_on, fn_off, rounds)
            out[key]["same_outputs"] = same
            print(key, out[key], file=sys.stderr, flush=True)
        # one kernel alone, every other on in both: the lineage table (a batch's beam reorders),
        # and in int8 the AMX kernel (where it runs) against oneDNN's and fbgemm's
        alone = {"lineage": lambda: DecodingModel(ours, int8=int8, lineage_steps=False)}
        make_on = lambda: DecodingModel(ours, int8=int8)  # noqa: E731
        if make_on().batch_plan is not None:  # a batch's step in one call, against the Python
            alone["batch step"] = lambda: DecodingModel(ours, native_batch_step=False)
        if int8 and quantized.amx_int8_available():
            alone["amx"] = lambda: without_amx(lambda: DecodingModel(ours, int8=True))
        makers = {name: (make_on, make_off) for name, make_off in alone.items()}
        if not int8 and use_native_f32("auto", ours.generator.weight):
            # our float32 product against MKL's, which "auto" took before it on these CPUs
            makers["f32"] = (make_on, lambda: DecodingModel(ours, matmul="mkl"))
        elif not int8 and native.f32_gemm_available():
            # where "auto" does not take it (AMD CPUs with AVX-512): ours forced against "auto"
            makers["f32"] = (lambda: with_native_f32(make_on), make_on)
        for name, (make_a, make_off) in makers.items():
            on = decode.SuppressEarlyEOS(make_a(), max_len)
            off = decode.SuppressEarlyEOS(make_off(), max_len)
            for job in ("beam4", "greedy"):
                key = f"{size_name} {'int8' if int8 else 'fp32'} {job} {name}"
                fn = jobs[job]
                with torch.no_grad():
                    same = fn(on) == fn(off)
                    out[key] = paired(lambda f=fn, e=on: f(e), lambda f=fn, e=off: f(e), rounds)
                out[key]["same_outputs"] = same
                print(key, out[key], file=sys.stderr, flush=True)
        if not int8:  # beam search's choice of a step in one native call, against PyTorch's
            engine = decode.SuppressEarlyEOS(make_on(), max_len)
            for job in ("beam4", "b1 beam4"):
                key = f"{size_name} fp32 {job} choice"
                fn_on = lambda f=jobs[job]: f(engine)  # noqa: E731
                fn_off = without_native_choice(fn_on)
                with torch.no_grad():
                    same = fn_on() == fn_off()
                    out[key] = paired(fn_on, fn_off, rounds)
                out[key]["same_outputs"] = same
                print(key, out[key], file=sys.stderr, flush=True)
    return out


def without_native_choice(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with beam search's choice in PyTorch's operators (``kernels.beam_select`` off)."""
    from transduce import kernels

    real = kernels.beam_select_runs

    def go() -> object:
        kernels.beam_select_runs = lambda device: False  # type: ignore[assignment]
        try:
            return fn()
        finally:
            kernels.beam_select_runs = real  # type: ignore[assignment]

    return go


def with_native_f32(make: Callable[[], object]) -> object:
    """``make()`` with float32 projections on our kernel whatever the CPU's vendor."""
    from transduce.kernels import projection

    real = projection.use_native_f32
    projection.use_native_f32 = lambda matmul, weight: True  # type: ignore[assignment]
    try:
        return make()
    finally:
        projection.use_native_f32 = real  # type: ignore[assignment]


def without_amx(make: Callable[[], object]) -> object:
    """``make()`` with the int8 projections made without the AMX kernel (oneDNN's and fbgemm's)."""
    from transduce.kernels import projection

    real = projection.amx_int8_available
    projection.amx_int8_available = lambda: False  # type: ignore[assignment]
    try:
        return make()
    finally:
        projection.amx_int8_available = real  # type: ignore[assignment]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(decode.SIZES), default=["small", "base"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--parts",
        nargs="+",
        choices=["operators", "searches", "training"],
        default=["operators", "searches", "training"],
        help="which parts to time (default: all)",
    )
    args = p.parse_args()
    from transduce.kernels import native
    from transduce.runtime import tune_malloc

    tune_malloc()
    torch.set_num_threads(args.threads)
    if not native.available():
        raise SystemExit("native_kernels.py: the native kernels did not build here")
    result: dict = {"machine": platform.processor() or platform.machine(), "threads": args.threads}
    if "operators" in args.parts:
        result["operators"] = operators(args.rounds)
    if "searches" in args.parts:
        for name in args.sizes:
            result[name] = searches(name, args.rounds)
    if "training" in args.parts:
        result["training"] = training_operators(args.rounds)
        for name in args.sizes:
            result["training"].update(train_steps(name, args.rounds))
    print(f"{'what':40s} {'native ms':>10s} {'torch ms':>10s} {'speedup':>8s}")
    for section in ("operators", *args.sizes, "training"):
        for key, r in result.get(section, {}).items():
            flag = "" if r.get("same_outputs", True) else "  OUTPUTS DIFFER"
            print(
                f"{key:40s} {r['native_ms']:10.3f} {r['torch_ms']:10.3f} {r['speedup']:8.3f}{flag}"
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

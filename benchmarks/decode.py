"""Decoding speed: transduce against Hugging Face MarianMTModel and CTranslate2, same weights.

    python benchmarks/decode.py [--threads 2] [--repeats 3] [--quick] [--int8] [--sizes small base]

Needs ``pip install -e '.[bench]'`` (transformers, ctranslate2). Models, with random weights
(seeded), copied into the other two systems:

    SMALL  d_model 256, 3+3 layers, 4 heads, d_ff 1024, shared vocabulary 8000
    BASE   the paper's base model (d_model 512, 6+6 layers, 8 heads, d_ff 2048), vocabulary 37000

    transduce  ``greedy_search`` / ``beam_search`` (alpha 0.6) on the key/value cache of a
               ``DecodingModel`` of the model (what ``Translator`` decodes with; made once,
               before timing, as ``Translator.load`` makes it)
    hf         ``MarianMTModel`` (post-norm, ReLU, scaled embeddings, tied embeddings, our
               interleaved sinusoidal table written into its position embeddings) ``generate``
    ct2        the folder of ``transduce export ctranslate2`` (float32), ``translate_batch``, in
               worker processes of their own that import only ctranslate2
               (benchmarks/paired_ct2.py), with CT2_FORCE_CPU_ISA set to the fastest ISA this
               CPU has that runs (AVX512, AVX2, ...), one worker for each matrix-product backend
               (Intel MKL, and oneDNN by CT2_USE_MKL=0); each of its figures is the faster
               backend's

Work, the same for every system, on ``--threads`` CPU threads (torch.set_num_threads /
CTranslate2 intra_threads): a batch of 32 sources of 20 tokens (19 random + EOS), and exactly 30
decoder steps per sentence: EOS is suppressed before that (transduce: a logits mask wrapped
around the model's ``decode``, then 29 tokens + the forced final EOS; hf: min_new_tokens =
max_new_tokens = 30; ct2: min_decoding_length = max_decoding_length = 30), PAD and BOS are never
generated (ours and ct2 mask both, Marian masks PAD). Timed: greedy and beam 4 on the batch, and
greedy on one sentence (latency). Every system is timed in the same rounds (``--repeats``, for
latency ``--latency-repeats``, after one warm-up call each): each round calls each system once,
the order rotated a round, with ``--settle`` seconds of sleep after every call (the CTranslate2
workers answer one call a request: ``paired_ct2``). Each figure is a system's median; each ratio
is the median of the per-round ratios, so drift of a shared machine between rounds cancels.
Before timing, hf's and ct2's per-token log-probabilities on a fixed pair are checked
against ours, so the three really run the same model (a CTranslate2 backend outside the check is
left out of the figures, said on stderr).

Prints a table per model and ends with one JSON line: per system sentences/s and tokens/s
(sentences x 30 / seconds) and latency, and the ratios ``small_beam4_vs_hf``,
``small_beam4_vs_ct2``, ``base_beam4_vs_hf``, ``base_beam4_vs_ct2``, ``*_greedy_vs_*`` (our
throughput over theirs: > 1 means transduce is faster) and ``small_b1_latency_vs_ct2``,
``small_b1_latency_vs_hf`` (our latency over theirs: < 1 means transduce is faster).
``--quick`` times SMALL only (one repeat) and leaves the BASE ratios null; ``--sizes`` names the
sizes timed (the others' beam-4 ratios null, their other keys absent).

``--int8`` adds two systems on the same weights: ``transduce_int8`` (the ``DecodingModel`` with
int8 projections, ``--precision int8``) and ``ct2_int8`` (the same CTranslate2 folder loaded
with compute_type="int8", CTranslate2's int8 weights and dynamically quantised activations),
their log-probabilities on the fixed pair checked against ours within ``INT8_CHECK_TOL``
(CTranslate2's within ``INT8_CHECK_TOL_NO_DOT`` on a CPU without int8 dot products), and
the ratios ``small_beam4_int8_vs_ct2_int8``, ``base_beam4_int8_vs_ct2_int8``,
``*_greedy_int8_vs_ct2_int8``, ``small_b1_latency_int8_vs_ct2_int8`` (ours int8 against theirs)
and ``*_beam4_int8_vs_fp32``, ``*_greedy_int8_vs_fp32``, ``*_b1_latency_int8_vs_fp32`` (ours
int8 against ours float32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_ct2 import (  # noqa: E402  (benchmarks/paired_ct2.py)
    SETTLE_S,
    Ct2Failed,
    Ct2Server,
    paired_ratio,
    time_in_turns,
    timed,
)

BATCH, SRC_LEN, STEPS, BEAM, ALPHA = 32, 20, 30, 4, 0.6
SIZES = {
    "small": {
        "n_layers": 3,
        "d_model": 256,
        "n_heads": 4,
        "d_k": 64,
        "d_v": 64,
        "d_ff": 1024,
        "vocab": 8000,
    },
    "base": {
        "n_layers": 6,
        "d_model": 512,
        "n_heads": 8,
        "d_k": 64,
        "d_v": 64,
        "d_ff": 2048,
        "vocab": 37000,
    },
}
ISAS = ("AVX512", "AVX2", "AVX", "GENERIC")
# The /proc/cpuinfo flags each ISA needs (CTranslate2 exits with "The CPU does not support ..."
# when forced to one the CPU lacks): those are not tried
ISA_FLAGS = {
    "AVX512": ("avx512f", "avx512bw", "avx512vl"),
    "AVX2": ("avx2", "fma"),
    "AVX": ("avx",),
}


def cpu_isas() -> tuple[str, ...]:
    """``ISAS`` that this CPU has, fastest first (all of them where /proc/cpuinfo has no flags:
    each is then tried until one runs)."""
    from transduce.kernels.quantized import cpu_flags

    flags = cpu_flags()
    if not flags:
        return ISAS
    return tuple(i for i in ISAS if all(f in flags for f in ISA_FLAGS.get(i, ())))


# The largest difference in a token's log-probability from our float32 model that an int8
# system may show on the fixed pair (random weights: flat distributions, small differences)
INT8_CHECK_TOL = 0.5
# The same for CTranslate2's int8 on a CPU without int8 dot products (no VNNI, no AMX): there
# its int8 products (both backends) sum pairs in 16 bits and saturate; on an AMD Zen 3 it was
# 0.55 (SMALL) and 0.83 (the tests' tiny model) off. The float32 check of the same folder has
# already shown that the export is our model, so this one only bounds CTranslate2's quantisation.
INT8_CHECK_TOL_NO_DOT = 1.5


def ct2_int8_tol() -> float:
    """``INT8_CHECK_TOL``, or ``INT8_CHECK_TOL_NO_DOT`` on a CPU without int8 dot products."""
    from transduce.kernels.quantized import cpu_int8_flags

    return INT8_CHECK_TOL if cpu_int8_flags() else INT8_CHECK_TOL_NO_DOT


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- CTranslate2, in its own process (no torch) -----------------------------------------------


# CTranslate2's CPU matrix-product backends: Intel MKL (its default where MKL runs) and oneDNN.
# Neither is faster everywhere: on a 2-vCPU Intel VM (AMX) MKL with 2 threads took 150 ms for the
# batch-1 greedy job that oneDNN did in 15 ms, so every figure takes the faster of the two.
CT2_BACKENDS = {"mkl": {}, "dnnl": {"CT2_USE_MKL": "0"}}
JOBS = ("greedy", "beam4", "b1")


def ct2_process(spec: str, env: dict[str, str], timeout: float, script: str) -> dict | None:
    """Run ``script --ct2-worker spec`` (a benchmark with a one-shot CTranslate2 worker of its
    own: step_cost.py) with ``env`` added; its JSON line, or None if it failed (said on
    stderr). decode.py's own workers answer call by call instead (``start_ct2``)."""
    proc = subprocess.run(
        [sys.executable, script, "--ct2-worker", spec],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"ct2 with {env} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}", file=sys.stderr
    )
    return None


def ct2_jobs(tokens: list[list[str]]) -> dict[str, dict]:
    """The CTranslate2 worker's jobs on the batch ``tokens``: greedy and beam 4 on it, greedy on
    its first sentence, each exactly ``STEPS`` tokens."""
    options = {
        "min_decoding_length": STEPS,
        "max_decoding_length": STEPS,
        "length_penalty": ALPHA,
        "suppress_sequences": [["<pad>"], ["<s>"]],
    }
    return {
        "greedy": {"batch": tokens, "options": {**options, "beam_size": 1}},
        "beam4": {"batch": tokens, "options": {**options, "beam_size": BEAM}},
        "b1": {"batch": tokens[:1], "options": {**options, "beam_size": 1}},
    }


def start_ct2(
    model_dir: str,
    jobs: dict[str, dict],
    check: dict,
    args: argparse.Namespace,
    compute_type: str = "default",
    ref: Any = None,
    tol: float = 1e-3,
) -> tuple[str, dict[str, Any]]:
    """CTranslate2 workers (``paired_ct2.Ct2Server``) for ``jobs`` (name -> batch and options,
    as ``ct2_jobs`` makes them) on the fastest ISA that starts, one per matrix-product backend
    that computes our model: ``check``'s log-probabilities within ``tol`` of ``ref`` (a tensor;
    None: no check). A backend outside it is closed, said on stderr (on an AMD Zen 3, AVX2
    without VNNI, CTranslate2's int8 through MKL was 0.55-0.83 off on random weights); a
    RuntimeError where none is within it. Returns the ISA and the servers by backend."""
    spec = {
        "model_dir": model_dir,
        "threads": args.threads,
        "compute_type": compute_type,
        "check": check,
        "jobs": jobs,
    }
    for isa in cpu_isas():
        base = {"CT2_FORCE_CPU_ISA": isa, "OMP_NUM_THREADS": str(args.threads)}
        servers: dict[str, Any] = {}
        for name, env in CT2_BACKENDS.items():
            try:
                servers[name] = Ct2Server(spec, {**base, **env}, args.timeout)
            except Ct2Failed as e:
                print(f"ct2 {compute_type} {name} on {isa} failed: {e}", file=sys.stderr)
        if not servers:
            continue
        if ref is not None:
            runs = {name: dict(s.info) for name, s in servers.items()}
            try:
                kept = same_model(runs, ref, tol, f"ct2 {compute_type} on {isa}")
            except RuntimeError:
                for s in servers.values():
                    s.close()
                raise
            for name in list(servers):
                if name in kept:
                    servers[name].info["check_max_abs_diff"] = kept[name]["check_max_abs_diff"]
                else:
                    servers.pop(name).close()
        return isa, servers
    raise RuntimeError("CTranslate2 failed with every ISA")


def ct2_result(
    isa: str,
    servers: dict[str, Any],
    times: dict[str, dict[str, list[float]]],
    suffix: str = "_s",
) -> dict:
    """One CTranslate2 system from its backends' per-round ``times`` (backend -> job -> seconds):
    each job's figure (key: the job's name + ``suffix``), its rounds (+ "_times") and its backend
    are the faster backend's (by median)."""
    first = next(iter(servers.values())).info
    res: dict[str, Any] = {
        "isa": isa,
        "backend": {},
        "ctranslate2": first["ctranslate2"],
        "torch_imported": first["torch_imported"],
        "lengths": sorted(set().union(*(s.lengths for s in servers.values()))),
        "backend_times": {
            name: {f"{job}{suffix}": statistics.median(t) for job, t in by_job.items()}
            for name, by_job in times.items()
        },
    }
    for job in next(iter(times.values())):
        best = min(times, key=lambda name: statistics.median(times[name][job]))
        res[f"{job}{suffix}"] = statistics.median(times[best][job])
        res[f"{job}_times"] = times[best][job]
        res["backend"][f"{job}{suffix}"] = best
        if "check_max_abs_diff" in servers[best].info:
            res["check_max_abs_diff"] = servers[best].info["check_max_abs_diff"]
    return res


def time_with_ct2(
    runs: dict[str, dict[str, Any]],
    ct2_systems: dict[str, tuple[str, dict[str, Any]]],
    rounds: dict[str, int],
    args: argparse.Namespace,
    suffix: str = "_s",
    label: str = "",
) -> dict[str, dict]:
    """Time ``runs`` (system -> job -> a function returning its seconds) and the CTranslate2
    workers of ``ct2_systems`` (system -> (ISA, servers by backend), from ``start_ct2``) in the
    same rounds (``paired_ct2.time_in_turns``; ``rounds``: job -> rounds), then close the
    workers. Each system's result: per job its median (key: job + ``suffix``) and its rounds
    (job + "_times"); a CTranslate2 system's from its faster backend (``ct2_result``)."""
    try:
        for system, (_, servers) in ct2_systems.items():
            for backend, server in servers.items():
                runs[f"{system}:{backend}"] = {j: (lambda s=server, j=j: s.run(j)) for j in rounds}
        times = time_in_turns(runs, rounds, args.settle, label)
    finally:
        for _, servers in ct2_systems.values():
            for server in servers.values():
                server.close()
    results: dict[str, dict] = {}
    for name in runs:
        if ":" not in name:
            results[name] = {
                **{f"{job}{suffix}": statistics.median(times[name][job]) for job in rounds},
                **{f"{job}_times": times[name][job] for job in rounds},
            }
    for system, (isa, servers) in ct2_systems.items():
        by_backend = {b: times[f"{system}:{b}"] for b in servers}
        results[system] = ct2_result(isa, servers, by_backend, suffix)
    return results


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    """The CTranslate2 workers' ``--timeout`` and the rounds' ``--settle``."""
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds a ct2 worker may take for a call"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help="seconds of sleep after each timed call (default: %(default)s)",
    )


def same_model(runs: dict[str, dict], ref: Any, tol: float, what: str) -> dict[str, dict]:
    """The ``runs`` (backend -> a worker's JSON) whose ``check_log_probs`` are within ``tol`` of
    ``ref``, each with its ``check_max_abs_diff``; the others said on stderr; a RuntimeError
    naming every difference where none is within."""
    import torch

    for r in runs.values():
        r["check_max_abs_diff"] = float((torch.tensor(r.pop("check_log_probs")) - ref).abs().max())
    kept = {name: r for name, r in runs.items() if r["check_max_abs_diff"] <= tol}
    diffs = ", ".join(f"{name} {r['check_max_abs_diff']:.3g}" for name, r in runs.items())
    if not kept:
        raise RuntimeError(f"{what} does not compute our model (within {tol}): {diffs}")
    if len(kept) < len(runs):
        print(f"{what}: only {', '.join(kept)} within {tol} of ours ({diffs})", file=sys.stderr)
    return kept


# -- transduce and Hugging Face (this process) --------------------------------------------------


class SuppressEarlyEOS:
    """Our model with EOS masked at output positions before ``min_len``: a logits processor on
    the decoding contract (encode / new_cache / decode), as HF's min_new_tokens is."""

    training = False

    def __init__(self, model, min_len: int) -> None:
        self.model, self.min_len = model, min_len

    def encode(self, src):
        return self.model.encode(src)

    def new_cache(self):
        return self.model.new_cache()

    def decode(self, tgt, memory, src_valid, cache):
        from transduce.data.vocab import EOS

        position = cache.length  # the output position these logits are for
        logits = self.model.decode(tgt, memory, src_valid, cache)
        if position < self.min_len:
            logits[..., EOS] = float("-inf")
        return logits


def build_ours(size: dict):
    import torch

    from transduce.config import from_dict
    from transduce.model.transformer import make_model

    cfg = from_dict({"model": {k: v for k, v in size.items() if k != "vocab"} | {"dropout": 0.0}})
    torch.manual_seed(0)
    return make_model(cfg.model, src_vocab_size=size["vocab"]).eval()


def build_hf(ours, size: dict):
    """MarianMTModel holding exactly our weights."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    from transduce.model.positions import positional_table

    d, h = size["d_model"], size["n_heads"]
    if size["d_k"] * h != d or size["d_v"] != size["d_k"]:
        raise ValueError("Marian needs d_k = d_v = d_model / n_heads")
    cfg = MarianConfig(
        vocab_size=size["vocab"],
        d_model=d,
        encoder_layers=size["n_layers"],
        decoder_layers=size["n_layers"],
        encoder_attention_heads=h,
        decoder_attention_heads=h,
        encoder_ffn_dim=size["d_ff"],
        decoder_ffn_dim=size["d_ff"],
        activation_function="relu",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=1024,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        forced_eos_token_id=None,
    )
    hf = MarianMTModel(cfg).eval()

    def copy_linear(dst, src) -> None:
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)

    def copy_attention(dst, src) -> None:
        for a, b in (("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("out_proj", "w_o")):
            copy_linear(getattr(dst, a), getattr(src, b))

    with torch.no_grad():
        hf.model.shared.weight.copy_(ours.encoder.embed.weight)
        table = positional_table(1024, d)
        for side in (hf.model.encoder, hf.model.decoder):
            side.embed_positions.weight.copy_(table)
        for dst, src in zip(hf.model.encoder.layers, ours.encoder.layers, strict=True):
            copy_attention(dst.self_attn, src.self_attn)
            copy_linear(dst.self_attn_layer_norm, src.norms[0])
            copy_linear(dst.fc1, src.ffn.w_1)
            copy_linear(dst.fc2, src.ffn.w_2)
            copy_linear(dst.final_layer_norm, src.norms[1])
        for dst, src in zip(hf.model.decoder.layers, ours.decoder.layers, strict=True):
            copy_attention(dst.self_attn, src.self_attn)
            copy_linear(dst.self_attn_layer_norm, src.norms[0])
            copy_attention(dst.encoder_attn, src.cross_attn)
            copy_linear(dst.encoder_attn_layer_norm, src.norms[1])
            copy_linear(dst.fc1, src.ffn.w_1)
            copy_linear(dst.fc2, src.ffn.w_2)
            copy_linear(dst.final_layer_norm, src.norms[2])
        hf.final_logits_bias.zero_()
        if hf.lm_head.weight.data_ptr() != hf.model.shared.weight.data_ptr():
            hf.lm_head.weight.copy_(ours.generator.weight)
        for emb in (hf.model.encoder.embed_tokens, hf.model.decoder.embed_tokens):
            if emb.weight.data_ptr() != hf.model.shared.weight.data_ptr():
                emb.weight.copy_(ours.encoder.embed.weight)
    return hf


def bench_size(size_name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from transduce.data.vocab import BOS, EOS, SPECIALS
    from transduce.export.ctranslate2 import export_model
    from transduce.inference import beam_search, greedy_search
    from transduce.inference.engine import DecodingModel

    size = SIZES[size_name]
    ours = build_ours(size)
    hf = build_hf(ours, size)
    g = torch.Generator().manual_seed(1)
    body = torch.randint(4, size["vocab"], (BATCH, SRC_LEN - 1), generator=g)
    src = torch.cat([body, torch.full((BATCH, 1), EOS)], 1)  # (32, 20), no padding
    single = src[:1]
    tokens = [*SPECIALS, *(f"t{i}" for i in range(4, size["vocab"]))]

    # The same model three times: per-token log-probabilities of a fixed pair.
    tgt = torch.randint(4, size["vocab"], (12,), generator=g).tolist()
    with torch.no_grad():
        logits = ours(single, torch.tensor([[BOS, *tgt]]))[0]
        ref = logits.log_softmax(-1)[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])]
        hf_logits = hf(input_ids=single, decoder_input_ids=torch.tensor([[BOS, *tgt]])).logits[0]
        hf_lp = hf_logits.log_softmax(-1)[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])]
    check = {"source": [tokens[i] for i in body[0].tolist()], "target": [tokens[i] for i in tgt]}

    torch.set_num_threads(args.threads)

    def ours_run(x, beam, wrapped, lengths):
        def go():
            if beam == 1:
                out = greedy_search(wrapped, x, max_len=STEPS - 1)
            else:
                out = [
                    h[0].tokens
                    for h in beam_search(wrapped, x, beam=beam, alpha=ALPHA, max_len=STEPS - 1)
                ]
            lengths.update(len(t) + 1 for t in out)  # + the final EOS

        return go

    def hf_run(x, beam):
        def go():
            with torch.no_grad():
                out = hf.generate(  # noqa: F821 (deleted only after the runs)
                    input_ids=x,
                    attention_mask=x.ne(0),
                    num_beams=beam,
                    do_sample=False,
                    min_new_tokens=STEPS,
                    max_new_tokens=STEPS,
                    length_penalty=ALPHA,
                    early_stopping=False,
                    decoder_start_token_id=BOS,
                    pad_token_id=0,
                    eos_token_id=EOS,
                    forced_eos_token_id=None,
                )
            lengths["hf"].add(out.size(1) - 1)  # minus the decoder start token

        return go

    inputs = {"greedy": (src, 1), "beam4": (src, BEAM), "b1": (single, 1)}
    lengths: dict[str, set[int]] = {}
    # system -> job -> a function that runs the job once and returns its seconds
    runs: dict[str, dict[str, Any]] = {}
    checks: dict[str, float] = {}

    def add_ours(name: str, engine) -> None:
        lengths[name] = set()
        steps = SuppressEarlyEOS(engine, STEPS - 1)
        runs[name] = {
            j: timed(ours_run(x, b, steps, lengths[name])) for j, (x, b) in inputs.items()
        }

    add_ours("transduce", DecodingModel(ours))
    if args.int8:
        int8 = DecodingModel(ours, int8=True)
        with torch.no_grad():  # whole-target decoding runs the int8 steps
            memory, valid = int8.encode(single)
            logits = int8.decode(torch.tensor([[BOS, *tgt]]), memory, valid)[0]
            lp = logits.log_softmax(-1)[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])]
        add_ours("transduce_int8", int8)
        checks["transduce_int8"] = float((lp - ref).abs().max())
    lengths["hf"] = set()
    runs["hf"] = {j: timed(hf_run(x, b)) for j, (x, b) in inputs.items()}
    checks["hf"] = float((hf_lp - ref).abs().max())

    print(f"[{size_name}] exporting, starting ct2 ...", file=sys.stderr, flush=True)
    ct2_systems: dict[str, tuple[str, dict[str, Any]]] = {}
    rounds = {j: args.latency_repeats if j == "b1" else args.repeats for j in JOBS}
    with tempfile.TemporaryDirectory() as tmp:
        export_model(ours, tokens, Path(tmp) / "ct2", max_positions=1024)
        batch_tokens = [[tokens[i] for i in row] for row in body.tolist()]
        model_dir = str(Path(tmp) / "ct2")
        jobs = ct2_jobs(batch_tokens)
        try:
            ct2_systems["ct2"] = start_ct2(model_dir, jobs, check, args, ref=ref)
            if args.int8:
                ct2_systems["ct2_int8"] = start_ct2(
                    model_dir, jobs, check, args, "int8", ref=ref, tol=ct2_int8_tol()
                )
        except BaseException:
            for _, servers in ct2_systems.values():
                for server in servers.values():
                    server.close()
            raise
        results = time_with_ct2(runs, ct2_systems, rounds, args, label=f"[{size_name}] ")
    del hf
    for name, r in results.items():
        if name in lengths:
            r["lengths"] = sorted(lengths[name])
        if name in checks:
            r["check_max_abs_diff"] = checks[name]
    for name, r in results.items():
        if r["lengths"] != [STEPS]:
            raise RuntimeError(f"{name} did not generate exactly {STEPS} tokens: {r['lengths']}")
        tol = {"ct2_int8": ct2_int8_tol(), "transduce_int8": INT8_CHECK_TOL}.get(name, 1e-3)
        if r.get("check_max_abs_diff", 0.0) > tol:
            raise RuntimeError(f"{name} does not compute our model: {r['check_max_abs_diff']}")
        r["greedy_sent_s"] = BATCH / r["greedy_s"]
        r["greedy_tok_s"] = BATCH * STEPS / r["greedy_s"]
        r["beam4_sent_s"] = BATCH / r["beam4_s"]
        r["beam4_tok_s"] = BATCH * STEPS / r["beam4_s"]
        r["b1_latency_ms"] = 1000 * r["b1_s"]
    return {"size": size, "systems": results}


def print_table(name: str, res: dict, threads: int) -> None:
    s = res["size"]
    print(
        f"\n{name.upper()}: d_model {s['d_model']}, {s['n_layers']}+{s['n_layers']} layers, "
        f"{s['n_heads']} heads, d_ff {s['d_ff']}, vocab {s['vocab']}; batch {BATCH} x "
        f"{SRC_LEN} source tokens, {STEPS} steps, {threads} threads"
    )
    print(
        f"{'system':14} {'greedy sent/s':>14} {'tok/s':>9} {'beam4 sent/s':>13} {'tok/s':>9} "
        f"{'b1 greedy ms':>13}"
    )
    for system, r in res["systems"].items():
        print(
            f"{system:14} {r['greedy_sent_s']:14.1f} {r['greedy_tok_s']:9.0f} "
            f"{r['beam4_sent_s']:13.1f} {r['beam4_tok_s']:9.0f} {r['b1_latency_ms']:13.1f}"
        )
    for name in ("ct2", "ct2_int8"):
        if name not in res["systems"]:
            continue
        print(
            f"{name} seconds by backend (the faster one is used): "
            + "; ".join(
                f"{b}: " + ", ".join(f"{k[:-2]} {v:.3f}" for k, v in t.items())
                for b, t in res["systems"][name]["backend_times"].items()
            )
        )


def ratio(ours: dict, theirs: dict, job: str) -> float:
    """Ours against theirs on ``job``: throughput (their seconds over ours: > 1, ours faster),
    and for "b1" latency (our seconds over theirs: < 1, ours faster). The median of the
    per-round ratios where both were timed in the same rounds, else of the medians."""
    a, b = ours.get(f"{job}_times"), theirs.get(f"{job}_times")
    if a and b and len(a) == len(b):
        return paired_ratio(a, b) if job == "b1" else paired_ratio(b, a)
    if job == "b1":
        return ours["b1_s"] / theirs["b1_s"]
    return ours[f"{job}_sent_s"] / theirs[f"{job}_sent_s"]


def ratios(name: str, res: dict) -> dict[str, float]:
    sys_ = res["systems"]
    ours = sys_["transduce"]
    out = {}
    for other in ("hf", "ct2"):
        out[f"{name}_beam4_vs_{other}"] = ratio(ours, sys_[other], "beam4")
        out[f"{name}_greedy_vs_{other}"] = ratio(ours, sys_[other], "greedy")
        out[f"{name}_b1_latency_vs_{other}"] = ratio(ours, sys_[other], "b1")
    int8 = sys_.get("transduce_int8")
    for other, theirs in (("ct2_int8", sys_.get("ct2_int8")), ("fp32", ours)):
        if int8 is None or theirs is None:
            continue
        out[f"{name}_beam4_int8_vs_{other}"] = ratio(int8, theirs, "beam4")
        out[f"{name}_greedy_int8_vs_{other}"] = ratio(int8, theirs, "greedy")
        out[f"{name}_b1_latency_int8_vs_{other}"] = ratio(int8, theirs, "b1")
    return out


INT8_KEYS = (
    "small_beam4_int8_vs_ct2_int8",
    "base_beam4_int8_vs_ct2_int8",
    "small_b1_latency_int8_vs_ct2_int8",
    "small_beam4_int8_vs_fp32",
    "base_beam4_int8_vs_fp32",
    "small_b1_latency_int8_vs_fp32",
)


def _round(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) else v


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark (``argv``: the command line; None: sys.argv); returns the summary
    it printed as the last JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--latency-repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="SMALL only, one repeat")
    parser.add_argument(
        "--sizes", nargs="+", choices=("small", "base"), help="the sizes timed (default both)"
    )
    parser.add_argument(
        "--int8", action="store_true", help="also ours int8 and CTranslate2 int8 (see above)"
    )
    add_timing_options(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.latency_repeats = 1, 3

    import torch
    import transformers

    from transduce.runtime import tune_malloc

    tune_malloc()
    transformers.logging.set_verbosity_error()
    from transduce.kernels.quantized import cpu_int8_flags

    if args.int8 and not cpu_int8_flags():
        print(
            "note: this CPU has no int8 dot products (no VNNI, no AMX): `--precision int8` is "
            "refused here unless forced; both int8 systems are timed all the same",
            file=sys.stderr,
        )
    sizes = args.sizes or (["small"] if args.quick else ["small", "base"])
    all_res = {name: bench_size(name, args) for name in sizes}
    summary: dict[str, Any] = {"benchmark": "decode", "quick": args.quick, "threads": args.threads}
    for name in ("small", "base"):
        if name in all_res:
            print_table(name, all_res[name], args.threads)
            summary.update(ratios(name, all_res[name]))
        else:
            summary.update({f"{name}_beam4_vs_hf": None, f"{name}_beam4_vs_ct2": None})
            if args.int8:
                summary[f"{name}_beam4_int8_vs_ct2_int8"] = None
                summary[f"{name}_beam4_int8_vs_fp32"] = None
    print()
    for key in (
        "small_beam4_vs_hf",
        "small_beam4_vs_ct2",
        "base_beam4_vs_hf",
        "base_beam4_vs_ct2",
        "small_b1_latency_vs_ct2",
        *(INT8_KEYS if args.int8 else ()),
    ):
        v = summary.get(key)
        print(f"{key:34} {'-' if v is None else f'{v:.2f}'}")
    ct2_any = next(iter(all_res.values()))["systems"]["ct2"]
    summary.update(
        {
            "systems": {
                name: {
                    s: {k: _round(v) for k, v in r.items() if k != "lengths"}
                    for s, r in res["systems"].items()
                }
                for name, res in all_res.items()
            },
            "ct2_isa": ct2_any["isa"],
            "ct2_torch_imported": ct2_any["torch_imported"],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ctranslate2": ct2_any["ctranslate2"],
            "machine": platform.processor() or platform.machine(),
            "cpu_int8_dot": list(cpu_int8_flags()),
            "repeats": args.repeats,
        }
    )
    summary = {k: _round(v) for k, v in summary.items()}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

"""Decoding an OPUS-MT-sized Marian model: transduce (its import) against Hugging Face and
CTranslate2 (its own Marian converter), all three from one ``MarianMTModel`` folder.

    python benchmarks/decode_marian.py [--threads 2] [--repeats 3] [--quick] [--int8]

Needs ``pip install -e '.[bench]'`` (transformers, ctranslate2, sentencepiece). The model, built
here with random seeded weights (nothing from a hub), has OPUS-MT en-de's shape:

    OPUS   d_model 512, 6+6 layers, 8 heads, d_ff 2048, swish, vocabulary 58,101
    QUICK  d_model 64, 2+2 layers, 4 heads, d_ff 256, vocabulary 2,000 (``--quick``)

with static sinusoids, scale_embedding, tied (shared) embeddings, a nonzero final_logits_bias,
and OPUS-MT's vocabulary layout (``</s>`` 0, ``<unk>`` 1, pieces, ``<pad>`` last, the pad id as
the decoder's start, its embedding row and bias zero as the OPUS-MT conversion writes them). The
folder is ``MarianMTModel.save_pretrained`` plus a ``MarianTokenizer`` (source.spm and
target.spm trained here on a synthetic corpus; vocab.json padded with made-up pieces).

    transduce  ``import_marian`` of the folder, loaded, then ``greedy_search`` / ``beam_search``
               (alpha 0.6) on a ``DecodingModel`` of it, as benchmarks/decode.py times it
    hf         the folder's ``MarianMTModel`` ``generate`` (greedy, num_beams=4)
    ct2        ``ctranslate2.converters.TransformersConverter(folder)`` (float32), then
               ``translate_batch`` in worker processes that import no torch, as decode.py
               runs them (benchmarks/paired_ct2.py; the fastest ISA that works, a worker for
               each of Intel MKL and oneDNN, each figure the faster one's)

The work is decode.py's: ``--threads`` CPU threads (torch.set_num_threads / intra_threads),
sources of 20 tokens (19 random pieces + ``</s>``), exactly 30 decoder steps per sentence (EOS
suppressed until then). Timed: greedy and beam 4 on a batch of 32, and on one sentence
(latency), every system in the same rounds as decode.py times them (``--repeats`` rounds,
``--latency-repeats`` for one sentence, after a warm-up call each; ``--settle`` seconds of sleep
after each call): each figure a system's median, each ratio the median of the rounds' ratios. No
system generates its padding token (ours: PAD and BOS; hf: ``<pad>``, the folder's
bad_words_ids; ct2's vocabulary has neither, so its jobs suppress no tokens: CTranslate2 refuses
unknown ones). decode.py's constants, EOS suppression wrapper, CTranslate2 ISAs, backends and
workers are imported from it.

Before timing, the three are checked to compute the same model: per-token log-probabilities of a
fixed pair (the target + ``</s>``) within 1e-3 of transduce's. The systems' ids differ (the
import puts PAD, BOS, EOS, UNK first and adds a BOS row; CTranslate2 takes pieces), so the pair
is drawn as pieces and mapped. CTranslate2's converter drops ``<pad>`` from the vocabulary
(Marian's own has none), so every log-probability here is over the vocabulary without it.

Prints a table and ends with one JSON line: per system the times, and the ratios
``opus_beam4_b32_vs_hf``, ``opus_beam4_b32_vs_ct2``, ``opus_greedy_b32_vs_*`` (our throughput
over theirs: > 1 means transduce is faster) and ``opus_beam4_b1_latency_vs_*``,
``opus_greedy_b1_latency_vs_*`` (our latency over theirs: < 1 means transduce is faster).

``--int8`` adds ours with int8 projections (``DecodingModel(int8=True)``, ``--precision int8``)
and CTranslate2 with compute_type="int8" on the same converted folder (what CTranslate2's
published OPUS-MT benchmark runs), their log-probabilities checked within ``INT8_CHECK_TOL``
(a CTranslate2 backend outside it left out), and the ratios ``opus_*_int8_vs_ct2_int8`` (ours
int8 against theirs) and ``opus_*_int8_vs_fp32`` (ours int8 against our float32).
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402  (benchmarks/decode.py: the timing machinery shared with it)
from decode import ALPHA, BATCH, BEAM, SRC_LEN, STEPS  # noqa: E402
from paired_ct2 import paired_ratio, timed  # noqa: E402

SIZES = {
    "opus": {"d_model": 512, "layers": 6, "heads": 8, "d_ff": 2048, "vocab": 58101},
    "quick": {"d_model": 64, "layers": 2, "heads": 4, "d_ff": 256, "vocab": 2000},
}
CHECK_TOL = 1e-3
# The largest log-probability difference an int8 system may show on the check pair here: this
# model's random weights over 58,101 pieces gave 0.40 (ours) and 0.49 (CTranslate2) on an Intel
# AMX CPU, against decode.py's 0.5 for its models. The float32 check (CHECK_TOL) has shown the
# three compute the same model; this one only bounds int8's quantisation (a wrong model is off
# by several nats)
INT8_CHECK_TOL = 1.0
FIGURES = ("greedy_b32", "beam4_b32", "greedy_b1", "beam4_b1")
WORDS = [
    "the",
    "a",
    "dog",
    "cat",
    "man",
    "woman",
    "runs",
    "sits",
    "on",
    "in",
    "red",
    "blue",
    "big",
    "small",
    "park",
    "street",
    "ball",
]


# -- the Marian folder ----------------------------------------------------------------------------


def _train_spm(lines: list[str], size: int) -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=size,
        model_type="unigram",
        minloglevel=2,
    )
    return out.getvalue()


def _vocab(source: bytes, target: bytes, size: int) -> dict[str, int]:
    """OPUS-MT's layout: ``</s>`` 0, ``<unk>`` 1, both models' pieces, made-up pieces up to
    ``size``, ``<pad>`` last."""
    import sentencepiece as spm

    vocab = {"</s>": 0, "<unk>": 1}
    for proto in (source, target):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    filler = (f"\u2581w{i}" for i in range(size))
    while len(vocab) < size - 1:
        vocab.setdefault(next(filler), len(vocab))
    vocab["<pad>"] = size - 1
    return vocab


def make_folder(folder: Path, size: dict[str, int], seed: int = 0) -> Path:
    """Write an OPUS-MT-shaped MarianMTModel + MarianTokenizer folder with random weights."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 7))) for _ in range(300)]
    source, target = _train_spm(src, 40), _train_spm([s.upper()[::-1] for s in src], 40)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    vocab = _vocab(source, target, size["vocab"])
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    v, d = size["vocab"], size["d_model"]
    pad = v - 1
    cfg = MarianConfig(
        vocab_size=v,
        d_model=d,
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["d_ff"],
        decoder_ffn_dim=size["d_ff"],
        activation_function="swish",
        scale_embedding=True,
        static_position_embeddings=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        max_position_embeddings=512,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        init_std=2.0 / d**0.5,  # logits of standard deviation about 2: a sharp check
    )
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
        # OPUS-MT's conversion appends <pad> with a zero embedding and a zero bias; Marian (and
        # CTranslate2, start_from_zero_embedding) starts decoding from a zero vector
        model.final_logits_bias[0, pad] = 0.0
        model.model.shared.weight[pad] = 0.0
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad,
        eos_token_id=0,
        pad_token_id=pad,
        forced_eos_token_id=0,
        bad_words_ids=[[pad]],
        max_length=512,
        num_beams=4,
    )
    model.save_pretrained(str(folder))
    MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    ).save_pretrained(str(folder))
    return folder


# -- the three systems on one folder ------------------------------------------------------------


@dataclass
class Systems:
    """The folder's model in transduce (imported) and Hugging Face, and the id maps."""

    ours: Any  # the imported transduce model
    hf: Any  # MarianMTModel
    marian_ids: dict[str, int]  # vocab.json: piece -> Marian id
    our_ids: dict[str, int]  # piece -> transduce id

    def ids(self, pieces: list[str], ours: bool) -> list[int]:
        return [(self.our_ids if ours else self.marian_ids)[p] for p in pieces]


def load_systems(folder: Path, model_file: Path) -> Systems:
    from transformers import MarianMTModel

    from transduce.checkpoint import load_model
    from transduce.export.huggingface import import_marian

    import_marian(folder, model_file)
    ours, vocab, _ = load_model(model_file)
    hf = MarianMTModel.from_pretrained(str(folder)).eval()
    marian_ids = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    our_ids = {p: i for i, p in enumerate(vocab.pieces)}
    return Systems(ours, hf, marian_ids, our_ids)


def draw_pieces(systems: Systems, seed: int = 1) -> tuple[list[list[str]], list[str]]:
    """(BATCH sources of SRC_LEN - 1 ordinary pieces, one target of 12) for the timing and check
    (``</s>`` is appended where each system wants it)."""
    ordinary = [p for p in systems.marian_ids if p not in ("</s>", "<unk>", "<pad>")]
    rng = random.Random(seed)
    sources = [[rng.choice(ordinary) for _ in range(SRC_LEN - 1)] for _ in range(BATCH)]
    return sources, [rng.choice(ordinary) for _ in range(12)]


def ours_log_probs(systems: Systems, source: list[str], target: list[str]) -> list[float]:
    """transduce's log-probabilities of target + ``</s>`` (over the vocabulary without PAD)."""
    import torch

    from transduce.data.vocab import BOS, EOS, PAD

    src = torch.tensor([[*systems.ids(source, True), EOS]])
    tgt = systems.ids(target, True)
    with torch.no_grad():
        logits = systems.ours(src, torch.tensor([[BOS, *tgt]]))[0]  # (T + 1, V + 1)
    logits[:, PAD] = float("-inf")
    lp = logits.log_softmax(-1)
    return lp[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])].tolist()


def engine_log_probs(engine: Any, systems: Systems, source: list[str], target: list[str]) -> list:
    """``ours_log_probs`` through a ``DecodingModel`` (whole-target decoding: with int8 weights,
    its int8 steps)."""
    import torch

    from transduce.data.vocab import BOS, EOS, PAD

    src = torch.tensor([[*systems.ids(source, True), EOS]])
    tgt = systems.ids(target, True)
    with torch.no_grad():
        memory, valid = engine.encode(src)
        logits = engine.decode(torch.tensor([[BOS, *tgt]]), memory, valid)[0]  # (T + 1, V + 1)
    logits[:, PAD] = float("-inf")
    lp = logits.log_softmax(-1)
    return lp[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])].tolist()


def hf_log_probs(systems: Systems, source: list[str], target: list[str]) -> list[float]:
    """Hugging Face's log-probabilities of target + ``</s>`` (over the vocabulary without pad)."""
    import torch

    c = systems.hf.config
    src = torch.tensor([[*systems.ids(source, False), c.eos_token_id]])
    tgt = systems.ids(target, False)
    with torch.no_grad():
        out = systems.hf(input_ids=src, decoder_input_ids=torch.tensor([[c.pad_token_id, *tgt]]))
    logits = out.logits[0]  # (T + 1, V)
    logits[:, c.pad_token_id] = float("-inf")
    lp = logits.log_softmax(-1)
    return lp[torch.arange(len(tgt) + 1), torch.tensor([*tgt, c.eos_token_id])].tolist()


def max_diff(name: str, theirs: list[float], ref: list[float], tol: float = CHECK_TOL) -> float:
    """The largest log-probability difference; a RuntimeError past ``tol``."""
    if len(theirs) != len(ref):
        raise RuntimeError(f"{name} scored {len(theirs)} tokens, transduce {len(ref)}")
    diff = max(abs(a - b) for a, b in zip(theirs, ref, strict=True))
    if not diff <= tol:  # NaN fails too
        raise RuntimeError(
            f"{name} does not compute the imported model: log-probabilities differ by {diff:.3g}"
        )
    return diff


def convert_ct2(folder: Path, output: Path) -> Path:
    """CTranslate2's own converter for Transformers models, float32."""
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(str(folder))
    converter.convert(str(output), quantization="float32")
    return output


# -- timing --------------------------------------------------------------------------------------


def ours_runs(systems: Systems, sources: list[list[str]], engine: Any) -> tuple[dict, set[int]]:
    """decode.py's way, on ``engine`` (a ``DecodingModel`` of the import): EOS masked before the
    last step, 29 tokens + the forced final EOS. The four jobs (``FIGURES``, each a function
    returning its seconds) and the lengths they make."""
    import torch

    from transduce.data.vocab import EOS
    from transduce.inference import beam_search, greedy_search

    wrapped = decode.SuppressEarlyEOS(engine, STEPS - 1)
    src = torch.tensor([[*systems.ids(s, True), EOS] for s in sources])  # (32, 20), no padding
    lengths: set[int] = set()

    def run(x, beam):
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

    return _four(run, src), lengths


def hf_generate(hf: Any, src: Any, beam: int) -> Any:
    """``hf.generate`` of exactly STEPS tokens (the forced EOS at the limit off), greedy or beam
    search with decode.py's alpha; (N, 1 + STEPS) ids, the decoder start first."""
    import torch

    with torch.no_grad():
        return hf.generate(
            input_ids=src,
            attention_mask=torch.ones_like(src),
            num_beams=beam,
            do_sample=False,
            min_new_tokens=STEPS,
            max_new_tokens=STEPS,
            length_penalty=ALPHA,
            early_stopping=False,
            forced_eos_token_id=None,
        )


def hf_runs(systems: Systems, sources: list[list[str]]) -> tuple[dict, set[int]]:
    """``generate`` with min_new_tokens = max_new_tokens = 30 (the folder's generation config
    keeps ``<pad>`` out; the forced EOS at the length limit is switched off): the four jobs and
    the lengths they make."""
    import torch

    eos = systems.hf.config.eos_token_id
    src = torch.tensor([[*systems.ids(s, False), eos] for s in sources])
    lengths: set[int] = set()

    def run(x, beam):
        def go():
            out = hf_generate(systems.hf, x, beam)
            lengths.add(out.size(1) - 1)  # minus the decoder start token

        return go

    return _four(run, src), lengths


def _four(run, src) -> dict[str, Any]:
    """The four jobs of ``run(sources, beam)``, each a function returning its seconds."""
    return {
        "greedy_b32": timed(run(src, 1)),
        "beam4_b32": timed(run(src, BEAM)),
        "greedy_b1": timed(run(src[:1], 1)),
        "beam4_b1": timed(run(src[:1], BEAM)),
    }


def ct2_jobs(tokens: list[list[str]]) -> dict[str, dict]:
    """The CTranslate2 workers' four jobs (benchmarks/paired_ct2.py) on the pieces ``tokens``,
    each exactly ``STEPS`` tokens (no tokens suppressed: the converted vocabulary has neither
    ``<pad>`` nor ``<s>``, and CTranslate2 refuses unknown ones)."""
    options = {"min_decoding_length": STEPS, "max_decoding_length": STEPS, "length_penalty": ALPHA}
    return {
        "greedy_b32": {"batch": tokens, "options": {**options, "beam_size": 1}},
        "beam4_b32": {"batch": tokens, "options": {**options, "beam_size": BEAM}},
        "greedy_b1": {"batch": tokens[:1], "options": {**options, "beam_size": 1}},
        "beam4_b1": {"batch": tokens[:1], "options": {**options, "beam_size": BEAM}},
    }


def start_ct2(
    model_dir: Path,
    sources: list[list[str]],
    target: list[str],
    ref: list[float],
    args: argparse.Namespace,
    compute_type: str = "default",
    tol: float = CHECK_TOL,
) -> tuple[str, dict[str, Any]]:
    """CTranslate2 workers on the fastest ISA that runs (of decode.cpu_isas()), one per matrix-
    product backend (decode.CT2_BACKENDS), ``compute_type`` (CTranslate2's: "default" is the
    folder's float32, "int8"), each checked against ``ref`` within ``tol`` (``max_diff``): a
    backend outside it is closed and said on stderr, a RuntimeError where none is within. The
    converted Marian model adds no ``</s>`` to the source: the pieces here end in it."""
    tokens = [[*s, "</s>"] for s in sources]
    check = {"source": tokens[0], "target": target}
    isa, servers = decode.start_ct2(str(model_dir), ct2_jobs(tokens), check, args, compute_type)
    errors = {}
    for name in list(servers):
        lp = servers[name].info.pop("check_log_probs")
        try:
            diff = max_diff(f"ct2 {compute_type} ({name})", lp, ref, tol)
        except RuntimeError as e:  # this backend is off: left out, as decode.py leaves it
            errors[name] = str(e)
            servers.pop(name).close()
            continue
        servers[name].info["check_max_abs_diff"] = diff
    if not servers:
        raise RuntimeError("; ".join(errors.values()))
    for name, why in errors.items():
        print(f"ct2 {compute_type}: {name} left out: {why}", file=sys.stderr)
    return isa, servers


def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Build the folder in ``workdir``, check the three systems agree, time them."""
    import torch

    size = SIZES["quick" if args.quick else "opus"]
    print(f"building the Marian folder {size} ...", file=sys.stderr, flush=True)
    folder = make_folder(workdir / "opus-mt", size)
    print("importing (transduce) and converting (ct2) ...", file=sys.stderr, flush=True)
    systems = load_systems(folder, workdir / "model.pt")
    ct2_dir = convert_ct2(folder, workdir / "ct2")
    sources, target = draw_pieces(systems)
    ref = ours_log_probs(systems, sources[0], target)
    hf_diff = max_diff("hf", hf_log_probs(systems, sources[0], target), ref)

    from transduce.inference.engine import DecodingModel

    torch.set_num_threads(args.threads)
    runs: dict[str, dict[str, Any]] = {}
    lengths: dict[str, set[int]] = {}
    checks = {"hf": hf_diff}
    runs["transduce"], lengths["transduce"] = ours_runs(
        systems, sources, DecodingModel(systems.ours)
    )
    if args.int8:
        int8 = DecodingModel(systems.ours, int8=True)
        lp = engine_log_probs(int8, systems, sources[0], target)
        checks["transduce_int8"] = max_diff("transduce int8", lp, ref, INT8_CHECK_TOL)
        runs["transduce_int8"], lengths["transduce_int8"] = ours_runs(systems, sources, int8)
    runs["hf"], lengths["hf"] = hf_runs(systems, sources)
    print("starting ct2 ...", file=sys.stderr, flush=True)
    ct2_systems: dict[str, tuple[str, dict[str, Any]]] = {}
    try:
        ct2_systems["ct2"] = start_ct2(ct2_dir, sources, target, ref, args)
        if args.int8:
            ct2_systems["ct2_int8"] = start_ct2(
                ct2_dir, sources, target, ref, args, "int8", ct2_int8_tol()
            )
    except BaseException:
        for _, servers in ct2_systems.values():
            for server in servers.values():
                server.close()
        raise
    rounds = {j: args.latency_repeats if j.endswith("_b1") else args.repeats for j in FIGURES}
    results = decode.time_with_ct2(runs, ct2_systems, rounds, args, suffix="")
    for name, r in results.items():
        if name in lengths:
            r["lengths"] = sorted(lengths[name])
        if name in checks:
            r["check_max_abs_diff"] = checks[name]
    for name, r in results.items():
        if r["lengths"] != [STEPS]:
            raise RuntimeError(f"{name} did not generate exactly {STEPS} tokens: {r['lengths']}")
    return {"size": size, "systems": results}


# -- report --------------------------------------------------------------------------------------


def _ratio(ours: dict, them: dict, job: str, latency: bool) -> float:
    """Throughput theirs over ours, latency ours over theirs, on ``job``: the median of the
    rounds' ratios where both have the same rounds (``{job}_times``), else of the figures."""
    a, b = ours.get(f"{job}_times"), them.get(f"{job}_times")
    if a and b and len(a) == len(b):
        return paired_ratio(a, b) if latency else paired_ratio(b, a)
    return ours[job] / them[job] if latency else them[job] / ours[job]


def ratios(systems: dict[str, dict]) -> dict[str, float]:
    """Throughput ours over theirs (> 1: transduce faster); latency ours over theirs (< 1); with
    the int8 systems, ours int8 against CTranslate2's int8 and against our float32 too."""
    pairs = [("", "transduce", "hf"), ("", "transduce", "ct2")]
    if "transduce_int8" in systems:
        pairs += [("_int8", "transduce_int8", "ct2_int8"), ("_int8", "transduce_int8", "fp32")]
    out = {}
    for tag, mine, other in pairs:
        ours = systems[mine]
        them = systems["transduce" if other == "fp32" else other]
        out[f"opus_beam4_b32{tag}_vs_{other}"] = _ratio(ours, them, "beam4_b32", False)
        out[f"opus_greedy_b32{tag}_vs_{other}"] = _ratio(ours, them, "greedy_b32", False)
        out[f"opus_beam4_b1_latency{tag}_vs_{other}"] = _ratio(ours, them, "beam4_b1", True)
        out[f"opus_greedy_b1_latency{tag}_vs_{other}"] = _ratio(ours, them, "greedy_b1", True)
    return out


def print_table(res: dict, threads: int) -> None:
    s = res["size"]
    print(
        f"\nMarian (OPUS-MT shape): d_model {s['d_model']}, {s['layers']}+{s['layers']} layers, "
        f"{s['heads']} heads, d_ff {s['d_ff']}, vocab {s['vocab']}; {SRC_LEN} source tokens, "
        f"{STEPS} steps, {threads} threads"
    )
    print(
        f"{'system':15} {'greedy b32 sent/s':>18} {'tok/s':>8} {'beam4 b32 sent/s':>17} "
        f"{'tok/s':>8} {'greedy b1 ms':>13} {'beam4 b1 ms':>12}"
    )
    for system, r in res["systems"].items():
        print(
            f"{system:15} {BATCH / r['greedy_b32']:18.1f} {BATCH * STEPS / r['greedy_b32']:8.0f} "
            f"{BATCH / r['beam4_b32']:17.1f} {BATCH * STEPS / r['beam4_b32']:8.0f} "
            f"{1000 * r['greedy_b1']:13.1f} {1000 * r['beam4_b1']:12.1f}"
        )
    for name in ("ct2", "ct2_int8"):
        if name not in res["systems"]:
            continue
        ct2 = res["systems"][name]
        print(
            f"{name} seconds by backend (the faster one is used; ISA {ct2['isa']}): "
            + "; ".join(
                f"{b}: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items())
                for b, t in ct2["backend_times"].items()
            )
        )
    print()
    for key, v in ratios(res["systems"]).items():
        print(f"{key:40} {v:.2f}")


def ct2_int8_tol() -> float:
    """``INT8_CHECK_TOL`` for CTranslate2's int8, or decode.py's wider one on a CPU without int8
    dot products (where CTranslate2's int8 sums saturate)."""
    return max(INT8_CHECK_TOL, decode.ct2_int8_tol())


def summary(res: dict, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    from transduce.kernels.quantized import cpu_int8_flags

    ct2 = res["systems"]["ct2"]
    out: dict[str, Any] = {
        "benchmark": "decode_marian",
        "quick": args.quick,
        "int8": args.int8,
        "threads": args.threads,
        **ratios(res["systems"]),
    }
    out["size"] = res["size"]
    out["seconds"] = {
        name: {k: decode._round(r[k]) for k in FIGURES} for name, r in res["systems"].items()
    }
    out["check_max_abs_diff"] = {
        name: decode._round(r["check_max_abs_diff"])
        for name, r in res["systems"].items()
        if "check_max_abs_diff" in r
    }
    for name in ("ct2", "ct2_int8"):
        if name in res["systems"]:
            r = res["systems"][name]
            out[f"{name}_isa"], out[f"{name}_backend"] = r["isa"], r["backend"]
            out[f"{name}_backend_seconds"] = {
                b: {k: decode._round(v) for k, v in t.items()}
                for b, t in r["backend_times"].items()
            }
    out.update(
        {
            "cpu_int8_dot": list(cpu_int8_flags()),
            "ct2_torch_imported": ct2["torch_imported"],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ctranslate2": ct2["ctranslate2"],
            "machine": platform.processor() or platform.machine(),
            "repeats": args.repeats,
            "latency_repeats": args.latency_repeats,
        }
    )
    return {k: decode._round(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--latency-repeats", type=int, default=10)
    parser.add_argument(
        "--quick", action="store_true", help="d_model 64, 2+2 layers, vocabulary 2000, one repeat"
    )
    parser.add_argument(
        "--int8", action="store_true", help="also ours int8 and CTranslate2 int8 (see above)"
    )
    decode.add_timing_options(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.latency_repeats = 1, 1

    import transformers

    from transduce.runtime import tune_malloc

    tune_malloc()
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        res = bench(args, Path(tmp))
    print_table(res, args.threads)
    out = summary(res, args)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

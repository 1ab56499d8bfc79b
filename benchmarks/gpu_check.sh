#!/usr/bin/env bash
# The GPU checks of issues 40 and 41 in one go, on one H100 / H200, in at most 6 minutes unless
# GPU_CHECK_SECONDS says otherwise (all of them take 12-15 minutes):
#
#   benchmarks/gpu_check.sh [--device cuda|cpu] [--out DIR]
#
#   env          torch, CUDA, the GPUs (nvidia-smi)
#   correctness  a tiny model trained on the CPU: its beam-4 outputs on the CPU and on the GPU
#                equal, sentence for sentence
#   gap          benchmarks/train_gap.py: `transduce train` of the base model at 25k-token
#                batches (bf16-weights; Multi30k: 8,000 pieces, ~13 tokens a sentence) for ~30 s
#                against the Trainer's own update over the same batches on the device, with
#                --diagnose (fed as the Trainer feeds it; later epochs' new shapes);
#                gap_expandable (after step_paper_late) the same without the diagnosis, with
#                the CUDA allocator's expandable segments
#   decode       benchmarks/decode_gpu.py: the engine, and its static steps replayed as CUDA
#                graphs (StaticDecoder), against transformers generate, bf16, batches 1, 32 and
#                128, beam 4 and greedy (OPUS-MT-sized imported model)
#   probe_topk   benchmarks/gpu_probe.py --only topk: a beam step's top-k three ways
#   static_tests tests/inference/engine/test_static_decoder.py, its CUDA-graph tests included,
#                and test_beam_device_reads.py (the search's one read a step)
#   step_small   benchmarks/train_step.py, SMALL at 64 x (24 + 24), fp32, bf16 and bf16-weights,
#                against nn.Transformer and Hugging Face Marian; tokens/s, MFU, peak memory
#   step_paper   BASE at --paper-batch (1024 x (24 + 24), ~25k target tokens), bf16 and ours in
#                bf16-weights, the two-pass reference loss beside (transduce_reference), and
#                the flash attention kernel kept on (transduce_flash; the Trainer turns it off)
#   step_compiled  train_step.py's transduce_cudagraphs (inductor's reduce-overhead: CUDA graphs)
#                against eager on SMALL 64 x 24, fp32 and bf16-weights; step_compiled_paper its
#                transduce_compiled (inductor's default mode) at the paper batch, bf16-weights;
#                profile_small: the graphed SMALL step's kernels and how busy the device is;
#                each SMALL system also read one update late (*_read_late; the Trainer reads at
#                once), and step_paper_late the same at the paper batch
#   profile      benchmarks/profile_step.py: the paper step's device time by kind of kernel
#   probe        benchmarks/gpu_probe.py: attention kernels, layer norms and weight casts alone
#   recipe       configs/multi30k_en_de_gpu.yaml for GPU_RECIPE_MINUTES (default 1.5; the
#                recipe's own budget is 4.3) of training, then test2016 BLEU, beam 4 (only with
#                Multi30k in ./gpu_data/multi30k)
#   recipe_translate  benchmarks/translate_gpu.py: its model translating test2016 with the steps
#                on CUDA graphs (the Translator's default there) and without, three passes
#   recipe_fp16  its model decoded with --precision fp16 (test2016 BLEU against fp32's)
#   recipe_graphs  the recipe again with train.compile reduce-overhead (CUDA graphs: the small
#                model's update is bound by kernel launches), its updates and test2016 BLEU
#   train_compile  `transduce train` of the base model at 25k-token batches (bf16-weights)
#                with train.compile default: its compile time and steady tokens/s
#   fp16         a few fp16 steps (loss scaling): finite losses, a loss scale logged
#   torchrun     2 ranks on NCCL (only with 2 GPUs or more), then the same compiled
#
# Each step runs under `timeout`, its output in $OUT/<step>.log; a failure is recorded and the
# next step runs. The summary (each step's status and seconds, then the figures) comes last
# and is also in $OUT/summary.txt. GPU_CHECK_SECONDS=N (default 360; 0: no limit) skips the
# steps that cannot start within N seconds of the start (each step's limit shrinks to what is
# left); the steps run in the order above, the issues' open targets first. --device cpu is a
# dry run at tiny sizes (a minute or two on 2 cores): the same steps and plumbing, figures
# that mean nothing. The throughput runs train on Multi30k when it is there, else on the
# synthetic reverse task (52 symbols: the output layer far smaller than Multi30k's 8,000
# pieces, so tokens/s come out higher).
#
# Python: $PYTHON (default python) with this tree's src/ first on PYTHONPATH; the benchmarks
# against Marian need transformers (pip install -e .[bench]).
set -uo pipefail

device=cuda
OUT="${OUT:-./gpu_out}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (--device cuda|cpu, --out DIR)" >&2; exit 2 ;;
    esac
done
case "$device" in cuda|cuda:*|cpu) ;; *) echo "gpu_check.sh: --device cuda or cpu" >&2; exit 2 ;; esac

cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
transduce=("$PY" -m transduce)
data=./gpu_data/multi30k
: > "$OUT/summary.txt"
: > "$OUT/figures.txt"
started=$(date +%s)
deadline="${GPU_CHECK_SECONDS:-360}"
[[ $device == cpu && -z ${GPU_CHECK_SECONDS:-} ]] && deadline=0  # a dry run runs every step

if [[ $device == cpu ]]; then  # the dry run's sizes
    dry=1 train_s=15 tiny_steps=30 tiny_valid=50 minutes_recipe=0.15 fp16_steps=4
    step_flags=(--batch 4 --src-len 6 --tgt-len 6 --rounds 1 --threads 2 --precisions fp32)
    # fp32 only: bfloat16 is emulated on CPUs without it (an AVX2 Zen 3 ran out of time)
    paper_flags=(--batch 16 --src-len 24 --tgt-len 24 --rounds 1 --threads 2 --precisions fp32)
    big_tokens=1024 paper_size=small profile_flags=(--batch 8 --steps 2)
else
    dry=0 train_s=30 tiny_steps=600 tiny_valid=200 minutes_recipe="${GPU_RECIPE_MINUTES:-1.5}"
    fp16_steps=30
    step_flags=(--rounds 3 --precisions fp32 bf16 bf16-weights)
    paper_flags=(--paper-batch --rounds 3)
    big_tokens=25000 paper_size=base profile_flags=(--paper-batch --steps 5)
fi

# step NAME SECONDS COMMAND...: run it under timeout, output to $OUT/NAME.log, status recorded
step() {
    local name="$1" limit="$2"; shift 2
    local t0=$SECONDS rc status left
    if [[ $deadline -gt 0 ]]; then  # GPU_CHECK_SECONDS: what cannot start in time is skipped
        left=$((deadline - ($(date +%s) - started)))
        if [[ $left -lt 25 ]]; then
            skip "$name" "out of time (GPU_CHECK_SECONDS=$deadline)"
            return 1
        fi
        [[ $left -lt $limit ]] && limit=$left
    fi
    echo "== $name (at most ${limit}s): $*" >&2
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status="TIMEOUT after ${limit}s" ;;
        *) status="FAILED (exit $rc, see $name.log)" ;;
    esac
    printf '%-14s %-40s %4ss\n' "$name" "$status" "$((SECONDS - t0))" >> "$OUT/summary.txt"
    tail -n 3 "$OUT/$name.log" >&2
    return $rc
}

skip() {  # skip NAME REASON
    printf '%-14s %-40s\n' "$1" "skipped: $2" >> "$OUT/summary.txt"
    echo "== $1 skipped: $2" >&2
}

figure() { echo "$*" >> "$OUT/figures.txt"; }

# steady target tokens/s of a run folder (train_gap.py's rule: the median of its logged windows
# after the first two, the warm-up and with compile the compiling), and its compile record
tokens_per_s() {
    "$PY" -c 'import json, sys; sys.path.insert(0, "benchmarks"); import train_gap
print(json.dumps(train_gap.steady_rate(__import__("pathlib").Path(sys.argv[1]))))' "$1"
}

have_multi30k() { [[ -f $data/train.en.gz && -f $data/test_2016_flickr.de.gz ]]; }

# --- env ---------------------------------------------------------------------------------------
step env 60 bash -c "'$PY' -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, \
\"cuda\", torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(), \
[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; \
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true"
figure "env: $(head -n 1 "$OUT/env.log")"
n_gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [[ $dry == 0 && $n_gpus == 0 ]]; then
    figure "env: no CUDA device: the GPU steps below will fail; use --device cpu for a dry run"
fi

# --- correctness: beam 4 on the CPU and on the device ------------------------------------------
cat > "$OUT/tiny.yaml" <<EOF
model: {n_layers: 2, d_model: 64, d_ff: 256, n_heads: 4, d_k: 16, d_v: 16, dropout: 0.0}
train: {device: cpu, precision: fp32, label_smoothing: 0.0, warmup: 100, lr_factor: 1.0,
        max_tokens: 2048, max_steps: $tiny_steps, save_every: 100000, eval_every: 0,
        log_every: 20, tensorboard: false}
task: {name: reverse, train_size: 20000, valid_size: $tiny_valid, min_length: 3, max_length: 10,
       n_symbols: 12}
decode: {beam: 4}
EOF
cat > "$OUT/correctness.py" <<'EOF'
"""Beam 4 of one trained model on the CPU and on DEVICE (fp32 both): the same outputs."""
import json, sys
import torch
from transduce.checkpoint import load_model
from transduce.data.batching import collate
from transduce.data.synthetic import make_task
from transduce.inference.beam import beam_search
from transduce.training.tasks.synthetic import encode_pairs

run, device = sys.argv[1], sys.argv[2]
model, vocab, cfg = load_model(f"{run}/model.pt", "cpu")
pairs = encode_pairs(vocab, make_task(cfg.task).valid)
batch = collate(pairs)

def decode(dev: str) -> tuple[list[list[int]], list[float]]:
    hyps = beam_search(model.to(dev).eval(), batch.src.to(dev), beam=4, alpha=0.6)
    return [h[0].tokens for h in hyps], [h[0].score for h in hyps]

cpu_tokens, cpu_scores = decode("cpu")
dev_tokens, dev_scores = decode(device)
same = sum(a == b for a, b in zip(cpu_tokens, dev_tokens))
right = sum(a == t for a, (_, t) in zip(cpu_tokens, pairs))
gap = max(abs(a - b) for a, b in zip(cpu_scores, dev_scores))
print(json.dumps({"sentences": len(pairs), "same_outputs": same, "cpu_exact_match": right,
                  "max_score_gap": gap, "device": device}))
sys.exit(0 if same == len(pairs) else 1)
EOF
if step tiny_train 240 "${transduce[@]}" train --config "$OUT/tiny.yaml" --out "$OUT/tiny" --quiet; then
    step correctness 120 "$PY" "$OUT/correctness.py" "$OUT/tiny" "$device"
    figure "correctness (cpu vs $device, beam 4): $(tail -n 1 "$OUT/correctness.log")"
else
    skip correctness "the tiny model did not train (tiny_train.log)"
fi

# --- transduce train against its own update on the same batches (benchmarks/train_gap.py) ------
# The base model at 25k-token batches on Multi30k (8,000 pieces); the dry run a tiny model on the
# synthetic reverse task. --diagnose: the update fed as the Trainer feeds it (reader_*), and over
# later epochs' new batch shapes (epochs_*): where the command's time goes.
cat > "$OUT/reverse.yaml" <<EOF
model: {n_layers: 3, d_model: 256, d_ff: 1024, n_heads: 4, d_k: 64, d_v: 64, dropout: 0.1}
train: {warmup: 400, max_steps: 100000, eval_every: 0, save_every: 100000, tensorboard: false}
task: {name: reverse, train_size: 100000, valid_size: 50, min_length: 20, max_length: 24,
       n_symbols: 52}
decode: {beam: 1}
EOF
gap=(--set "device=$device" --set "max_tokens=$big_tokens" --set pad_multiple=auto
    --seconds "$train_s" --passes 3)
if [[ $dry == 1 ]]; then
    gap+=(--config "$OUT/reverse.yaml" --set n_layers=1 --set d_model=32 --set d_ff=64
        --set d_k=16 --set d_v=16 --set n_heads=2 --set precision=fp32 --set train_size=2000)
    gap_data=reverse
else
    gap+=(--set precision=bf16-weights --set n_layers=6 --set d_model=512 --set d_ff=2048
        --set n_heads=8 --set d_k=64 --set d_v=64 --set dropout=0.1)
    if have_multi30k; then
        gap+=(--config configs/multi30k_en_de_gpu.yaml --set "train_src=$data/train.en.gz"
            --set "train_tgt=$data/train.de.gz" --set "valid_src=$data/val.en.gz"
            --set "valid_tgt=$data/val.de.gz" --set max_valid_sentences=100)
        gap_data=multi30k
    else
        gap+=(--config "$OUT/reverse.yaml")
        gap_data=reverse
    fi
fi
step gap 240 "$PY" benchmarks/train_gap.py "${gap[@]}" --diagnose --out "$OUT/gap"
figure "gap ($gap_data, $big_tokens-token batches; the target: cli_over_step >= 0.9): $(tail -n 1 "$OUT/gap.log")"
# gap's vocabulary, if it made one, for the runs below: not learned again
[[ -f $OUT/gap/step/vocab.model ]] && gap+=(--set "vocab_model=$OUT/gap/step/vocab.model")

# --- decoding on the device against transformers generate (benchmarks/decode_gpu.py) ---------
if [[ $dry == 1 ]]; then
    step decode 240 "$PY" benchmarks/decode_gpu.py --device "$device" --quick --dtype fp32 \
        --batches 2 4
else
    step decode 210 "$PY" benchmarks/decode_gpu.py --device "$device" --dtype bf16 \
        --batches 1 32 128 --repeats 3
fi
figure "decode: $(tail -n 1 "$OUT/decode.log")"
# a beam step's top-k three ways (22% of a static beam search's device time on the H200)
step probe_topk 60 "$PY" benchmarks/gpu_probe.py --device "$device" --only topk
figure "probe_topk: $(tail -n 1 "$OUT/probe_topk.log")"
# the static steps' CUDA graphs against their eager run and the engine (tests that skip off CUDA)
step static_tests 90 "$PY" -m pytest -q -p no:cacheprovider \
    tests/inference/engine/test_static_decoder.py tests/inference/test_beam_device_reads.py
figure "static_tests: $(tail -n 1 "$OUT/static_tests.log")"

# --- train_step.py: small batch and paper batch ------------------------------------------------
systems=(transduce torch hf)
"$PY" -c 'import transformers' 2>/dev/null || systems=(transduce torch)
[[ ${#systems[@]} == 2 ]] && figure "train_step: transformers missing, Hugging Face left out"
step step_small 240 "$PY" benchmarks/train_step.py --quick --device "$device" --malloc on \
    --systems "${systems[@]}" "${step_flags[@]}"
figure "step_small: $(tail -n 1 "$OUT/step_small.log")"
step step_paper 240 "$PY" benchmarks/train_step.py --sizes "$paper_size" --device "$device" \
    --malloc on --systems transduce transduce_reference transduce_flash "${systems[@]:1}" \
    --precisions bf16 bf16-weights "${paper_flags[@]}"
figure "step_paper: $(tail -n 1 "$OUT/step_paper.log")"
# --- train_step.py compiled (inductor): SMALL at 64 x 24 (launch-bound), BASE at the paper batch
if [[ $dry == 1 ]]; then
    skip step_compiled "inductor on a CPU: minutes of compiling"
else
    step step_compiled 200 "$PY" benchmarks/train_step.py --quick --device "$device" --malloc on \
        --systems transduce transduce_read_late transduce_cudagraphs transduce_cudagraphs_read_late \
        --precisions fp32 bf16-weights --rounds 3
    figure "step_compiled (small 64 x 24): $(tail -n 1 "$OUT/step_compiled.log")"
    step step_compiled_paper 200 "$PY" benchmarks/train_step.py --sizes base --device "$device" \
        --malloc on --systems transduce transduce_compiled --precisions bf16-weights --paper-batch \
        --rounds 3
    figure "step_compiled_paper: $(tail -n 1 "$OUT/step_compiled_paper.log")"
    # reading each update late at the paper batch (the Trainer reads at once: late_read.pays)
    step step_paper_late 150 "$PY" benchmarks/train_step.py --sizes base --device "$device" \
        --malloc on --systems transduce transduce_read_late --precisions bf16-weights \
        --paper-batch --rounds 3
    figure "step_paper_late: $(tail -n 1 "$OUT/step_paper_late.log")"
    # gap again with the CUDA allocator's expandable segments: new batch shapes, fewer new blocks
    step gap_expandable 200 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$PY" \
        benchmarks/train_gap.py "${gap[@]}" --out "$OUT/gap_expandable"
    figure "gap_expandable: $(tail -n 1 "$OUT/gap_expandable.log")"
    # SMALL's graphed step: how busy the device is (34% on an H200: bound by the host)
    step profile_small 120 "$PY" benchmarks/profile_step.py --device "$device" --size small \
        --system transduce_cudagraphs --precision fp32 --steps 10
    figure "profile_small: $(tail -n 1 "$OUT/profile_small.log")"
fi

# where the paper step's device time goes (kernels by kind)
step profile 120 "$PY" benchmarks/profile_step.py --device "$device" --size "$paper_size" \
    --precision bf16-weights "${profile_flags[@]}"
figure "profile: $(tail -n 1 "$OUT/profile.log")"
# the step's pieces alone, each against its alternatives
step probe 90 "$PY" benchmarks/gpu_probe.py --device "$device"
figure "probe: $(tail -n 1 "$OUT/probe.log")"

# --- the GPU recipe: bounded time, then test2016 -----------------------------------------------
if have_multi30k; then
    recipe=(--config configs/multi30k_en_de_gpu.yaml --set "device=$device"
        --set "train_src=$data/train.en.gz" --set "train_tgt=$data/train.de.gz"
        --set "valid_src=$data/val.en.gz" --set "valid_tgt=$data/val.de.gz"
        --set "max_minutes=$minutes_recipe" --quiet)
    [[ $dry == 1 ]] && recipe+=(--set n_layers=1 --set d_model=32 --set d_ff=64 --set d_k=16 --set d_v=16 --set n_heads=2 --set precision=fp32 --set vocab_size=500 --set eval_every=0)
    test_src="$data/test_2016_flickr.en.gz" test_ref="$data/test_2016_flickr.de.gz"
    if [[ $dry == 1 ]]; then  # the first 100 sentences: a CPU's beam 4 over 1,000 takes a while
        zcat "$test_src" | head -n 100 > "$OUT/test100.en"
        zcat "$test_ref" | head -n 100 > "$OUT/test100.de"
        test_src="$OUT/test100.en" test_ref="$OUT/test100.de"
    fi
    t0=$SECONDS
    if step recipe "$(awk "BEGIN {print int($minutes_recipe * 60 + 150)}")" \
        "${transduce[@]}" train "${recipe[@]}" --out "$OUT/recipe"; then
        step recipe_test 180 "${transduce[@]}" evaluate --model "$OUT/recipe/model.pt" \
            --device "$device" --beam 4 --src "$test_src" --ref "$test_ref" --quiet
        figure "recipe ($minutes_recipe min of training, $((SECONDS - t0)) s in all): test2016 $(tail -n 1 "$OUT/recipe_test.log")"
        step recipe_translate 120 "$PY" benchmarks/translate_gpu.py --device "$device" \
            --model "$OUT/recipe/model.pt" --src "$test_src" --ref "$test_ref" --rounds 3
        figure "recipe_translate: $(tail -n 1 "$OUT/recipe_translate.log")"
        if [[ $dry == 1 ]]; then
            skip recipe_fp16 "fp16 decoding is for CUDA devices (refused on a CPU)"
        else  # the same model decoded in float16 weights: its BLEU against fp32's above
            step recipe_fp16 120 "${transduce[@]}" evaluate --model "$OUT/recipe/model.pt" \
                --device "$device" --beam 4 --precision fp16 --src "$test_src" \
                --ref "$test_ref" --quiet
            figure "recipe, decoded in fp16: test2016 $(tail -n 1 "$OUT/recipe_fp16.log")"
        fi
    fi
    graphs=(--set compile=reduce-overhead)  # the recipe's vocabulary, not learned again
    [[ -f $OUT/recipe/vocab.model ]] && graphs+=(--set "vocab_model=$OUT/recipe/vocab.model")
    if [[ $dry == 1 ]]; then
        skip recipe_graphs "CUDA graphs (compile: reduce-overhead) are refused on a CPU"
    elif step recipe_graphs "$(awk "BEGIN {print int($minutes_recipe * 60 + 210)}")" \
        "${transduce[@]}" train "${recipe[@]}" "${graphs[@]}" --out "$OUT/recipe_graphs"; then
        step recipe_graphs_test 180 "${transduce[@]}" evaluate \
            --model "$OUT/recipe_graphs/model.pt" --device "$device" --beam 4 --src "$test_src" \
            --ref "$test_ref" --quiet
        figure "recipe_graphs (CUDA graphs, $minutes_recipe min): $(tokens_per_s "$OUT/recipe_graphs"); test2016 $(tail -n 1 "$OUT/recipe_graphs_test.log")"
    fi
else
    skip recipe "no Multi30k in $data (carry a copy: train, val, test_2016_flickr .en/.de .gz)"
fi

# --- transduce train compiled: its compile time and steady tokens/s at 25k-token batches --------
# (the eager command against its own update: gap, above)
if [[ $dry == 1 ]]; then
    skip train_compile "inductor on a CPU: a minute or more of compiling a tiny model"
else
    corpus=(--set "device=$device" --set "max_tokens=$big_tokens" --set log_every=10
        --set pad_multiple=auto --set "max_minutes=$(awk "BEGIN {print ($train_s + 60) / 60}")"
        --set save_every=100000 --set eval_every=0 --set tensorboard=false --quiet
        --set compile=default --set precision=bf16-weights --set n_layers=6 --set d_model=512
        --set d_ff=2048 --set n_heads=8 --set d_k=64 --set d_v=64 --set dropout=0.1)
    if have_multi30k; then
        corpus+=(--config configs/multi30k_en_de_gpu.yaml --set "train_src=$data/train.en.gz"
            --set "train_tgt=$data/train.de.gz" --set "valid_src=$data/val.en.gz"
            --set "valid_tgt=$data/val.de.gz" --set max_valid_sentences=100)
        [[ -f $OUT/gap/step/vocab.model ]] && corpus+=(--set "vocab_model=$OUT/gap/step/vocab.model")
    else
        corpus+=(--config "$OUT/reverse.yaml")
    fi
    # compiling takes tens of seconds of the run's max_minutes: a minute more for it
    if step train_compile $((train_s * 2 + 240)) "${transduce[@]}" train "${corpus[@]}" \
        --out "$OUT/train_compile"; then
        figure "train_compile ($gap_data, $big_tokens-token batches): $(tokens_per_s "$OUT/train_compile")"
    fi
fi

# --- fp16: a few steps with loss scaling -------------------------------------------------------
if [[ $dry == 1 ]]; then
    skip fp16 "fp16 autocast with loss scaling is for CUDA devices"
elif step fp16 180 "${transduce[@]}" train --config "$OUT/tiny.yaml" --out "$OUT/fp16" \
    --set "device=$device" --set precision=fp16 --set "max_steps=$fp16_steps" --set log_every=5 --quiet; then
    figure "fp16: $("$PY" - "$OUT/fp16" <<'EOF'
import json, math, sys
from pathlib import Path
rs = [json.loads(x) for x in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in rs if "loss" in r and "split" not in r]
print(json.dumps({"steps_logged": len(steps), "finite": all(math.isfinite(r["loss"]) for r in steps),
                  "last_loss": steps[-1]["loss"] if steps else None,
                  "loss_scale": steps[-1].get("loss_scale") if steps else None,
                  "skipped": sum(r.get("split") == "skipped" for r in rs)}))
EOF
)"
fi

# --- torchrun: 2 ranks on NCCL ------------------------------------------------------------------
if [[ $dry == 1 ]]; then
    skip torchrun "NCCL needs CUDA devices (the gloo runs are in tests/training)"
elif [[ $n_gpus -lt 2 ]]; then
    skip torchrun "$n_gpus GPU(s): 2 ranks on NCCL need 2"
else
    step torchrun 240 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
        -m transduce train --config "$OUT/tiny.yaml" --out "$OUT/torchrun" --set device=cuda \
        --set max_steps=100 --quiet
    # the DDP wrapper compiled (train.compile under torchrun: training/compiling.py)
    step torchrun_compile 240 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
        -m transduce train --config "$OUT/tiny.yaml" --out "$OUT/torchrun_compile" \
        --set device=cuda --set max_steps=100 --set compile=default --quiet
fi

{
    echo
    echo "== gpu_check.sh --device $device: $(( $(date +%s) - started )) s in all, logs in $OUT"
    cat "$OUT/summary.txt"
    echo "-- figures"
    cat "$OUT/figures.txt"
} | tee "$OUT/summary_final.txt"
mv "$OUT/summary_final.txt" "$OUT/summary.txt"

#!/usr/bin/env bash
# Multi30k en->de from scratch: fetch the data, train configs/multi30k_en_de.yaml for MINUTES of
# wall clock, then score test_2016_flickr with sacreBLEU: model.pt with beam 4 and greedy, best.pt
# with beam 4.
#
#   benchmarks/multi30k.sh [MINUTES] [more 'transduce train' options, e.g. --set seed=2]
#
# MINUTES defaults to 60. Run from anywhere; it works in the repository root. Data goes to
# data/multi30k (copied from $TRANSDUCE_DATA/multi30k when TRANSDUCE_DATA is set, else
# downloaded), the run to $RUN_DIR (default runs/multi30k_en_de_<date>). Prints the training
# summary, the evaluation JSON objects and the wall-clock times; it records nothing
# anywhere else (put the numbers in benchmarks/RESULTS.md by hand).
set -euo pipefail

minutes="${1:-60}"
[[ $# -gt 0 ]] && shift
cd "$(dirname "$0")/.."
transduce=(${TRANSDUCE:-transduce})
run="${RUN_DIR:-runs/multi30k_en_de_$(date +%Y%m%d_%H%M%S)}"
data=data/multi30k
test_src="$data/test_2016_flickr.en.gz"
test_ref="$data/test_2016_flickr.de.gz"

echo "== data -> $data" >&2
"${transduce[@]}" data multi30k --dest "$data" --src en --tgt de \
    ${TRANSDUCE_DATA:+--from "$TRANSDUCE_DATA"} --quiet >/dev/null

echo "== train ${minutes} min -> $run" >&2
start=$(date +%s)
"${transduce[@]}" train --config configs/multi30k_en_de.yaml --out "$run" \
    --set max_minutes="$minutes" "$@"
train_s=$(( $(date +%s) - start ))

# model.pt (the average of the last checkpoints) with beam 4 and greedy; best.pt (best
# validation BLEU) with beam 4, to see what averaging gave.
for spec in model:4 model:1 best:4; do
    name="${spec%:*}" beam="${spec#*:}"
    echo "== evaluate $name.pt on test_2016_flickr, beam $beam" >&2
    t0=$(date +%s)
    "${transduce[@]}" evaluate --model "$run/$name.pt" --src "$test_src" --ref "$test_ref" \
        --beam "$beam" --output "$run/test_2016_flickr.$name.beam$beam.de" --quiet
    echo "evaluate_seconds_${name}_beam$beam=$(( $(date +%s) - t0 ))"
done
echo "train_seconds=$train_s total_seconds=$(( $(date +%s) - start )) run=$run"

#!/usr/bin/env bash
# redco-generate on 2 data-parallel replicas (redco-run -n 2, no model
# shards): the prompts are split between the processes and the completions
# come back in prompt order, identical to 1 process: sampled text (draws keyed
# by the prompt), beams with return sequences, and an encoder-decoder's ids.
# Stdin prompts on 2 processes are one clear error.
#   test_generate_dp.sh <redco-run> <redco-generate> <tests/fixtures/hf>
set -uo pipefail
run=$1 gen=$2 hf=$3
export UCX_TLS=${UCX_TLS:-tcp,self}
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-gen-dp-XXXXXX")
trap 'rm -rf "$work"' EXIT
bad=0
printf '%s\n' "In the beginning God" "And the LORD said unto Moses," "Jesus wept." \
  "Blessed are the meek" "Let there be light" >"$work/text.txt"
printf '%s\n' "5 17 33 40 2" "60 4" "9 9 41 70 12 3 88 21" >"$work/ids.txt"

# same <lines expected> <model> <flags...>: 1 process and 2 replicas agree.
same() {
  local lines=$1 model=$2 one two
  shift 2
  one=$("$gen" "$hf/$model" --max-new-tokens 12 "$@" 2>&1) || { echo "FAIL: 1 process: $one"; bad=1; return; }
  two=$("$run" -n 2 --output rank0 -- "$gen" "$hf/$model" --max-new-tokens 12 "$@" 2>&1) || {
    echo "FAIL: 2 processes: $two"; bad=1; return; }
  if [[ "$one" != "$two" ]]; then
    echo "FAIL: $model $* differs on 2 replicas:"; echo "$one"; echo "--- vs ---"; echo "$two"; bad=1
  elif [[ $(printf '%s\n' "$one" | wc -l) -ne $lines ]]; then
    echo "FAIL: $model $*: expected $lines lines:"; echo "$one"; bad=1
  else
    echo "ok: $model $*"
  fi
}
same 5 gpt2_text --prompts-file "$work/text.txt" --do-sample --top-p 0.9 --temperature 1.5 --seed 7
same 10 gpt2_text --prompts-file "$work/text.txt" --num-beams 3 --num-return-sequences 2 --stop "ld"
same 3 t5 --prompts-file "$work/ids.txt" --do-sample --top-k 20 --seed 3
same 1 bart --prompt "5 17 33 40 2"  # fewer prompts than replicas
# Sampling is not a constant: other seeds give other text.
a=$("$gen" "$hf/gpt2_text" --max-new-tokens 12 --prompts-file "$work/text.txt" --do-sample --seed 7 2>&1)
b=$("$gen" "$hf/gpt2_text" --max-new-tokens 12 --prompts-file "$work/text.txt" --do-sample --seed 8 2>&1)
[[ "$a" != "$b" ]] || { echo "FAIL: seeds 7 and 8 sampled the same text"; bad=1; }
out=$(echo "Jesus wept." | "$run" -n 2 --output rank0 -- "$gen" "$hf/gpt2_text" 2>&1) && {
  echo "FAIL: stdin prompts on 2 processes were accepted"; bad=1; }
[[ "$out" == *"give the prompts with --prompt or --prompts-file"* ]] || {
  echo "FAIL: stdin refusal: $out"; bad=1; }
# A shard count that splits none of the model's 4 heads evenly is refused,
# naming the counts that do, instead of computing the whole model 3 times.
out=$("$run" -n 3 --output rank0 -- "$gen" "$hf/gpt2" --ids --prompt 1,2 --n-model-shards 3 2>&1) &&
  { echo "FAIL: --n-model-shards 3 with 4 heads was accepted"; bad=1; }
[[ "$out" == *"--n-model-shards 3 does not split this model evenly"*"give a count that does: 2, 4"* ]] ||
  { echo "FAIL: uneven shard refusal: $out"; bad=1; }
exit $bad

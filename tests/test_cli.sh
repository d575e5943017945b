#!/usr/bin/env bash
# Command-line conventions of the samples and tools (samples/common/redco_cli.hpp):
# dashed flags with the underscore spelling as an alias, range errors that
# print readable bounds, and a program's own flags passed through redco-run
# untouched.
#   test_cli.sh <redco-run> <language_modeling> <classification> <redco-generate>
set -uo pipefail
run=$1 lm=$2 cls=$3 gen=$4
bad=0
# expect <pattern> <command...>: the command fails and its output contains the pattern.
expect() {
  local want=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "FAIL: '$*' succeeded; expected an error containing '$want'"; bad=1
  elif [[ "$out" != *"$want"* ]]; then
    echo "FAIL: '$*' printed:"; echo "$out"; echo "expected: '$want'"; bad=1
  fi
}
expect "--context: must be an integer >= 1, got 0" "$lm" --context 0
expect "--context: must be an integer >= 1, got 0" "$lm" --context=0
expect "--vocab: must be an integer in [256, 65536], got 70000" "$lm" --vocab 70000
expect "--lr: must be > 0, got 0" "$lm" --lr 0
expect "--steps: must be an integer >= 1, got 1.5" "$lm" --steps 1.5
# The underscore spelling is the same option (the error names the dashed one).
expect "--n-model-shards: must be an integer >= 1, got 0" "$lm" --n-model-shards 0
expect "--n-model-shards: must be an integer >= 1, got 0" "$lm" --n_model_shards 0
expect "--n-model-shards: must be an integer >= 1, got 0" "$cls" --n_model_shards=0
expect "--batch-size: must be an integer >= 1, got 0" "$cls" --batch_size 0
expect "--grace: must be a number >= 0, got -1" "$run" -n 1 --grace -1 -- true
expect "--max-restarts: must be an integer >= 0, got -1" "$run" -n 1 --max-restarts -1 -- true
expect "--hang-timeout 0.05: give at least 0.1 seconds, or 0" "$run" -n 1 --hang-timeout 0.05 -- true
expect "not expected: --no_such_flag" "$lm" --no_such_flag
# --device comes from the shared helper, in every sample and tool.
expect "--device: must be cpu, cuda, cuda:N, test or auto, got tpu" "$lm" --device tpu
expect "--device: must be cpu, cuda, cuda:N, test or auto, got cuda:x" "$cls" --device cuda:x
expect "--max-new-tokens: must be an integer >= 0, got -1" "$gen" no-model --max-new-tokens -1
expect "--n-model-shards: must be an integer >= 1, got 0" "$gen" no-model --n_model_shards 0
# redco-run: its own underscore flags work; the program's arguments are not rewritten.
out=$("$run" --nproc_per_node 1 --output rank0 echo --job_id x 2>&1) || {
  echo "FAIL: redco-run --nproc_per_node 1: $out"; bad=1; }
[[ "$out" == *"--job_id x"* ]] || { echo "FAIL: the program got: $out"; bad=1; }
# No flag in --help is spelled with an underscore.
for exe in "$lm" "$cls" "$run" "$gen"; do
  if "$exe" --help | grep -E -- '--[a-z0-9]+_[a-z0-9_]+' ; then
    echo "FAIL: $exe --help shows an underscore flag"; bad=1
  fi
done
[ $bad -eq 0 ] && echo "command lines ok"
exit $bad

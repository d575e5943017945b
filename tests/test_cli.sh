#!/usr/bin/env bash
# Command-line conventions of the samples and tools (samples/common/redco_cli.hpp):
# dashed flags with the underscore spelling as an alias, range errors that
# print readable bounds on one line with exit status 2 (exit_status.hpp),
# defaults in --help, and a program's own flags passed through redco-run
# untouched. redco-run: one rank's output unprefixed, Ctrl-C reported as an
# interrupt with status 130.
#   test_cli.sh <redco-run> <language_modeling> <classification> <redco-generate>
set -uo pipefail
run=$1 lm=$2 cls=$3 gen=$4
bad=0
# expect <pattern> <command...>: the command fails with status 2 (a
# command-line error), printing one line that contains the pattern.
expect() {
  local want=$1 out status=0
  shift
  out=$("$@" 2>&1) || status=$?
  if [ $status != 2 ]; then
    echo "FAIL: '$*' exited with status $status, expected 2 (error: '$want')"; bad=1
  elif [[ "$out" != *"$want"* ]]; then
    echo "FAIL: '$*' printed:"; echo "$out"; echo "expected: '$want'"; bad=1
  elif [ "$(printf '%s\n' "$out" | wc -l)" != 1 ]; then
    echo "FAIL: '$*' printed more than one line:"; echo "$out"; bad=1
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
expect "language_modeling: error: The following argument was not expected: --no-such" \
  "$lm" --no-such
expect "classification: error: --batch-size: must be" "$cls" --batch-size x
expect "redco-generate: error: The following argument was not expected: --no-such" \
  "$gen" no-model --no-such
# redco-run's own flags: an unknown one is not taken for the program.
expect "redco-run: error: unknown option --no-such (--help lists the options" \
  "$run" -n 1 --no-such -- true
expect "redco-run: error: --output: " "$run" -n 1 --output some -- true
expect "redco-run: error: --prefix: " "$run" -n 1 --prefix sometimes -- true
expect "redco-run: error: --nproc-per-node is required" "$run" -- true
expect "redco-run: error: no program given" "$run" -n 1
# --device comes from the shared helper, in every sample and tool.
expect "--device: must be cpu, cuda, cuda:N, test or auto, got tpu" "$lm" --device tpu
expect "--device: must be cpu, cuda, cuda:N, test or auto, got cuda:x" "$cls" --device cuda:x
expect "--max-new-tokens: must be an integer >= 0, got -1" "$gen" no-model --max-new-tokens -1
expect "--n-model-shards: must be an integer >= 1, got 0" "$gen" no-model --n_model_shards 0
# redco-run: its own underscore flags work; the program's arguments are not rewritten.
out=$("$run" --nproc_per_node 1 --output rank0 echo --job_id x 2>&1) || {
  echo "FAIL: redco-run --nproc_per_node 1: $out"; bad=1; }
[[ "$out" == *"--job_id x"* ]] || { echo "FAIL: the program got: $out"; bad=1; }
# --help shows the defaults, and exits 0.
help=$("$run" --help) || { echo "FAIL: redco-run --help exited with status $?"; bad=1; }
for want in '--output TEXT:{all,rank0}=all' '--prefix TEXT:{auto,always,never}=auto' \
  '--timeout FLOAT:> 0=300 ' '--grace FLOAT:>= 0=10 ' '--hang-timeout FLOAT:>= 0=60' \
  '--max-restarts INT:>= 0=0 ' '--nnodes INT=1 ' '--job-id TEXT=default '; do
  grep -qF -- "$want" <<<"$help" || { echo "FAIL: redco-run --help lacks '$want'"; bad=1; }
done
"$lm" --help | grep -qF -- '--context INT:>= 1=128 ' || { echo "FAIL: $lm --help: no default"; bad=1; }
# One rank: its output passes through as the program wrote it; with more, or
# --prefix always, each line names its rank.
out=$("$run" -n 1 -- /bin/sh -c 'echo out; echo err >&2' 2>/dev/null)
[ "$out" = out ] || { echo "FAIL: redco-run -n 1 printed '$out', expected 'out'"; bad=1; }
out=$("$run" -n 1 -- /bin/sh -c 'echo err >&2' 2>&1 >/dev/null)
[ "$out" = err ] || { echo "FAIL: redco-run -n 1 wrote '$out' on stderr, expected 'err'"; bad=1; }
out=$("$run" -n 1 --prefix always -- echo out)
[ "$out" = "[rank 0] out" ] || { echo "FAIL: --prefix always printed '$out'"; bad=1; }
out=$("$run" -n 2 -- /bin/sh -c 'echo out $REDCO_RANK' | sort)
[ "$out" = $'[rank 0] out 0\n[rank 1] out 1' ] || { echo "FAIL: -n 2 printed '$out'"; bad=1; }
out=$("$run" -n 2 --prefix never -- /bin/sh -c 'echo out $REDCO_RANK' | sort)
[ "$out" = $'out 0\nout 1' ] || { echo "FAIL: -n 2 --prefix never printed '$out'"; bad=1; }
# Ctrl-C (SIGINT) to redco-run: passed on to the ranks, reported as the
# user's interrupt (no rank blamed), status 130 (128 + SIGINT).
tmp=$(mktemp -d -t redco-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$run" -n 2 -- /bin/sh -c "touch $tmp/up.\$REDCO_RANK; exec sleep 60" >"$tmp/log" 2>&1 &
launcher=$!
for _ in $(seq 200); do [ -e "$tmp/up.0" ] && [ -e "$tmp/up.1" ] && break; sleep 0.05; done
kill -INT $launcher
status=0
wait $launcher || status=$?
[ $status = 130 ] || { echo "FAIL: redco-run after SIGINT exited with status $status"; bad=1; }
grep -q '^redco-run: interrupted (Ctrl-C): stopped 2 ranks$' "$tmp/log" ||
  { echo "FAIL: no interrupt message after SIGINT:"; cat "$tmp/log"; bad=1; }
if grep -q 'killed by signal\|rank [0-9]* exited' "$tmp/log"; then
  echo "FAIL: a rank was blamed for the interrupt:"; cat "$tmp/log"; bad=1
fi
# A rank's failure: redco-run exits with its status.
status=0
"$run" -n 2 -- /bin/sh -c 'exit $((REDCO_RANK * 3))' 2>/dev/null || status=$?
[ $status = 3 ] || { echo "FAIL: a rank's status 3 came out of redco-run as $status"; bad=1; }
# No flag in --help is spelled with an underscore.
for exe in "$lm" "$cls" "$run" "$gen"; do
  if "$exe" --help | grep -E -- '--[a-z0-9]+_[a-z0-9_]+' ; then
    echo "FAIL: $exe --help shows an underscore flag"; bad=1
  fi
done
[ $bad -eq 0 ] && echo "command lines ok"
exit $bad

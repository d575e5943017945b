#!/usr/bin/env bash
# redco-run --max-restarts and --hang-timeout on 2 local processes, against an
# uninterrupted run of the same job (tests/restart_worker.cpp: a tiny GPT,
# a checkpoint after every step):
#   1. a random rank is killed (SIGKILL) after a random step, for several
#      seeds: the job restarts once, resumes from its latest checkpoint and
#      ends with parameters and optimizer state bitwise equal to the
#      uninterrupted run's; and again with the rank killed from outside at a
#      random moment (mid-step, mid-checkpoint);
#   2. a rank hangs, stopped by SIGSTOP or spinning in user code: the
#      launcher names it within the hang timeout, stops the job and
#      restarts it, again ending bitwise equal;
#   3. a long but healthy step (one rank busy with tensors for 2.5 timeouts,
#      the other waiting for it) is not called a hang;
#   4. a rank that fails on every attempt: redco-run gives up after
#      --max-restarts, naming the last failure, with its exit status.
#   test_restart.sh <restart_worker> <redco-run>
set -euo pipefail
worker=$1
run=$2
export UCX_TLS=${UCX_TLS:-tcp,self} UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n
WORK=$(mktemp -d -t redco-restart-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STEPS=8
final() { echo "$1/ckpt/step-$(printf %06d $STEPS)"; }
fail() {
  echo "FAIL: $1"
  [ -n "${2:-}" ] && tail -n 30 "$2"
  exit 1
}

# The uninterrupted reference.
"$run" -n 2 --output rank0 -- "$worker" --workdir "$WORK/ref" --steps $STEPS >"$WORK/ref.log" 2>&1 ||
  fail "the uninterrupted run failed" "$WORK/ref.log"
[ -f "$(final "$WORK/ref")/params.safetensors" ] || fail "no final checkpoint" "$WORK/ref.log"

# Runs the job as $1 with redco-run options $2 and worker options $3...;
# expects it to succeed after one restart and to end bitwise as the reference.
restarted_run() {
  local name=$1 launcher_opts=$2
  shift 2
  local status=0
  # shellcheck disable=SC2086
  "$run" -n 2 --output rank0 $launcher_opts -- "$worker" --workdir "$WORK/$name" --steps $STEPS \
    "$@" >"$WORK/$name.log" 2>&1 || status=$?
  [ $status = 0 ] || fail "$name: redco-run exited with status $status" "$WORK/$name.log"
  grep -q 'redco-run: restarting the job (restart 1 of ' "$WORK/$name.log" ||
    fail "$name: the job was not restarted" "$WORK/$name.log"
  grep -q '^restart 1$' "$WORK/$name.log" || fail "$name: REDCO_RESTART was not 1" "$WORK/$name.log"
  # The restarted attempt resumed (its first step is not step 1).
  local first
  first=$(sed -n '/^restart 1$/,$p' "$WORK/$name.log" | grep -m1 '^step ' | cut -d' ' -f2)
  [ "${first:-1}" -gt 1 ] || fail "$name: the restart began at step ${first:-?}" "$WORK/$name.log"
  for f in params opt_state; do
    cmp -s "$(final "$WORK/ref")/$f.safetensors" "$(final "$WORK/$name")/$f.safetensors" ||
      fail "$name: $f.safetensors differs from the uninterrupted run's" "$WORK/$name.log"
  done
  echo "$name: restarted at step $first, final parameters and optimizer state bitwise equal"
}

# --- 1. a random rank killed after a random step ------------------------------------------
# RESTART_SEEDS="1 2 ... 20" tries more.
for seed in ${RESTART_SEEDS:-1 2 3}; do
  RANDOM=$seed
  rank=$((RANDOM % 2))
  step=$((1 + RANDOM % (STEPS - 1)))
  restarted_run "kill-$seed" "--max-restarts 2" --fail-rank $rank --fail-step $step --fail-how kill
  grep -q "after: rank $rank was killed by signal 9" "$WORK/kill-$seed.log" ||
    fail "kill-$seed: the restart does not name rank $rank" "$WORK/kill-$seed.log"
done

# --- 1b. a random rank killed from outside at a random moment ------------------------------
# Mid-step, mid-checkpoint or between: wherever the moment falls (a 25 ms
# pause per step keeps the job running for at least 150 ms after step 1).
for seed in 1 2 3; do
  RANDOM=$((seed + 100))
  rank=$((RANDOM % 2))
  delay=$(printf '0.%03d' $((RANDOM % 150)))
  name="outside-$seed"
  mkdir -p "$WORK/$name.pids"
  "$run" -n 2 --output rank0 --max-restarts 1 -- "$worker" --workdir "$WORK/$name" --steps $STEPS \
    --pid-dir "$WORK/$name.pids" --step-ms 25 >"$WORK/$name.log" 2>&1 &
  launcher=$!
  for _ in $(seq 500); do grep -q '^step 1 ' "$WORK/$name.log" && break; sleep 0.01; done
  sleep "$delay"
  kill -9 "$(cat "$WORK/$name.pids/$rank.pid")" 2>/dev/null ||
    fail "$name: rank $rank was gone before the kill (the job is too short?)" "$WORK/$name.log"
  status=0
  wait $launcher || status=$?
  [ $status = 0 ] || fail "$name: redco-run exited with status $status" "$WORK/$name.log"
  grep -q "after: rank $rank was killed by signal 9" "$WORK/$name.log" ||
    fail "$name: the job was not restarted after rank $rank's death" "$WORK/$name.log"
  for f in params opt_state; do
    cmp -s "$(final "$WORK/ref")/$f.safetensors" "$(final "$WORK/$name")/$f.safetensors" ||
      fail "$name: $f.safetensors differs from the uninterrupted run's" "$WORK/$name.log"
  done
  last=$(sed -n '/^restart 1$/q;p' "$WORK/$name.log" | grep '^step ' | tail -n1 | cut -d' ' -f2)
  echo "$name: rank $rank killed ${delay} s after step 1 (step ${last:-0} was the last printed)," \
    "restarted, bitwise equal"
done

# --- 2. a hung rank: stopped, or in an endless loop ---------------------------------------
HANG=2
for seeded in 4:stop 5:loop; do
  RANDOM=${seeded%:*}
  how=${seeded#*:}
  rank=$((RANDOM % 2))
  step=$((1 + RANDOM % (STEPS - 1)))
  restarted_run "hang-$how" "--max-restarts 1 --hang-timeout $HANG" \
    --fail-rank $rank --fail-step $step --fail-how $how
  line=$(grep -m1 "redco-run: rank $rank hangs" "$WORK/hang-$how.log") ||
    fail "hang-$how: rank $rank was not named as hung" "$WORK/hang-$how.log"
  secs=$(echo "$line" | grep -o '[0-9.]* s (--hang-timeout' | cut -d' ' -f1)
  echo "hang-$how: $line"
  # A tick is T/10; the margin is for a loaded machine.
  awk -v s="$secs" -v t=$HANG 'BEGIN { exit !(s >= t - 0.3 && s < t + 2.5) }' ||
    fail "hang-$how: detected after $secs s, expected within [${HANG}-0.3, ${HANG}+2.5) s"
done

# --- 3. a long healthy step is not a hang --------------------------------------------------
status=0
"$run" -n 2 --output rank0 --hang-timeout 2 -- "$worker" --workdir "$WORK/slow" --steps 4 \
  --slow-rank 1 --slow-step 2 --slow-ms 5000 >"$WORK/slow.log" 2>&1 || status=$?
[ $status = 0 ] || fail "slow: a 5 s step with --hang-timeout 2 failed (status $status)" \
  "$WORK/slow.log"
grep -q 'hangs' "$WORK/slow.log" && fail "slow: a healthy step was called a hang" "$WORK/slow.log"
echo "slow: a 5 s step of tensor work with --hang-timeout 2 ran to the end"

# --- 4. giving up ----------------------------------------------------------------------------
status=0
"$run" -n 2 --output rank0 --max-restarts 1 -- "$worker" --workdir "$WORK/give-up" --steps 4 \
  --fail-rank 1 --fail-step 2 --fail-how exit --fail-always >"$WORK/give-up.log" 2>&1 || status=$?
[ $status = 3 ] || fail "give-up: expected the failed rank's status 3, got $status" \
  "$WORK/give-up.log"
grep -q 'redco-run: giving up after 1 restart (--max-restarts 1); the last failure: rank 1 exited with status 3' \
  "$WORK/give-up.log" || fail "give-up: no message naming the last failure" "$WORK/give-up.log"
echo "give-up: $(grep 'giving up' "$WORK/give-up.log")"
echo PASS

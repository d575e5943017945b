#!/usr/bin/env bash
# samples/reinforcement_learning learns in seconds:
#   ppo   CartPole-v1, 30 epochs (31k env steps): the greedy policy's mean
#         return over 100 episodes must reach 150 (a random policy: ~22);
#         then the same on 2 data-parallel processes (redco-run -n 2; SKIP
#         where redco was built without UCX); bad flags are one clear message.
#   ddpg  Pendulum-v1, 25 epochs (7k env steps, 5k updates): the noise-free
#         policy's mean return must reach -800 (a random policy: ~-1200; the
#         bar leaves room for other CPUs' rounding, which changes the run).
#   test_rl_sample.sh ppo|ddpg <sample> <redco-run>
set -uo pipefail
mode=$1 exe=$2 run=${3:?usage: test_rl_sample.sh ppo|ddpg <sample> <redco-run>}
. "$(dirname "$0")/two_processes.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-rl-XXXXXX")
trap 'rm -rf "$work"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}

expect_error() {  # expect_error <text> <args...>: exit 1 with <text> in one line
  local want=$1; shift
  out=$("$exe" "$@" --workdir "$work/bad" 2>&1) && { echo "FAIL: $* succeeded"; exit 1; }
  echo "$out" | grep -qF -- "$want" || { echo "$out"; echo "FAIL: $* did not say: $want"; exit 1; }
  echo "bad input ($*): $(echo "$out" | grep -F -- "$want")"
}

if [ "$mode" = ppo ]; then
  args=(--epochs 30 --min-return 150)
  expect_error "in [0, 1], got 1.5" --gamma 1.5
  expect_error "Pendulum-v1 has continuous actions" --env Pendulum-v1
  expect_error "CartPole-v1" --env MountainCar-v0
else
  args=(--epochs 25 --min-return -800)
  expect_error "CartPole-v1 has discrete actions" --env CartPole-v1
  expect_error "must be a number >= 0, got -1" --noise -1
fi
one=$("$exe" "${args[@]}" --workdir "$work/one" 2>&1) || {
  echo "$one" | grep -v '^train'; echo "FAIL: 1 process did not learn"; exit 1; }
echo "1 process: $(echo "$one" | grep '^evaluation')"
for f in metrics.jsonl returns.svg; do
  [ -s "$work/one/$f" ] || { echo "FAIL: no $f in the workdir"; exit 1; }
done
grep -q '"split": "rollout"' "$work/one/metrics.jsonl" || { echo "FAIL: no returns logged"; exit 1; }
two=$("$run" -n 2 --output rank0 -- "$exe" "${args[@]}" --workdir "$work/two" 2>&1) || {
  skip_without_ucx "$two"; echo "$two" | grep -v 'train' | tail; echo "FAIL: 2 processes did not learn"; exit 1; }
echo "2 processes: $(echo "$two" | sed 's/^\[rank 0\] //' | grep '^evaluation')"

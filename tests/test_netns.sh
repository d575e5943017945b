#!/usr/bin/env bash
# Two hosts for real: two network namespaces joined by a veth pair, one
# redco-run (one rank) in each, UCX over TCP across the link.
#   1. a data-parallel tiny GPT trains for a few steps; its losses must match
#      the same program run as one process on the same global batch;
#   2. the rank on "host" B is killed mid-run; the rank on "host" A must stop
#      with an error naming rank 1, well before its communication timeout
#      (a dead peer is detected, not waited out);
#   3. redco-run --max-restarts: a random rank is killed after a random step,
#      or hangs (SIGSTOP, an endless loop); both launchers restart the job,
#      which resumes from its checkpoint in the shared workdir and ends
#      bitwise equal to an uninterrupted run.
# Needs root (CAP_NET_ADMIN); where network namespaces cannot be made it
# says why and exits 77, Meson's "skipped".
#
#   tests/test_netns.sh build/tools/redco-run build/tests/dist_train_main build/tests/restart_worker
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 <redco-run> <dist_train_main> <restart_worker>" >&2; exit 2; }

RUN=$(realpath "$1")
PROG=$(realpath "$2")
RESTART_WORKER=$(realpath "$3")
ID="$$$RANDOM"  # unique per run: parallel runs must not share names
NS_A="redco-a-$ID"
NS_B="redco-b-$ID"
VETH_A="rca$ID"
VETH_B="rcb$ID"
VETH_A=${VETH_A:0:15}  # interface names have at most 15 characters
VETH_B=${VETH_B:0:15}
WORK=$(mktemp -d -t redco-netns-XXXXXX)
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$NS_A" 2>/dev/null || true  # takes its end of the veth pair along
  ip netns del "$NS_B" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if ! ip netns add "$NS_A" 2>"$WORK/why"; then
  echo "SKIP: cannot create a network namespace (needs root / CAP_NET_ADMIN): $(cat "$WORK/why")"
  exit 77
fi
ip netns add "$NS_B"
if ! ip link add "$VETH_A" type veth peer name "$VETH_B" 2>"$WORK/why"; then
  echo "SKIP: cannot create a veth pair (no veth support?): $(cat "$WORK/why")"
  exit 77
fi
ip link set "$VETH_A" netns "$NS_A"
ip link set "$VETH_B" netns "$NS_B"
ip -n "$NS_A" addr add 10.77.0.1/24 dev "$VETH_A"
ip -n "$NS_B" addr add 10.77.0.2/24 dev "$VETH_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VETH_A" up
ip -n "$NS_B" link set "$VETH_B" up

export UCX_TLS=tcp UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n
HOST0=10.77.0.1:29500
TIMEOUT_S=30  # rendezvous and per-message timeout of the ranks

# Starts node $1 (0 = A, 1 = B) of a 2-node job in its namespace, in the
# background, output to $WORK/$2.$1; the program gets the remaining args.
# LAUNCH_OPTS (extra redco-run options) and PROG may be set for one call.
start_node() {
  local node=$1 name=$2 ns veth
  shift 2
  if [ "$node" = 0 ]; then ns=$NS_A veth=$VETH_A; else ns=$NS_B veth=$VETH_B; fi
  # shellcheck disable=SC2086
  ip netns exec "$ns" env UCX_NET_DEVICES="$veth" timeout 120 "$RUN" --nnodes 2 \
    --node-rank "$node" --host0 "$HOST0" --job-id "$name" --timeout "$TIMEOUT_S" -n 1 \
    ${LAUNCH_OPTS:-} -- "$PROG" "$@" >"$WORK/$name.$node" 2>&1 &
  PIDS+=($!)
}

losses() { grep -o 'step [0-9]* loss [^ ]*' "$1" || true; }

# --- 1. training over the link matches one process -------------------------------------
STEPS=8
"$PROG" --steps $STEPS >"$WORK/single" 2>&1
start_node 0 train --steps $STEPS
start_node 1 train --steps $STEPS
status=0
wait "${PIDS[0]}" || status=$?
wait "${PIDS[1]}" || status=$?
PIDS=()
if [ $status -ne 0 ] || [ "$(losses "$WORK/train.0" | wc -l)" != $STEPS ]; then
  echo "FAIL: the 2-namespace training run failed (status $status)"
  tail -n 20 "$WORK/train.0" "$WORK/train.1"
  exit 1
fi
paste -d ' ' <(losses "$WORK/single") <(losses "$WORK/train.0") | awk '
  { d = $4 - $8; if (d < 0) d = -d; a = $4 < 0 ? -$4 : $4
    printf "step %s: 1 process %s, 2 namespaces %s\n", $2, $4, $8
    if (d > 1e-5 * a + 1e-6) bad = 1 }
  END { if (bad) { print "FAIL: the losses differ"; exit 1 } }'
awk 'NR == 1 { first = $4 } END { if (!($4 < first)) { print "FAIL: the loss did not fall"; exit 1 } }' \
  <(losses "$WORK/single")

# --- 2. a rank killed mid-run ends the other with an error naming it -------------------
start_node 0 kill --steps 100000 --step-ms 20
start_node 1 kill --steps 100000 --step-ms 20 --pid-file "$WORK/rank1.pid"
for _ in $(seq 600); do  # up to 60 s for a few steps over the link
  [ "$(losses "$WORK/kill.0" | wc -l)" -ge 5 ] && break
  sleep 0.1
done
if [ "$(losses "$WORK/kill.0" | wc -l)" -lt 5 ]; then
  echo "FAIL: the run to be interrupted never got going"
  tail -n 20 "$WORK/kill.0" "$WORK/kill.1"
  exit 1
fi
t0=$(date +%s.%N)
kill -9 "$(cat "$WORK/rank1.pid")"
status=0
wait "${PIDS[0]}" || status=$?
t1=$(date +%s.%N)
wait "${PIDS[1]}" || true
PIDS=()
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "rank 0 stopped $secs s after rank 1 was killed (status $status):"
grep -i 'error\|fail\|rank 1' "$WORK/kill.0" | tail -n 3
if [ $status -eq 0 ] || [ $status -eq 124 ]; then
  echo "FAIL: rank 0 did not fail on its own (status $status; 124 = hung until killed)"
  exit 1
fi
if ! grep -q 'rank 1 failed or disconnected' "$WORK/kill.0"; then
  echo "FAIL: rank 0's error does not say that rank 1 failed"
  exit 1
fi
if ! awk -v s="$secs" -v t="$TIMEOUT_S" 'BEGIN { exit !(s < t) }'; then
  echo "FAIL: rank 0 took $secs s, as long as its timeout: the death was not detected"
  exit 1
fi

# --- 3. restarts across the two hosts -----------------------------------------------------
STEPS=6
final() { echo "$1/ckpt/step-$(printf %06d $STEPS)"; }
# The reference: the same 2-rank job, uninterrupted (the collectives are
# deterministic, so the transport does not change a bit).
UCX_TLS=tcp,self UCX_NET_DEVICES=all "$RUN" -n 2 --output rank0 -- "$RESTART_WORKER" --workdir "$WORK/ref" \
  --steps $STEPS >"$WORK/ref.log" 2>&1 || { echo "FAIL: the reference run failed"; tail "$WORK/ref.log"; exit 1; }
for seed in 1 2 3; do
  RANDOM=$seed
  rank=$((RANDOM % 2))
  step=$((1 + RANDOM % (STEPS - 1)))
  how=$(echo kill stop loop | cut -d' ' -f$seed)
  name="restart-$seed"
  LAUNCH_OPTS="--max-restarts 2 --hang-timeout 3" PROG=$RESTART_WORKER start_node 0 "$name" \
    --workdir "$WORK/$name" --steps $STEPS --fail-rank $rank --fail-step $step --fail-how $how
  LAUNCH_OPTS="--max-restarts 2 --hang-timeout 3" PROG=$RESTART_WORKER start_node 1 "$name" \
    --workdir "$WORK/$name" --steps $STEPS --fail-rank $rank --fail-step $step --fail-how $how
  status=0
  wait "${PIDS[0]}" || status=$?
  wait "${PIDS[1]}" || status=$((status + $?))
  PIDS=()
  echo "$name: rank $rank fails ($how) after step $step:"
  grep -h 'redco-run: ' "$WORK/$name.0" "$WORK/$name.1" | sed 's/^/  /'
  if [ $status -ne 0 ] || ! grep -q 'restarting the job' "$WORK/$name.0" ||
    ! grep -q 'restarting the job' "$WORK/$name.1"; then
    echo "FAIL: $name: both nodes must restart and finish (status $status)"
    tail -n 20 "$WORK/$name.0" "$WORK/$name.1"
    exit 1
  fi
  if [ "$how" != kill ] && ! grep -q "rank $rank hangs" "$WORK/$name.$rank"; then
    echo "FAIL: $name: the launcher of rank $rank did not name it as hung"
    exit 1
  fi
  for f in params opt_state; do
    if ! cmp -s "$(final "$WORK/ref")/$f.safetensors" "$(final "$WORK/$name")/$f.safetensors"; then
      echo "FAIL: $name: $f.safetensors differs from the uninterrupted run's"
      exit 1
    fi
  done
  echo "  final parameters and optimizer state bitwise equal to the uninterrupted run's"
done
echo "PASS"

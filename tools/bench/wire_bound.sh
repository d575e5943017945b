#!/usr/bin/env bash
# Data-parallel training where the wire, not the CPU, is the bottleneck: two
# "hosts" (Linux network namespaces) joined by one veth link shaped with tc's
# token-bucket filter to RATE (default 1gbit) in each direction, one rank in
# each, UCX over TCP on that link only. Runs, taking turns:
#   - a raw TCP transfer across the link (the bandwidth the time model is given),
#   - bench_dp_overlap: one GPT step with the gradient all-reduce overlapped
#     with backward, the same step serial, and the all-reduce alone,
#   - bench_gpt_train --trainer --zero 3 on the two hosts, and on one host
#     alone with the same rows (its compute),
# then prints the time model's step (plan::step_time through redco-plan) for
# each, from the measured compute rate and link bandwidth.
#   tools/bench/wire_bound.sh [build-dir] [rate] [rounds]
# Needs root (ip netns, tc). tc's netem (delay) is absent from some kernels:
# the link is rate-shaped only.
set -euo pipefail
build=${1:-build} rate=${2:-1gbit} rounds=${3:-3}
build=$(realpath "$build")
here=$(cd "$(dirname "$0")" && pwd)
ns=(redco-h0 redco-h1)
addr=(10.77.0.1 10.77.0.2)

cleanup() { for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done; }
trap cleanup EXIT
cleanup
for n in "${ns[@]}"; do ip netns add "$n"; done
ip link add wire-a type veth peer name wire-b
ip link set wire-a netns "${ns[0]}"
ip link set wire-b netns "${ns[1]}"
for i in 0 1; do
  n=${ns[$i]}
  ip -n "$n" link set "wire-$([ "$i" = 0 ] && echo a || echo b)" name wire
  ip -n "$n" addr add "${addr[$i]}/24" dev wire
  ip -n "$n" link set wire up
  ip -n "$n" link set lo up
  # burst: what may leave back to back; 256 KiB keeps the 1 Gbit/s rate
  # within a percent while the kernel timer fires every few ms.
  tc -n "$n" qdisc add dev wire root tbf rate "$rate" burst 256kb latency 100ms
done

# The link's TCP payload rate, one stream, 300 MB.
probe() {
  ip netns exec "${ns[1]}" python3 - <<'PY' &
import socket, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", 5099)); l.listen(1)
c, _ = l.accept(); n = 0; t = time.time()
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(f"link: {n / (time.time() - t) / 1e6:.1f} MB/s of TCP payload")
PY
  sleep 0.5
  ip netns exec "${ns[0]}" python3 -c "
import socket
s = socket.create_connection(('${addr[1]}', 5099)); b = b'x' * (1 << 20)
for _ in range(300): s.sendall(b)
s.close()"
  wait
}

# on_both <program and args>: one rank on each host.
on_both() {
  local i pids=()
  for i in 1 0; do
    ip netns exec "${ns[$i]}" env UCX_TLS=tcp,self UCX_NET_DEVICES=wire \
      "$build/tools/redco-run" -n 1 --nnodes 2 --node-rank "$i" --host0 "${addr[0]}:29533" \
      --output rank0 -- "$@" &
    pids+=($!)
  done
  wait "${pids[@]}"
}

tokens=$(mktemp "${TMPDIR:-/tmp}/redco-tokens-XXXXXX")
trap 'rm -f "$tokens"; cleanup' EXIT
python3 -c "
import random, struct, sys
random.seed(0)
sys.stdout.buffer.write(struct.pack('<200000i', *[random.randrange(50257) for _ in range(200000)]))" >"$tokens"

gpt=(--config M --trainer --threads 1 --tokens "$tokens" --batch 2 --seq-len 128 --steps 5 --warmup 1)
overlap=(--dim 768 --layers 12 --heads 12 --vocab 50257 --len 128 --batch 2 --bucket-kb 25600
  --steps 2)
step_ms() { grep -o "step_ms_median=[0-9.]*" | cut -d= -f2; }
# GPT-2 small's config.json for the time model (redco-plan reads only the shape).
config=$(mktemp "${TMPDIR:-/tmp}/redco-gpt2-XXXXXX.json")
trap 'rm -f "$tokens" "$config"; cleanup' EXIT
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
  "n_layer": 12, "n_head": 12, "tie_word_embeddings": true}' >"$config"
# plan <flops> <zero>: the time model's step in ms for one replica a host.
plan() {
  "$build/tools/redco-plan" "$config" --device cpu --flops "$1" --devices 2 --hosts 2 \
    --inter-link tcp1 --seq-len 128 --global-batch 4 --micro-batch 2 --n-model-shards 1 \
    --zero "$2" --recompute off --json |
    python3 -c "import json, sys; p = json.load(sys.stdin)['plans'][0]
print(f\"{p['step_seconds'] * 1e3:.0f} {p['compute_seconds'] * 1e3:.0f}\")"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  echo "== round $r"
  probe
  on_both "$build/tools/bench/bench_dp_overlap" "${overlap[@]}" | grep -E "^fwd|^hidden"
  alone=$(ip netns exec "${ns[0]}" "$build/tools/bench/bench_gpt_train" "${gpt[@]}" | step_ms)
  # The time model's device rate: what makes its compute equal the step measured alone.
  read -r _ c0 <<<"$(plan 1e11 0)"
  flops=$(python3 -c "print(1e11 * $c0 / $alone)")
  echo "1 host, the same rows: $alone ms a step (the time model's rate: $flops FLOP/s)"
  for z in 0 2 3; do
    got=$(on_both "$build/tools/bench/bench_gpt_train" "${gpt[@]}" --zero "$z" | step_ms)
    read -r want _ <<<"$(plan "$flops" "$z")"
    echo "2 hosts, ZeRO-$z: $got ms a step; time model $want ms ($(python3 -c "print(f'{$want / $got:.3f}')"))"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

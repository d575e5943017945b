#!/usr/bin/env bash
# The memory model (redco/plan/memory_model.hpp) against the caching
# allocator under the Trainer: GPT-2 small (bench_gpt_train --config M),
# 4 rows per replica, one or two processes (redco-run -n 2, UCX), model
# shards, replicas, ZeRO 0-3, recomputation, bf16, two sequence lengths.
# Each run takes two steps and prints, per rank, the allocator's high-water
# mark and the model's figure for that rank; this prints one Markdown row
# per rank.
#   tools/bench/bench_memory_model.sh [build-dir] [tokens.bin]
set -uo pipefail
build=${1:-build} tokens=${2:-}
if [ -z "$tokens" ]; then
  tokens=$(mktemp "${TMPDIR:-/tmp}/redco-tokens-XXXXXX")
  trap 'rm -f "$tokens"' EXIT
  python3 -c "
import random, struct, sys
random.seed(0)
n = 400000
sys.stdout.buffer.write(struct.pack('<%di' % n, *[random.randrange(50257) for _ in range(n)]))" >"$tokens"
fi
bench=$build/tools/bench/bench_gpt_train
echo "| run | rank | measured peak MiB | modelled MiB | model / measured |"
echo "|---|---|---|---|---|"
run() {  # processes label args...
  local n=$1 label=$2 out
  shift 2
  local cmd=("$bench" --config M --trainer --steps 1 --warmup 1 --tokens "$tokens" "$@")
  [ "$n" -gt 1 ] && cmd=("$build/tools/redco-run" -n "$n" -- "${cmd[@]}")
  out=$("${cmd[@]}" 2>&1) || { echo "| $label | failed: $(echo "$out" | tail -1) |"; return; }
  echo "$out" | grep -o "memory rank [0-9]*.*allocator peak [0-9.]* MiB (modelled [0-9.]*)" |
    sed -E 's/memory rank ([0-9]+).*allocator peak ([0-9.]+) MiB \(modelled ([0-9.]+)\)/\1 \2 \3/' |
    sort -n | while read -r rank got want; do
      echo "| $label | $rank | $got | $want | $(python3 -c "print(f'{$want / $got:.3f}')") |"
    done
}
run 1 "1 rank, 512 tokens, f32"
run 1 "1 rank, 512, recompute" --recompute
run 1 "1 rank, 512, bf16" --dtype bf16
run 1 "1 rank, 1024, f32" --seq-len 1024
run 2 "2 shards, 512" --n-model-shards 2
run 2 "2 shards, 512, recompute" --n-model-shards 2 --recompute
run 2 "2 replicas, 512, ZeRO-0"
run 2 "2 replicas, 512, ZeRO-1" --zero 1
run 2 "2 replicas, 512, ZeRO-2" --zero 2
run 2 "2 replicas, 512, ZeRO-2, recompute" --zero 2 --recompute
run 2 "2 replicas, 512, ZeRO-3" --zero 3
run 2 "2 replicas, 512, ZeRO-3, recompute" --zero 3 --recompute
run 2 "2 shards, 1024, bf16" --n-model-shards 2 --seq-len 1024 --dtype bf16
run 2 "2 replicas, 1024, ZeRO-1" --zero 1 --seq-len 1024

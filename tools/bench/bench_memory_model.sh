#!/usr/bin/env bash
# The memory model (redco/plan/memory_model.hpp) against the caching
# allocator under the Trainer: GPT-2 small (bench_gpt_train --config M),
# 4 rows per replica, one or two processes (redco-run -n 2, UCX), model
# shards, replicas, ZeRO 0-3, recomputation, bf16, two sequence lengths.
# Then LLaMA (GQA), T5 and BART through bench_train_hf: each family's
# published config (tools/redco-plan/configs) cut to 4 layers of width 512
# (vocabulary 8000), 2 rows a replica. Each run takes two steps and prints,
# per rank, the allocator's high-water mark and the model's figure for that
# rank; this prints one Markdown row per rank.
#   tools/bench/bench_memory_model.sh [build-dir] [tokens.bin]
set -uo pipefail
build=${1:-build} tokens=${2:-}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/redco-memory-model-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
if [ -z "$tokens" ]; then
  tokens=$scratch/tokens.bin
  python3 -c "
import random, struct, sys
random.seed(0)
n = 400000
sys.stdout.buffer.write(struct.pack('<%di' % n, *[random.randrange(50257) for _ in range(n)]))" >"$tokens"
fi
gpt=$build/tools/bench/bench_gpt_train hf=$build/tools/bench/bench_train_hf
echo "| run | rank | measured peak MiB | modelled MiB | model / measured |"
echo "|---|---|---|---|---|"
run() {  # processes label command...
  local n=$1 label=$2 out
  shift 2
  local cmd=("$@")
  [ "$n" -gt 1 ] && cmd=("$build/tools/redco-run" -n "$n" -- "${cmd[@]}")
  out=$("${cmd[@]}" 2>&1) || { echo "| $label | failed: $(echo "$out" | tail -1) |"; return; }
  echo "$out" | grep -o "memory rank [0-9]*.*allocator peak [0-9.]* MiB (modelled [0-9.]*)" |
    sed -E 's/memory rank ([0-9]+).*allocator peak ([0-9.]+) MiB \(modelled ([0-9.]+)\)/\1 \2 \3/' |
    sort -n | while read -r rank got want; do
      echo "| $label | $rank | $got | $want | $(python3 -c "print(f'{$want / $got:.3f}')") |"
    done
}
m=("$gpt" --config M --trainer --steps 1 --warmup 1 --tokens "$tokens")
run 1 "1 rank, 512 tokens, f32" "${m[@]}"
run 1 "1 rank, 512, recompute" "${m[@]}" --recompute
run 1 "1 rank, 512, bf16" "${m[@]}" --dtype bf16
run 1 "1 rank, 1024, f32" "${m[@]}" --seq-len 1024
run 2 "2 shards, 512" "${m[@]}" --n-model-shards 2
run 2 "2 shards, 512, recompute" "${m[@]}" --n-model-shards 2 --recompute
run 2 "2 replicas, 512, ZeRO-0" "${m[@]}"
run 2 "2 replicas, 512, ZeRO-1" "${m[@]}" --zero 1
run 2 "2 replicas, 512, ZeRO-2" "${m[@]}" --zero 2
run 2 "2 replicas, 512, ZeRO-2, recompute" "${m[@]}" --zero 2 --recompute
run 2 "2 replicas, 512, ZeRO-3" "${m[@]}" --zero 3
run 2 "2 replicas, 512, ZeRO-3, recompute" "${m[@]}" --zero 3 --recompute
run 2 "2 shards, 1024, bf16" "${m[@]}" --n-model-shards 2 --seq-len 1024 --dtype bf16
run 2 "2 replicas, 1024, ZeRO-1" "${m[@]}" --zero 1 --seq-len 1024

configs=$scratch
python3 - "$(dirname "$0")/../redco-plan/configs" "$configs" <<'PY'
import json, sys
src, dst = sys.argv[1:]
small = {
    "llama-7b": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=4, vocab_size=8000),
    "t5-11b": dict(d_model=512, d_ff=2048, d_kv=64, num_heads=8, num_layers=4,
                   num_decoder_layers=4, vocab_size=8000),
    "bart-large": dict(d_model=512, encoder_layers=4, decoder_layers=4, encoder_attention_heads=8,
                       decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                       vocab_size=8000),
}
for name, over in small.items():
    c = json.load(open(f"{src}/{name}.json"))
    c.update(over)
    json.dump(c, open(f"{dst}/{name.split('-')[0]}.json", "w"))
PY
for family in llama t5 bart; do
  f=("$hf" "$configs/$family.json" --batch 2 --steps 1 --warmup 1)
  run 1 "$family, 1 rank, 256 tokens" "${f[@]}" --seq-len 256
  run 1 "$family, 1 rank, 512, recompute" "${f[@]}" --seq-len 512 --recompute
  run 2 "$family, 2 shards, 256" "${f[@]}" --seq-len 256 --n-model-shards 2
  run 2 "$family, 2 replicas, 256, ZeRO-2" "${f[@]}" --seq-len 256 --zero 2
  run 2 "$family, 2 replicas, 256, ZeRO-3, recompute" "${f[@]}" --seq-len 256 --zero 3 --recompute
done

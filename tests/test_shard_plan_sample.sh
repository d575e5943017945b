#!/usr/bin/env bash
# The shard_plan sample as its README runs it: GPT-2 over 2 shards splits the
# attention and MLP weights as the two rules say (q/k/v and fc1 by rows, o and
# fc2 by columns), a vocabulary that divides splits the embedding, one that
# does not is replicated with a note, the per-shard bytes add up to the
# printed total, and a checkpoint folder's plan (--from) follows the same rules.
#   test_shard_plan_sample.sh <shard_plan> <fixtures/hf>
set -uo pipefail
exe=$1 hf=$2
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
row() {  # split and bytes per shard: "dim 0 1024" or "- 3072"
  echo "$out" | awk -v p="$1" '$1 == p { if ($(NF-1) == "-") print "-", $NF; else print $(NF-2), $(NF-1), $NF }'
}

out=$("$exe" --shards 2 --layers 1 --vocab 50304) || fail "--vocab 50304"
[ "$(row h.0.attn.q_proj.weight)" = "dim 0 1179648" ] || fail "q_proj: $(row h.0.attn.q_proj.weight)"
[ "$(row h.0.attn.o_proj.weight)" = "dim 1 1179648" ] || fail "o_proj"
[ "$(row h.0.mlp.fc2.weight)" = "dim 1 4718592" ] || fail "fc2"
[ "$(row h.0.attn.o_proj.bias)" = "- 3072" ] || fail "o_proj.bias is whole on every shard"
[ "$(row wte.weight)" = "dim 0 77266944" ] || fail "wte splits when 50304 divides"
sum=$(echo "$out" | awk '/^(wte|wpe|h\.|ln_f)/ { s += $NF } END { print s }')
echo "$out" | grep -q "^total: $sum bytes per shard" || fail "rows add to $sum, not the total"

out=$("$exe" --shards 2 --layers 1) || fail "default vocabulary"
[ "$(row wte.weight)" = "- 154389504" ] || fail "wte is replicated when 50257 does not divide"
echo "$out" | grep -q "note: replicated: wte.weight" || fail "no note for the replicated wte"

out=$("$exe" --shards 2 --from "$hf/llama") || fail "--from llama"
[ "$(row layers.0.self_attn.k_proj.weight)" = "dim 0 1024" ] || fail "llama k_proj"
[ "$(row layers.0.mlp.down_proj.weight | cut -d' ' -f1-2)" = "dim 1" ] || fail "llama down_proj"

out=$("$exe" --shards 0 2>&1) && fail "--shards 0 was accepted"
echo "$out" | grep -q "must be an integer >= 1, got 0" || fail "--shards 0 message"
echo "shard_plan: GPT-2 and LLaMA plans as the rules say; rows add up to the total"

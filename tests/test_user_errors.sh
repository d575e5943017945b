#!/usr/bin/env bash
# Mistakes a newcomer makes with the samples and redco-generate, each ending
# in one message that names the culprit and the fix (status 1, a run-time
# error), not in a later failure somewhere else:
# - --init-from a folder that does not exist: said first, not "has no
#   tokenizer.json";
# - a tokenizer with more ids than the model's vocabulary: said at load time,
#   not as an embedding index out of range;
# - a text prompt to a folder without tokenizer.json: the tokenizer is named;
# - a workdir tokenizer in the old layout (tokenizer/vocab.json +
#   merges.txt): read and kept as tokenizer.json, or, at another vocabulary
#   size, refused by name, never silently replaced by a new one.
# - REDCO_PREFILL naming no prefill kernel: refused as the weights load.
# - --n-model-shards auto with too little memory per device: refused before
#   training with the planner's breakdown (not an out-of-memory kill).
#   test_user_errors.sh <language_modeling> <lora> <redco-generate> <tests/fixtures/hf>
set -uo pipefail
lm=$1 lora=$2 gen=$3 hf=$4
command -v bible >/dev/null || { echo "SKIP: the bible-kjv package is not installed"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/redco-user-errors-XXXXXX") && trap 'rm -rf "$tmp"' EXIT
bad=0
# fails <pattern> <command...>: the command exits with status 1 and its
# output contains the pattern.
fails() {
  local want=$1 out status=0
  shift
  out=$("$@" 2>&1) || status=$?
  if [ $status != 1 ]; then
    echo "FAIL: '$*' exited with status $status, expected 1 ('$want'):"; echo "$out"; bad=1
  elif [[ "$out" != *"$want"* ]]; then
    echo "FAIL: '$*' printed:"; echo "$out"; echo "expected: '$want'"; bad=1
  else
    echo "ok: $want"
  fi
}
tiny=(--dim 32 --layers 1 --heads 2 --context 32 --steps 1 --max-new 2)

fails "/nonexistent/gpt2 is not a folder" "$lm" "${tiny[@]}" --init-from /nonexistent/gpt2
# The text fixtures' 2001 ids against the tiny GPT-2's 96-row embedding.
fails "the tokenizer has 2001 ids but the model's vocabulary has 96" \
  "$lm" "${tiny[@]}" --init-from "$hf/gpt2" --tokenizer "$hf/gpt2_text/tokenizer.json" \
  --workdir "$tmp/lm"
cp -r "$hf/gpt2" "$tmp/mixed" && cp "$hf/gpt2_text/tokenizer.json" "$tmp/mixed/"
fails "tokenizer.json has 2001 ids but the model's vocabulary has 96" \
  "$lora" --steps 1 --init-from "$tmp/mixed" --workdir "$tmp/lora"
fails "because $hf/gpt2 has no tokenizer.json; for text prompts put the model's tokenizer.json" \
  "$gen" "$hf/gpt2" --prompt "In the beginning"
# --n-model-shards auto with less memory than the model needs: refused before
# training, with the planner's breakdown; a size that is not one. (A shard
# count that is neither a number nor auto is a command-line error: test_cli.)
fails "does not fit 1 device(s) of 1.0 MiB at 32 tokens a row" \
  "$lm" "${tiny[@]}" --n-model-shards auto --memory-per-device 1MiB --workdir "$tmp/auto"
fails "--memory-per-device '3 MB' is not a size" \
  "$lm" "${tiny[@]}" --n-model-shards auto --memory-per-device "3 MB" --workdir "$tmp/auto"
# A shard count given with a budget is checked against it the same way; the
# LoRA sample plans (as full fine-tuning) like the others.
fails "does not fit 1 device(s) of 1.0 MiB at 32 tokens a row: the nearest configuration, 1 model shard(s)" \
  "$lm" "${tiny[@]}" --n-model-shards 1 --memory-per-device 1MiB --workdir "$tmp/auto"
fails "does not fit 1 device(s) of 1.0 MiB at 32 tokens a row" \
  "$lora" --steps 1 --base-steps 1 --dim 32 --layers 1 --context 32 --n-model-shards auto \
  --memory-per-device 1MiB --workdir "$tmp/auto-lora"
# A prefill kernel for A/B runs that names none: refused as the weights load.
fails "REDCO_PREFILL is 'fast': use chain" \
  env REDCO_PREFILL=fast "$gen" "$hf/llama" --ids --prompt 1,2,3 --dtype int8 --max-new-tokens 1

# The old layout: learn a tokenizer, write it as vocab.json + merges.txt in
# another workdir's tokenizer/, and run there. (One step does not reach the
# sample's bar, so its status is 1; what matters is that it ran through.)
"$lm" "${tiny[@]}" --vocab 300 --workdir "$tmp/new" >"$tmp/new.log" 2>&1
grep -q "^validation loss" "$tmp/new.log" && [ -f "$tmp/new/tokenizer.json" ] ||
  { echo "FAIL: the sample at vocab 300:"; cat "$tmp/new.log"; exit 1; }
mkdir -p "$tmp/old/tokenizer" "$tmp/other/tokenizer"
python3 - "$tmp/new/tokenizer.json" "$tmp/old/tokenizer" <<'PY' || exit 1
import json, sys
model = json.load(open(sys.argv[1]))["model"]
json.dump(model["vocab"], open(sys.argv[2] + "/vocab.json", "w"), ensure_ascii=False)
with open(sys.argv[2] + "/merges.txt", "w") as f:
    f.write("#version: 0.2\n")
    for m in model["merges"]:
        f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
PY
cp "$tmp/old/tokenizer/"* "$tmp/other/tokenizer/"
out=$("$lm" "${tiny[@]}" --vocab 300 --workdir "$tmp/old" 2>&1)
[[ "$out" == *"validation loss"* ]] ||
  { echo "FAIL: the sample on an old-layout workdir:"; echo "$out"; bad=1; }
[[ "$out" == *"read the tokenizer in the old layout $tmp/old/tokenizer"* ]] ||
  { echo "FAIL: no note about the old layout:"; echo "$out"; bad=1; }
python3 - "$tmp/new/tokenizer.json" "$tmp/old/tokenizer.json" <<'PY' || bad=1
import json, sys
a, b = (json.load(open(p))["model"] for p in sys.argv[1:3])
norm = lambda ms: [m if isinstance(m, str) else " ".join(m) for m in ms]
if a["vocab"] != b["vocab"] or norm(a["merges"]) != norm(b["merges"]):
    sys.exit("FAIL: the old-layout tokenizer was not kept as it was")
print("ok: the old-layout tokenizer kept as tokenizer.json")
PY
fails "$tmp/other/tokenizer holds a tokenizer in the old layout (vocab.json + merges.txt) with 300 tokens, not the 400 asked for" \
  "$lm" "${tiny[@]}" --vocab 400 --workdir "$tmp/other"
exit $bad

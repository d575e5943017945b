#!/usr/bin/env bash
# redco-generate on the encoder-decoder fixtures: sources in (one per line),
# generated ids out, equal to transformers.generate on the same right-padded
# batch (the "batch_tokens" case of tests/fixtures/hf/{t5,bart}/generation.json,
# made by tests/python/make_generation_goldens.py), the decoder start, end and
# forced ids taken from the checkpoint's generation_config.json.
#   test_generate_cli.sh <redco-generate> <tests/fixtures/hf>
set -uo pipefail
gen=$1 hf=$2
bad=0
sources=$'5 17 33 40 2\n60 4\n9 9 41 70 12 3 88 21'
# check <fixture> <expected lines> <flags...>
check() {
  local fixture=$1 want=$2 out
  shift 2
  out=$(printf '%s\n' "$sources" | "$gen" "$hf/$fixture" --max-new-tokens 12 "$@" 2>&1)
  if [[ "$out" != "$want" ]]; then
    echo "FAIL: redco-generate $fixture $*:"; echo "$out"; echo "expected:"; echo "$want"; bad=1
  fi
}
check t5 $'42 77 77 77 77 77 77 77 77 77 77 77\n20 20 20 20 20 20 20 20 20 20 20 20\n42 10 77 64 77 77 77 77 77 77 77 42'
check bart $'41 41 41 41 41 41 41 41 41 41 41 2\n25 25 25 25 25 25 25 25 25 25 25 2\n13 13 13 62 62 62 88 88 88 88 88 2'
# A flag overrides the checkpoint: no forced end id, and a forced first token.
check bart $'7 41 41 41 41 41 41 41 41 41 41 41\n7 25 25 25 25 25 25 25 25 25 25 25\n7 62 62 62 62 62 62 62 62 62 62 62' --forced-eos -1 --forced-bos 7
# A decoder-only checkpoint stops at its own end-of-sequence id, read from
# generation_config.json (else config.json) as transformers reads it; --eos
# overrides. Greedy from 5,17,33 the GPT-J fixture gives 390 1899 472 472 ...
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-gen-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$hf/gptj_text" "$work/gptj"
eos() { sed -i -E "s/\"eos_token_id\": *[0-9]+/\"eos_token_id\": $2/" "$work/gptj/$1"; }
ids() { "$gen" "$work/gptj" --ids --prompt 5,17,33 --max-new-tokens 8 "$@" 2>&1; }
want=$'390 1899 472 472 472 472 1285 534'
[[ $(ids) == "$want" ]] || { echo "FAIL: GPT-J fixture greedy: $(ids)"; bad=1; }
# Reduced weights, row-major and packed in decode panels (int8 and bf16
# panels are what --weight-layout auto picks on AVX-512): this fixture's
# greedy tokens hold at every precision and layout.
for dtype in int8 bf16; do
  for layout in rows panels; do
    got=$(ids --dtype $dtype --weight-layout $layout)
    [[ "$got" == "$want" ]] || { echo "FAIL: --dtype $dtype --weight-layout $layout: $got"; bad=1; }
  done
done
eos generation_config.json 1899
[[ $(ids) == "390 1899" ]] || { echo "FAIL: generation_config.json's eos ignored: $(ids)"; bad=1; }
[[ $(ids --eos 472) == "390 1899 472" ]] || { echo "FAIL: --eos 472: $(ids --eos 472)"; bad=1; }
rm "$work/gptj/generation_config.json"
eos config.json 472
[[ $(ids) == "390 1899 472" ]] || { echo "FAIL: config.json's eos ignored: $(ids)"; bad=1; }
# --threads 1 (like llama-bench -t 1): the same tokens, and --bench reports the cap.
[[ $(ids --eos 472 --threads 1) == "390 1899 472" ]] || { echo "FAIL: --threads 1: $(ids --threads 1)"; bad=1; }
out=$("$gen" "$work/gptj" --bench --batch 1 --prompt-length 4 --max-new-tokens 3 --threads 1 2>&1)
[[ "$out" == *'"threads": 1}'* ]] || { echo "FAIL: --bench --threads 1 printed: $out"; bad=1; }
out=$("$gen" "$work/gptj" --threads -1 --prompt 1 2>&1)
[[ $? -eq 2 && "$out" == *"--threads"* ]] || { echo "FAIL: --threads -1 was not refused: $out"; bad=1; }
out=$("$gen" "$hf/bert" --prompt 1 2>&1) && { echo "FAIL: a BERT folder was accepted"; bad=1; }
[[ "$out" == *"an encoder without a decoder"* ]] || { echo "FAIL: BERT refusal: $out"; bad=1; }
exit $bad

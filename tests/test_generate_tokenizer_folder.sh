#!/usr/bin/env bash
# redco-generate's tokenizer lookup on folders as transformers saves them
# (tests/data/tokenizers/saved): GPT-2's slow vocab.json + merges.txt give
# text mode; a folder with only a SentencePiece tokenizer.model is an error
# naming the file and the command that writes tokenizer.json (not a silent
# switch to token ids), and --ids still runs it; no tokenizer files: ids.
#   test_generate_tokenizer_folder.sh <redco-generate> <tests/fixtures/hf> <tests/data/tokenizers/saved>
set -uo pipefail
gen=$1 hf=$2 saved=$3
bad=0
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-gen-tok-XXXXXX")
trap 'rm -rf "$work"' EXIT
model="$work/model"
mkdir "$model"
cp "$hf/gptj_text/config.json" "$hf/gptj_text/model.safetensors" "$model/"
run() { "$gen" "$model" "$@" 2>&1; }

out=$(run --prompt 5,17,33 --max-new-tokens 3) || { echo "FAIL: no tokenizer files, ids: $out"; bad=1; }
out=$(run --prompt "In the beginning") && { echo "FAIL: text without a tokenizer: $out"; bad=1; }

cp "$saved/llama_slow/tokenizer.model" "$saved/llama_slow/tokenizer_config.json" "$model/"
out=$(run --prompt "In the beginning") && { echo "FAIL: tokenizer.model alone was accepted"; bad=1; }
for want in "tokenizer.model" "no tokenizer.json" \
    "T.from_pretrained('$model').save_pretrained('$model')" "--ids"; do
  [[ "$out" == *"$want"* ]] || { echo "FAIL: the message lacks '$want': $out"; bad=1; }
done
out=$(run --ids --prompt 5,17,33 --max-new-tokens 3) || { echo "FAIL: --ids with tokenizer.model: $out"; bad=1; }

rm "$model/tokenizer.model" "$model/tokenizer_config.json"
cp "$saved/gpt2_slow/"* "$model/"
# The text prompt tokenises (the tiny tokenizer is not the model's, so
# nothing is generated to decode).
out=$(run --prompt "In the beginning" --max-new-tokens 0) ||
  { echo "FAIL: GPT-2's slow files, text: $out"; bad=1; }
exit $bad

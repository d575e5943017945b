#!/usr/bin/env bash
# samples/text_to_text learns, on a tiny T5 trained for seconds on four books
# of KJV -> WEB pairs (a short copy stage, then translation): its validation loss ends 0.5 nats below the unigram
# entropy of the validation targets (the sample's own exit status), and beam
# search (4) returns well-formed translations of the test verses: text, no
# empty output, BLEU and chrF printed. Then 2 processes with the model in 2
# shards give the same validation loss and scores within fp32 noise.
# Exits 77 (SKIP) without the KJV and WEB SWORD modules or without libsword,
# and after the 1-process part where redco was built without UCX.
#   test_text_to_text.sh <sample> <redco-run>
set -uo pipefail
exe=$1 run=${2:?usage: test_text_to_text.sh <sample> <redco-run>}
. "$(dirname "$0")/two_processes.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-t2t-XXXXXX")
trap 'rm -rf "$work"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}
for m in engKJV2006eb engWEB2015eb; do
  [ -d /usr/share/sword/modules/texts/ztext/$m ] || {
    echo "SKIP: the SWORD module $m is not installed (apt-get install sword-text-kjv sword-text-web)"
    exit 77
  }
done
args=(--train-books Gen,Exod,Josh,Judg --valid-books Jonah --test-books Phlm --copy-steps 100
  --steps 300 --eval-every 300 --dim 64 --hidden 128 --layers 1 --heads 2 --vocab 600 --max-length 48
  --batch-size 16 --lr 5e-3)

one=$("$exe" "${args[@]}" --workdir "$work/one" 2>&1)
status=$?
if [ $status -ne 0 ] && echo "$one" | grep -q 'built without libsword'; then
  echo "SKIP: redco was built without libsword"; exit 77
fi
echo "$one" | grep -v '^train' | tail -8
[ $status -eq 0 ] || { echo "FAIL: the validation loss is not clearly below the unigram entropy"; exit 1; }
test_line=$(echo "$one" | grep -E '^test \(25 verses\): BLEU [0-9.]+, chrF [0-9.]+; copying') || {
  echo "FAIL: no test scores"; exit 1; }
outs=$(echo "$one" | grep -c '^out: .*[[:alpha:]]')
[ "$outs" -eq 3 ] || { echo "FAIL: $outs of 3 translations shown are text"; exit 1; }
[ -f "$work/one/ckpt/best-chrF/params.safetensors" ] || { echo "FAIL: no best-chrF checkpoint"; exit 1; }

two=$("$run" -n 2 --output rank0 -- "$exe" "${args[@]}" --n-model-shards 2 \
  --workdir "$work/two" 2>&1) || { skip_without_ucx "$two"; echo "$two" | tail; echo "FAIL: 2 model shards"; exit 1; }
two=$(echo "$two" | sed 's/^\[rank 0\] //')
# The numbers of the test and validation lines, 1 process against 2 shards.
nums() { echo "$1" | grep -E '^(test|validation loss)' | grep -oE '[0-9]+\.[0-9]+'; }
# The losses (lines 5-6) must agree within 2%; BLEU and chrF (lines 1-4) within
# 5 points: the beams of a barely trained decoder loop on a phrase, which
# amplifies the shards' different fp32 rounding into other words (on an
# AVX-512 VM, whose GEMM kernels round otherwise than AVX2's: BLEU 0.59 / 1.33,
# chrF 9.31 / 12.86, validation loss 3.802 / 3.811).
paste <(nums "$one") <(nums "$two") | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d
    if (n >= 5 && d > 0.02 * ($1 > 1 ? $1 : 1)) bad = 1
    if (n <= 4 && d > 5.0) bad = 1 }
  END { exit (n == 6 && !bad) ? 0 : 1 }' || {
  echo "1 process:"; nums "$one" | tr '\n' ' '; echo; echo "2 shards:"; nums "$two" | tr '\n' ' '
  echo; echo "FAIL: 2 model shards differ from 1 process"; exit 1; }
echo "2 model shards: $(echo "$two" | grep -E '^(test|validation loss)' | tr '\n' ' ')"

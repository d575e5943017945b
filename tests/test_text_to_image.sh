#!/usr/bin/env bash
# samples/text_to_image in seconds: 40 steps on 2000 images must bring the
# noise-prediction loss (about 1 at the start) below 0.5, and the run must
# draw images for every class and write them as a PNG grid. (Whether the
# drawn images show their class needs minutes of training: see the sample's
# README; here --min-agreement 0.)
# Exits 77 (SKIP) without the Fashion-MNIST files.
#   test_text_to_image.sh <sample>
set -uo pipefail
exe=$1
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || {
  echo "SKIP: Fashion-MNIST is not installed in $data (tools/setup data)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-t2i-XXXXXX")
trap 'rm -rf "$work"' EXIT
out=$("$exe" --max-steps 40 --batch-size 32 --train-images 2000 --per-class 2 --ddim-steps 4 \
  --min-agreement 0 --workdir "$work" 2>&1) || { echo "$out" | tail; echo "FAIL: the sample failed"; exit 1; }
echo "$out" | grep -v '^train' | tail -2
loss=$(grep '"split": "train"' "$work/metrics.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/')
echo "final training loss: $loss"
awk -v l="$loss" 'BEGIN { exit !(l < 0.5) }' || { echo "FAIL: the loss did not fall below 0.5"; exit 1; }
[ "$(head -c 8 "$work/samples.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || {
  echo "FAIL: no PNG grid in $work/samples.png"; exit 1; }

#!/usr/bin/env bash
# samples/image_to_text learns to read on a tiny model in seconds: 1200 steps
# on 8-character KJV lines in one monospace font must bring the held-out CER
# under half the untrained model's (the sample's own exit status); then the
# exported folder, loaded with --init-from, scores at its start exactly what
# the first run ended with. Exits 77 (SKIP) without the Debian data (bible-kjv,
# fonts-dejavu-core) or a FreeType build.
#   test_image_to_text.sh <sample>
set -uo pipefail
exe=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-ocr-XXXXXX")
trap 'rm -rf "$work"' EXIT
command -v bible >/dev/null || { echo "SKIP: the bible-kjv package is not installed"; exit 77; }
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf ] || {
  echo "SKIP: fonts-dejavu-core is not installed"; exit 77; }
tiny=(--dim 64 --layers 2 --heads 4 --batch-size 16 --max-chars 8 --width 64
  --fonts dejavu/DejaVuSansMono.ttf --noise 0 --min-size 12 --max-size 12 --valid-lines 50)
one=$("$exe" "${tiny[@]}" --lr 3e-3 --steps 1200 --export "$work/export" --workdir "$work/one" 2>&1)
status=$?
if [ $status -ne 0 ] && echo "$one" | grep -q 'has no FreeType'; then
  echo "SKIP: redco was built without FreeType"; exit 77
fi
echo "$one" | grep -v '^train' | tail -7
[ $status -eq 0 ] || { echo "FAIL: the model did not learn to read"; exit 1; }
two=$("$exe" "${tiny[@]}" --steps 5 --lr 1e-5 --init-from "$work/export" --workdir "$work/two" 2>&1) || {
  echo "$two" | tail; echo "FAIL: fine-tuning the export"; exit 1; }
end=$(echo "$one" | sed -n 's/^held-out lines: CER \([0-9.]*\), exact match \([0-9.]*\).*/\1 \2/p')
start=$(echo "$two" | sed -n 's/^held-out lines: .*(at start: \([0-9.]*\), \([0-9.]*\)).*/\1 \2/p')
echo "end of training: CER, exact match $end; the export loaded back: $start"
[ -n "$end" ] && [ "$end" = "$start" ] || { echo "FAIL: the export does not score the same"; exit 1; }

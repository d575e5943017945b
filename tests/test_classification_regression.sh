#!/usr/bin/env bash
# samples/classification_regression learns, on a tiny BERT in seconds:
#   fortunes  1 process: validation accuracy 10 points above the majority
#             category (the sample's own exit status); then 2 processes with
#             the model in 2 shards print the same validation metrics.
#   verses    --regression: mean squared error 20% below predicting the mean.
# Exits 77 (SKIP) without the Debian data (fortunes; sword-text-kjv and a
# libsword build for verses), and for fortunes after its 1-process part where
# redco was built without UCX.
#   test_classification_regression.sh fortunes <sample> <redco-run>
#   test_classification_regression.sh verses <sample>
set -uo pipefail
mode=$1 exe=$2
. "$(dirname "$0")/two_processes.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-clsreg-XXXXXX")
trap 'rm -rf "$work"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}
tiny=(--dim 64 --layers 1 --heads 2 --max-length 64 --vocab 1024 --lr 2e-3)

if [ "$mode" = fortunes ]; then
  run=${3:?usage: test_classification_regression.sh fortunes <sample> <redco-run>}
  [ -f /usr/share/games/fortunes/computers ] || {
    echo "SKIP: Debian's fortunes are not installed (apt-get install fortunes)"; exit 77; }
  args=(--max-steps 150 --min-per-category 500 "${tiny[@]}")
  # One process cut by the planner (--n-model-shards auto): with this much
  # memory it must pick the plain cut, so 2 model shards must match it.
  one=$("$exe" "${args[@]}" --n-model-shards auto --workdir "$work/one" 2>&1) || {
    echo "$one" | grep -v '^train'; echo "FAIL: 1 process did not learn"; exit 1; }
  echo "$one" | grep -q '^auto: 1 model shard(s) x 1 replica(s), ZeRO-0, recomputation off' || {
    echo "$one" | grep -v '^train' | head -3; echo "FAIL: auto did not pick the plain cut"; exit 1; }
  line=$(echo "$one" | grep '^validation')
  echo "1 process: $line"
  two=$("$run" -n 2 --output rank0 -- "$exe" "${args[@]}" --n-model-shards 2 \
    --workdir "$work/two" 2>&1) || { skip_without_ucx "$two"; echo "$two" | tail; echo "FAIL: 2 model shards"; exit 1; }
  line2=$(echo "$two" | sed 's/^\[rank 0\] //' | grep '^validation')
  echo "2 model shards: $line2"
  [ "$line" = "$line2" ] || { echo "FAIL: 2 model shards differ from 1 process"; exit 1; }
else
  [ -d /usr/share/sword/modules/texts/ztext/engKJV2006eb ] || {
    echo "SKIP: the KJV SWORD module is not installed (apt-get install sword-text-kjv)"; exit 77; }
  out=$("$exe" --regression --max-steps 300 "${tiny[@]}" --workdir "$work/reg" 2>&1)
  status=$?
  if [ $status -ne 0 ] && echo "$out" | grep -q 'built without libsword'; then
    echo "SKIP: redco was built without libsword"; exit 77
  fi
  echo "$out" | grep -v '^train' | tail -3
  [ $status -eq 0 ] || { echo "FAIL: the regression did not beat the mean"; exit 1; }
fi

#!/usr/bin/env bash
# The Fashion-MNIST sample at a small size, as its README runs it: 120 steps
# of the small CNN must reach 70% accuracy on 2,000 test images (chance is
# 10%, an untrained CNN ~10%). Under redco-run, two data-parallel processes
# reach the same bar (SKIP where redco was built without UCX).
#   test_classification_sample.sh <classification> <redco-run>
set -uo pipefail
exe=$1 run=${2:?usage: test_classification_sample.sh <classification> <redco-run>}
. "$(dirname "$0")/two_processes.sh"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/redco-cls-XXXXXX") && trap 'rm -rf "$tmp"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}
small=(--epochs 1 --max-steps 120 --eval-size 2000)

# The last "accuracy" the run logged, as a number (fails on none).
accuracy() { grep '^eval' "$1" | grep -o 'accuracy [0-9.]*' | tail -1 | grep -o '[0-9.]*$'; }
bar() {  # log label
  local a; a=$(accuracy "$1") || { echo "FAIL: $2 logged no accuracy"; cat "$1"; exit 1; }
  echo "$2: accuracy $a"
  awk -v a="$a" 'BEGIN { exit !(a >= 0.70) }' || { echo "FAIL: $2 below 0.70"; exit 1; }
}

"$exe" "${small[@]}" --workdir "$tmp/one" >"$tmp/one.log" 2>&1 ||
  { echo "FAIL: 1 process"; cat "$tmp/one.log"; exit 1; }
bar "$tmp/one.log" "1 process"
"$run" -n 2 --output rank0 -- "$exe" "${small[@]}" --workdir "$tmp/two" >"$tmp/two.log" 2>&1 ||
  { skip_without_ucx "$(cat "$tmp/two.log")"; echo "FAIL: 2 data-parallel processes"; tail "$tmp/two.log"; exit 1; }
bar "$tmp/two.log" "2 data-parallel processes"

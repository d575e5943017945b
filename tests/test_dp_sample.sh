#!/usr/bin/env bash
# samples/differential_privacy on a Fashion-MNIST subset in seconds: DP-SGD at
# a loose budget (epsilon 8) reaches 50% test accuracy (chance: 10%; the
# sample's own exit status), the accountant reports the epsilon spent, the
# same under redco-run -n 2; a delta of 1 or more, a batch or a subset larger
# than the data are one clear error each. Exits 77 (SKIP) without the data,
# and after the rest where redco was built without UCX (no 2 processes).
#   test_dp_sample.sh <sample> <redco-run>
set -uo pipefail
exe=$1 run=${2:?usage: test_dp_sample.sh <sample> <redco-run>}
. "$(dirname "$0")/two_processes.sh"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-dp-XXXXXX")
trap 'rm -rf "$work"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}
args=(--epsilon 8 --train-examples 4096 --test-examples 1000 --epochs 2 --batch-size 128
  --min-accuracy 0.5)

check() {  # name, output, status
  echo "$2" | grep -v '^train' | sed 's/^\[rank 0\] //' | tail -3
  [ "$3" -eq 0 ] || { echo "FAIL: $1 did not reach 50% test accuracy"; exit 1; }
  echo "$2" | grep -q 'epsilon 8\.000 spent at delta 1e-05' || {
    echo "FAIL: $1 did not report epsilon 8.000 spent"; exit 1; }
}
out=$("$exe" "${args[@]}" --workdir "$work/one" 2>&1); check "1 process" "$out" $?

bad() {  # expected message, flags...
  local want=$1; shift
  out=$("$exe" "$@" --workdir "$work/bad" 2>&1) && { echo "FAIL: $* succeeded"; exit 1; }
  [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "$want" || {
    echo "FAIL: $* did not give one clear error:"; echo "$out"; exit 1; }
  echo "ok: $out"
}
bad 'must be below 1' --delta 1.5
bad 'the set has 60000 images' --train-examples 70000
bad 'larger than the 100 training examples' --train-examples 100 --batch-size 128

out=$("$run" -n 2 --output rank0 -- "$exe" "${args[@]}" --workdir "$work/two" 2>&1)
status=$?
[ $status -eq 0 ] || skip_without_ucx "$out"
check "2 processes" "$out" $status
echo "PASS"

#!/usr/bin/env bash
# samples/federated_learning on a Fashion-MNIST subset in seconds: FedAvg over
# 100 IID clients reaches 50% test accuracy after 5 rounds (chance: 10%; the
# sample's own exit status); under redco-run -n 2, with the clients of each
# round split between the processes, the same within 2 points; more clients
# than examples and more clients per round than clients are one clear error
# each. Exits 77 (SKIP) without the data, and after the rest where redco was
# built without UCX (no 2 processes).
#   test_fl_sample.sh <sample> <redco-run>
set -uo pipefail
exe=$1 run=${2:?usage: test_fl_sample.sh <sample> <redco-run>}
. "$(dirname "$0")/two_processes.sh"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-fl-XXXXXX")
trap 'rm -rf "$work"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}
args=(--rounds 5 --local-epochs 2 --train-examples 10000 --test-examples 1000 --min-accuracy 0.5)

accuracy() {  # name, output, status -> the final test accuracy
  echo "$2" | sed 's/^\[rank 0\] //' | grep '^eval' >&2
  [ "$3" -eq 0 ] || { echo "$2" | tail -3 >&2; echo "FAIL: $1 did not reach 50%" >&2; exit 1; }
  echo "$2" | sed 's/^\[rank 0\] //' | sed -n 's/^test accuracy \([0-9.]*\) .*/\1/p'
}
out=$("$exe" "${args[@]}" --workdir "$work/one" 2>&1)
one=$(accuracy "1 process" "$out" $?) || exit 1
echo "1 process: test accuracy $one"

bad() {  # expected message, flags...
  local want=$1; shift
  out=$("$exe" "$@" --workdir "$work/bad" 2>&1) && { echo "FAIL: $* succeeded"; exit 1; }
  [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "$want" || {
    echo "FAIL: $* did not give one clear error:"; echo "$out"; exit 1; }
  echo "ok: $out"
}
bad 'need at least as many training examples' --clients 200 --train-examples 100
bad 'exceeds the 100 clients' --clients-per-round 101

out=$("$run" -n 2 --output rank0 -- "$exe" "${args[@]}" --workdir "$work/two" 2>&1)
status=$?
[ $status -eq 0 ] || skip_without_ucx "$out"
two=$(accuracy "2 processes" "$out" $status) || exit 1
echo "2 processes: test accuracy $two"
awk -v a="$one" -v b="$two" 'BEGIN { d = a - b; exit !(d <= 0.02 && d >= -0.02) }' || {
  echo "FAIL: 2 processes ended at $two, 1 process at $one"; exit 1; }
echo "PASS"

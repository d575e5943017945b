#!/usr/bin/env bash
# samples/meta_learning learns in seconds, with the bars its README promises
# (the sample's own exit status):
#   sinusoid  after a short meta-training, the post-adaptation MSE on new
#             sinusoids is 20% below both baselines (pretrained on all tasks,
#             from scratch);
#   fashion   5-way 1-shot accuracy on tasks of the held-out classes 5-9 is 10
#             points above the from-scratch baseline and above twice chance;
#             then on 2 processes (redco-run -n 2: the meta-batch's tasks
#             spread over 2 data-parallel replicas) the same bar, with an
#             accuracy within 0.03 of 1 process (SKIP where redco was
#             built without UCX);
#   bad input (more ways than held-out classes, more shots than images) is one
#             clear message and exit status 1.
# Fashion-MNIST missing: the fashion parts exit 77 (SKIP) after sinusoid passes.
#   test_meta_learning.sh <meta_learning> <redco-run>
set -uo pipefail
exe=$1 run=${2:?usage: test_meta_learning.sh <meta_learning> <redco-run>}
. "$(dirname "$0")/two_processes.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-maml-XXXXXX")
trap 'rm -rf "$work"' EXIT
export UCX_TLS=${UCX_TLS:-tcp,self}

out=$("$exe" --task sinusoid --epochs 1 --steps-per-epoch 200 --eval-tasks 100 \
  --workdir "$work/sin" 2>&1) || { echo "$out" | tail -5; echo "FAIL: sinusoid"; exit 1; }
echo "$out" | grep '^held-out'

bad=$("$exe" --ways 6 --workdir "$work/bad" 2>&1) && { echo "FAIL: --ways 6 was accepted"; exit 1; }
echo "$bad" | grep -q -- "--ways 6 is more than the 5 meta-training or 5 held-out classes" ||
  { echo "$bad"; echo "FAIL: no clear message for --ways 6"; exit 1; }

[ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || {
  echo "SKIP: Fashion-MNIST is not installed in /usr/share/datasets/fashion-mnist"; exit 77; }
bad=$("$exe" --shots 990 --queries 15 --workdir "$work/bad" 2>&1) &&
  { echo "FAIL: --shots 990 was accepted"; exit 1; }
echo "$bad" | grep -q "990 shots + 15 queries need 1005 items of every class, but class 5 has 1000" ||
  { echo "$bad"; echo "FAIL: no clear message for --shots 990"; exit 1; }

args=(--ways 5 --shots 1 --epochs 1 --steps-per-epoch 40 --eval-tasks 100)
one=$("$exe" "${args[@]}" --workdir "$work/one" 2>&1) ||
  { echo "$one" | grep -v '^train'; echo "FAIL: 1 process did not beat the baseline"; exit 1; }
line=$(echo "$one" | grep '^held-out')
echo "1 process: $line"
two=$("$run" -n 2 --output rank0 -- "$exe" "${args[@]}" --workdir "$work/two" 2>&1) ||
  { skip_without_ucx "$two"; echo "$two" | grep -v 'train'; echo "FAIL: 2 processes did not beat the baseline"; exit 1; }
line2=$(echo "$two" | sed 's/^\[rank 0\] //' | grep '^held-out')
echo "2 processes: $line2"
acc() { sed 's/.*MAML accuracy \([0-9.]*\).*/\1/' <<<"$1"; }
awk -v a="$(acc "$line")" -v b="$(acc "$line2")" 'BEGIN { d = a - b; exit !(d < 0.03 && d > -0.03) }' ||
  { echo "FAIL: 2 processes differ from 1 by 0.03 or more"; exit 1; }
echo "PASS"

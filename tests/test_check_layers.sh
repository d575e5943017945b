#!/usr/bin/env bash
# tools/check-layers on the real tree (passes) and on copies of it with one
# include that runs up a layer, one between sibling folders and one from a
# sample into tools/ (each must fail, naming the line).
set -euo pipefail
check=$1 root=$2
"$check" "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect_fail() {  # expect_fail FILE LINE: the copy with LINE appended to FILE must fail
  rm -rf "$tmp/tree" && mkdir "$tmp/tree"
  cp -r "$root/redco" "$root/samples" "$tmp/tree/"
  echo "$2" >>"$tmp/tree/$1"
  if out=$("$check" "$tmp/tree"); then
    echo "FAIL: check-layers passed with '$2' in $1" >&2
    exit 1
  fi
  grep -q "^$1:" <<<"$out" || { echo "FAIL: no line names $1: $out" >&2; exit 1; }
}
expect_fail redco/core/tensor.cpp '#include "redco/autodiff/node.hpp"'
expect_fail redco/comm/comm.hpp '#include "redco/autodiff/node.hpp"'
expect_fail redco/io/json.hpp '#include "redco/train/trainer.hpp"'
expect_fail samples/classification/classification.cpp '#include "tools/bench/x.hpp"'
echo "check-layers: passes on the tree, fails on each of 4 planted up-includes"

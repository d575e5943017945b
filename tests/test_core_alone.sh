#!/usr/bin/env bash
# tests/test_core_alone.sh <repo-root> <compiler...>: core is the ground floor,
# proved by a compiler rather than by reading includes. Every source and
# header of redco/core is compiled (-fsyntax-only) from a copy of the tree
# that holds redco/core and nothing else of redco, so an include of any layer
# above (autodiff, nn, comm, ...), however indirect, fails to resolve. The
# same check on a copy with one planted include of autodiff must fail.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 <repo-root> <compiler...>" >&2; exit 2; }
root=$(realpath "$1")
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
deps=$(pkg-config --cflags fmt tbb eigen3)

# check_core <tree>: compiles each file of <tree>/redco/core alone, two at a time.
check_core() {
  local tree=$1
  shift
  # shellcheck disable=SC2086  # $deps is a list of flags
  find "$tree/redco/core" -name '*.cpp' -o -name '*.hpp' | sort |
    xargs -P 2 -I{} sh -c 'exec "$@" -std=c++20 -fsyntax-only -x c++ -I"'"$tree"'" '"$deps"' {} 2>&1' \
      _ "$@"
}

mkdir -p "$tmp/tree/redco"
cp -r "$root/redco/core" "$tmp/tree/redco/"
n=$(find "$tmp/tree/redco/core" -name '*.cpp' -o -name '*.hpp' | wc -l)
if ! out=$(check_core "$tmp/tree" "$@"); then
  echo "FAIL: redco/core does not compile without the layers above it:" >&2
  echo "$out" | head -20 >&2
  exit 1
fi
# The check itself must catch an upward include.
echo '#include "redco/autodiff/node.hpp"' >>"$tmp/tree/redco/core/tensor.cpp"
if check_core "$tmp/tree" "$@" >/dev/null 2>&1; then
  echo "FAIL: the check passed with an include of redco/autodiff planted in core/tensor.cpp" >&2
  exit 1
fi
echo "core alone: its $n files compile with no other layer of redco present"

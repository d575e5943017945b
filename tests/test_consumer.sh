#!/usr/bin/env bash
# tests/test_consumer.sh <repo-root> <scratch-dir>
# Builds tests/consumer, a project outside redco that pulls redco in as a Meson
# subproject through the README's subprojects/redco.wrap, and runs it. This catches a redco/meson.build that only works as
# the top-level project (source-root paths, option names, override_dependency).
# The scratch build is kept between runs so only changed redco sources rebuild.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 <repo-root> <scratch-dir>" >&2; exit 2; }
root=$(realpath "$1")
scratch=$(realpath -m "$2")

mkdir -p "$scratch/src/subprojects"
cp "$root"/tests/consumer/* "$scratch/src/"
# The wrap file the README shows: its [provide] section is what lets the
# consumer say dependency('redco') without naming a fallback. Meson uses the
# folder below as is (the wrap's url is not fetched when it exists).
python3 - "$root/README.md" >"$scratch/src/subprojects/redco.wrap" <<'PY'
import re, sys
m = re.search(r"`subprojects/redco.wrap`:\n\n```ini\n(.*?)```", open(sys.argv[1]).read(), re.S)
sys.exit("README.md shows no ```ini block for subprojects/redco.wrap") if not m else print(m[1], end="")
PY
# A symlink, not a copy: the consumer must build the tree under test as it is.
ln -sfn "$root" "$scratch/src/subprojects/redco"

build="$scratch/build"
if [ ! -f "$build/build.ninja" ]; then
  rm -rf "$build"
  # --force-fallback-for: use the subproject even if some redco is installed.
  # -O0 without debug info: this test is about the build description (paths,
  # options, override_dependency), not speed, and compiles libredco 3x faster.
  meson setup "$build" "$scratch/src" --force-fallback-for=redco \
    -Doptimization=0 -Ddebug=false -Dredco:tests=false -Dredco:benchmarks=false
fi
# Only the consumer and what it links (libredco), not redco's samples.
ninja -C "$build" consumer
"$build/consumer"

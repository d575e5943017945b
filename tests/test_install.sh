#!/usr/bin/env bash
# tests/test_install.sh <repo-root> <build-dir> <scratch-dir> <c++ compiler command...>
# `meson install` of the build under test into a scratch DESTDIR, then a
# program outside redco (tests/consumer/main.cpp) built against that tree
# twice: with pkg-config (redco.pc) and with CMake (find_package(redco)).
# Also checks that every header of redco/ was installed and that
# <redco/redco.hpp> compiles from the installed tree alone.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 <repo-root> <build-dir> <scratch-dir> <c++...>" >&2; exit 2; }
root=$(realpath "$1")
build=$(realpath "$2")
scratch=$(realpath -m "$3")
shift 3
cxx=("$@")
for tool in pkg-config cmake; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (apt install $tool)"; exit 77; }
done

rm -rf "$scratch/stage"
mkdir -p "$scratch"
# Targets are already built by `meson test`; install copies, nothing compiles.
DESTDIR="$scratch/stage" meson install -C "$build" --no-rebuild --quiet
prefix="$scratch/stage$(meson introspect "$build" --buildoptions |
  python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')"
pcdir=$(dirname "$(find "$prefix" -name redco.pc -print -quit)")
[ -f "$pcdir/redco.pc" ] || { echo "FAIL: no redco.pc under $prefix"; exit 1; }

# Every header, no more and no less.
missing=$(cd "$root" && find redco -name '*.hpp' | while read -r h; do
  [ -f "$prefix/include/$h" ] || echo "$h"; done)
[ -z "$missing" ] || { echo "FAIL: headers not installed:"; echo "$missing"; exit 1; }

# 1. pkg-config: flags from the staged redco.pc alone (its prefix follows the file).
export PKG_CONFIG_PATH="$pcdir"
read -r -a flags <<<"$(pkg-config --cflags --libs redco)"
echo "pkg-config --cflags --libs redco: ${flags[*]}"
cat >"$scratch/all_headers.cpp" <<'CPP'
#include <redco/redco.hpp>
CPP
"${cxx[@]}" -std=c++20 -fsyntax-only "$scratch/all_headers.cpp" $(pkg-config --cflags redco)
"${cxx[@]}" -std=c++20 -O1 "$root/tests/consumer/main.cpp" -o "$scratch/consumer_pkgconfig" "${flags[@]}"
"$scratch/consumer_pkgconfig"
# A consumer starts where no CUDA is installed: the CUDA runtime is linked
# statically (redco/meson.build), so no libcudart.so is needed, and no RUNPATH
# into a toolkit is written.
if readelf -d "$scratch/consumer_pkgconfig" | grep -E "libcudart|RUNPATH|RPATH"; then
  echo "FAIL: the consumer needs the CUDA runtime or a toolkit path to start (above)"
  exit 1
fi

# 2. CMake: find_package(redco) through CMAKE_PREFIX_PATH.
rm -rf "$scratch/cmake"
mkdir -p "$scratch/cmake/src"
cp "$root/tests/install_consumer/CMakeLists.txt" "$root/tests/consumer/main.cpp" "$scratch/cmake/src/"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
unset PKG_CONFIG_PATH  # the package must find redco.pc by itself
cmake -S "$scratch/cmake/src" -B "$scratch/cmake/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="${cxx[-1]}" "${launcher[@]}" >/dev/null
cmake --build "$scratch/cmake/build"
"$scratch/cmake/build/consumer"
echo "install: pkg-config and CMake consumers ok"

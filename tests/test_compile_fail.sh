#!/usr/bin/env bash
# Compiles each tests/compile_fail/*.cpp with -fsyntax-only and checks the
# outcome its "// expect: ..." comment names: "compiles", or a message that
# must appear in the compiler's output as the one and only error (the
# concepts in redco/train must give one readable error, not a cascade).
#
#   test_compile_fail.sh <source root> [compiler command...]   (default: c++)
# Extra flags (include folders of dependencies outside the default search
# path) can be given in REDCO_COMPILE_FAIL_FLAGS.
set -u
root=$1
shift
[ $# -gt 0 ] || set -- c++
read -r -a extra <<< "${REDCO_COMPILE_FAIL_FLAGS:-}"
failed=0
for f in "$root"/tests/compile_fail/*.cpp; do
  name=$(basename "$f")
  expect=$(sed -n 's|^// expect: ||p' "$f" | head -n 1)
  if [ -z "$expect" ]; then
    echo "FAIL $name: no '// expect: ...' line"
    failed=1
    continue
  fi
  out=$("$@" -std=c++20 -fsyntax-only -fdiagnostics-color=never -I"$root" "${extra[@]}" "$f" 2>&1)
  rc=$?
  errors=$(grep -c 'error:' <<< "$out")
  if [ "$expect" = compiles ]; then
    if [ $rc -eq 0 ]; then echo "ok   $name compiles"; continue; fi
    echo "FAIL $name: expected it to compile"
  elif [ $rc -eq 0 ]; then
    echo "FAIL $name: compiled, expected an error containing: $expect"
  elif ! grep -qF -- "$expect" <<< "$out"; then
    echo "FAIL $name: the error does not contain: $expect"
  elif [ "$errors" -ne 1 ]; then
    echo "FAIL $name: $errors errors, expected exactly one"
  else
    echo "ok   $name: $(grep -m1 'error:' <<< "$out" | sed 's/.*error: //')"
    continue
  fi
  echo "$out" | head -n 40
  failed=1
done
exit $failed

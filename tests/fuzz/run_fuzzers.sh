#!/usr/bin/env bash
# tests/fuzz/run_fuzzers.sh <repo-root> <work-dir> [seconds-per-target]
# Builds the libFuzzer harnesses in tests/fuzz with clang (-fsanitize=fuzzer,
# address,undefined; only the parsers' sources and what they link: the file
# readers, the tokenizer pipeline, the model families' config.json readers;
# a few minutes on 2 cores, less from ccache) and runs each for a bounded time from its
# committed seed corpus (tests/fuzz/corpus/<target>, never written to: new
# inputs go to <work-dir>). A crash, a sanitizer report, a leak or a timeout
# fails the run, and the reproducer is left in <work-dir>/<target>/. Exits 77
# (Meson's SKIP) where clang or libFuzzer is missing.
# Environment: FUZZ_CXX (default clang++-14, then clang++), FUZZ_SECONDS, FUZZ_TARGETS
# (a space-separated subset of the harnesses).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 <repo-root> <work-dir> [seconds]" >&2; exit 2; }
root=$(realpath "$1")
work=$(realpath -m "$2")
secs=${FUZZ_SECONDS:-${3:-20}}
targets=(${FUZZ_TARGETS:-safetensors idx state_json launch_env tokenizer_json hf_config hf_index})

cxx=${FUZZ_CXX:-}
if [ -z "$cxx" ]; then
  for c in clang++-14 clang++; do command -v "$c" >/dev/null && cxx=$c && break; done
fi
[ -n "$cxx" ] || { echo "SKIP: no clang++ (apt-get install clang libclang-rt-14-dev)"; exit 77; }
mkdir -p "$work/obj"
probe="$work/probe.cpp"
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' >"$probe"
if ! "$cxx" -fsanitize=fuzzer "$probe" -o "$work/probe" 2>"$work/probe.log"; then
  echo "SKIP: $cxx cannot link libFuzzer (apt-get install libclang-rt-14-dev): $(head -c 300 "$work/probe.log")"
  exit 77
fi
launcher=()
# ccache hashes the working folder into -g builds; these objects do not care.
command -v ccache >/dev/null && launcher=(ccache) && export CCACHE_NOHASHDIR=1

# Every report is fatal (halt_on_error); pointer-overflow is recoverable only
# so that ubsan.supp can silence one report inside a system header (rapidjson
# 1.1), nothing else.
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
  -fno-sanitize-recover=all -fsanitize-recover=pointer-overflow
  -I"$root" $(pkg-config --cflags fmt eigen3 2>/dev/null))
export UBSAN_OPTIONS="suppressions=$root/tests/fuzz/ubsan.supp:halt_on_error=1:print_stacktrace=1"
# The parsers and the core they use (tensors, allocator, dtype conversion),
# and the tokenizer pipeline.
srcs=(core/dtype.cpp core/allocator.cpp core/device_memory.cpp core/tensor.cpp core/profile.cpp
  core/random.cpp io/safetensors.cpp io/json.cpp io/checkpoint.cpp data/idx.cpp
  comm/launch_env.cpp data/regex.cpp data/tokenizer.cpp data/tokenizer_batch.cpp
  data/tokenizer_config.cpp data/tokenizer_unicode.cpp data/tokenizer_normalizers.cpp
  data/tokenizer_pre_tokenizers.cpp data/tokenizer_models.cpp data/tokenizer_unigram.cpp
  data/tokenizer_processors.cpp data/tokenizer_folder.cpp)
# hf_config and hf_index also link the model families' config readers (only they: these
# are the slowest to compile).
model_srcs=(models/hf_config.cpp models/hf_util.cpp models/gpt2.cpp models/llama.cpp models/opt.cpp
  models/gptj.cpp models/gpt_neox.cpp models/t5.cpp models/bart.cpp models/bert.cpp)
objs=() model_objs=()
for s in "${srcs[@]}"; do objs+=("$work/obj/${s//\//_}.o"); done
for s in "${model_srcs[@]}"; do model_objs+=("$work/obj/${s//\//_}.o"); done
# Two compilers at a time (CI has 2 cores); -fsanitize=fuzzer-no-link gives
# the library code coverage instrumentation without a second main().
printf '%s\n' "${srcs[@]}" "${model_srcs[@]}" | xargs -P 2 -I{} sh -c '
  src={}; obj="'"$work"'/obj/$(echo "$src" | tr / _).o"
  exec "$@" -fsanitize=fuzzer-no-link -c "'"$root"'/redco/$src" -o "$obj"' _ \
  "${launcher[@]}" "$cxx" "${flags[@]}"
libs=(-lfmt -ltbb -lz -lpthread -lpcre2-8 -licuuc -lutf8proc)

# fuzz_one <target>: links and runs one harness; its summary line and
# status go to <work-dir>/<target>/{summary,status}.
fuzz_one() {
  local t=$1 exe="$work/fuzz_$1" extra=() result log execs cov ft seeds
  set +e  # (a subshell of its own) a grep finding nothing below is no failure
  [[ "$t" == hf_* ]] && extra=("${model_objs[@]}")
  mkdir -p "$work/$t/corpus"
  rm -f "$work/$t"/crash-* "$work/$t"/oom-* "$work/$t"/leak-* "$work/$t"/timeout-* "$work/$t/status"
  log="$work/$t/log.txt"
  "${launcher[@]}" "$cxx" "${flags[@]}" -fsanitize=fuzzer "$root/tests/fuzz/fuzz_$t.cpp" \
    "${objs[@]}" "${extra[@]}" "${libs[@]}" -o "$exe" >"$log" 2>&1 || {
    echo 1 >"$work/$t/status"; echo "fuzz_$t did not link:"; cat "$log"; return; }
  # -rss_limit_mb / -malloc_limit_mb: a reader that trusts a length field and
  # allocates gigabytes is a finding too. -timeout: one input may take 10 s.
  if (cd "$work/$t" && "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -print_final_stats=1 corpus "$root/tests/fuzz/corpus/$t") \
    >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    echo 1 >"$work/$t/status"
    echo "fuzz_$t failed; the end of its log ($log):"
    tail -40 "$log"
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  seeds=$(ls "$root/tests/fuzz/corpus/$t" | wc -l)
  printf '%-12s %-6s %9s execs in %ss  cov %6s  ft %6s  seeds %3s  corpus %5s\n' \
    "$t" "$result" "${execs:-?}" "$secs" "${cov:-?}" "${ft:-?}" "$seeds" \
    "$(ls "$work/$t/corpus" | wc -l)" >"$work/$t/summary"
}

# Two harnesses at a time (CI has 2 cores; each fuzzes one process): the
# same seconds of fuzzing per target in about half the wall time.
for t in "${targets[@]}"; do
  [ "$(jobs -rp | wc -l)" -lt 2 ] || wait -n || true
  fuzz_one "$t" &
done
wait
status=0
for t in "${targets[@]}"; do
  cat "$work/$t/summary" 2>/dev/null || echo "$t: no summary"
  [ ! -f "$work/$t/status" ] && [ -f "$work/$t/summary" ] || status=1
done
exit $status

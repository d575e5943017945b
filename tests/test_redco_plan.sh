#!/usr/bin/env bash
# redco-plan from the command line: a cell of RedCoast's Table 1 that fits,
# one that cannot, --json read back by Python, and the user's mistakes (a
# model that is not there, a size that is not one, an unknown device, a
# model type the planner does not model), each one clear message, status 1.
#   test_redco_plan.sh <redco-plan> <tools/redco-plan/configs>
set -uo pipefail
plan=$1 configs=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/redco-plan-XXXXXX") && trap 'rm -rf "$tmp"' EXIT
bad=0
# expect <status> <pattern> <command...>
expect() {
  local want_status=$1 want=$2 out status=0
  shift 2
  out=$("$@" 2>&1) || status=$?
  if [ $status != "$want_status" ]; then
    echo "FAIL: '$*' exited with status $status, expected $want_status ('$want'):"; echo "$out"; bad=1
  elif [[ "$out" != *"$want"* ]]; then
    echo "FAIL: '$*' printed:"; echo "$out"; echo "expected: '$want'"; bad=1
  else
    echo "ok: $want"
  fi
}
cells=(--device 1080ti --memory 10GB --devices 2)
expect 0 "plans that fit, fastest first" "$plan" "$configs/gpt2-large.json" "${cells[@]}" --seq-len 512
expect 2 "nothing fits; the nearest misses" "$plan" "$configs/opt-66b.json" "${cells[@]}" --seq-len 512
"$plan" "$configs/bart-large.json" "${cells[@]}" --seq-len 1024 --json >"$tmp/plan.json"
python3 - "$tmp/plan.json" <<'PY' || bad=1
import json, sys
j = json.load(open(sys.argv[1]))
assert j["model_type"] == "bart" and j["fits"], j
best = j["plans"][0]
assert best["n_model_shards"] * best["data_parallel"] == 2, best
assert best["memory_bytes"]["needed"] <= 10e9, best
assert j["longest_seq_len"] == 1024, j  # BART's position table
print("ok: --json")
PY
expect 1 "'/nonexistent/model' does not exist" "$plan" /nonexistent/model "${cells[@]}"
expect 1 "--memory '10 potatoes' is not a size" "$plan" "$configs/bart-large.json" --memory "10 potatoes"
expect 1 "unknown device 'v100'" "$plan" "$configs/bart-large.json" --device v100
echo '{"model_type": "mamba", "vocab_size": 10}' >"$tmp/mamba.json"
expect 1 "is 'mamba', which the planner does not model" "$plan" "$tmp/mamba.json"
exit $bad

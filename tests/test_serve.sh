#!/usr/bin/env bash
# redco-serve with the real `openai` client (tests/python/serve_openai.py):
# completions and chat equal to transformers' greedy decoding, streaming,
# stop strings, errors, 1000 requests from 256 clients, 429 and disconnects;
# with redco-run, the same on 2 model shards (redco-run -n 2 ... --n-model-shards 2);
# --dtype int8 greedy completions equal to redco-generate --dtype int8.
# Skips (77) without the venv that tools/setup test makes.
#   test_serve.sh <redco-serve> <repository root> [<redco-run>]
set -uo pipefail
serve=$1 root=$2 run=${3:-}
export UCX_TLS=${UCX_TLS:-tcp,self}
py=$root/.venv/bin/python
if ! "$py" -c "import openai, httpx, torch, transformers" 2>/dev/null; then
  echo "SKIP: needs $root/.venv with openai, httpx, torch and transformers (tools/setup test)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/redco-serve-XXXXXX")
trap 'rm -rf "$work"' EXIT
# redco-generate beside redco-serve in the build: the int8 server's reference.
gen=$(dirname "$serve")/redco-generate
[ -x "$gen" ] && export REDCO_GENERATE=$gen
"$py" "$root/tests/python/serve_openai.py" "$serve" "$root/tests/fixtures/hf/gpt2_text" "$work" $run

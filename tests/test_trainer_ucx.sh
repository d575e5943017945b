#!/usr/bin/env bash
# A tiny GPT trained by 2 UCX processes under redco-run, data-parallel and then
# model-parallel, then data-parallel with ZeRO stages 1, 2 and 3 (also with
# an embedding large enough that ZeRO splits it), gives the 1-process losses
# within 1e-5 relative.
#   test_trainer_ucx.sh <trainer_dist_worker> <redco-run>
set -euo pipefail
worker=$1
run=$2
# TCP between the processes: shared-memory transports are not always usable in containers.
export UCX_TLS=${UCX_TLS:-tcp,self}
for cfg in "1 0 32" "2 0 32" "1 1 32" "1 2 32" "1 3 32" "1 1 512" "1 2 512" "1 3 512"; do
  read -r shards zero vocab <<< "$cfg"
  one=$("$worker" 1 0 "$vocab" | grep '^loss')
  [ "$(echo "$one" | wc -l)" = 10 ] || { echo "1 process: expected 10 losses, got: $one"; exit 1; }
  two=$("$run" -n 2 --output rank0 -- "$worker" "$shards" "$zero" "$vocab" | sed 's/^\[rank 0\] //' | grep '^loss')
  [ "$(echo "$two" | wc -l)" = 10 ] || { echo "n_model_shards $shards, zero_stage $zero: got: $two"; exit 1; }
  paste -d' ' <(echo "$one") <(echo "$two") | awk -v s="$shards zero_stage $zero vocab $vocab" '
    { d = $3 - $6; if (d < 0) d = -d; m = $3 < 0 ? -$3 : $3
      if ($2 != $5 || d > 1e-5 * m) { print "n_model_shards " s ", step " $2 ": " $3 " vs " $6; bad = 1 } }
    END { exit bad }'
done
echo "2 processes match 1 process"

#!/usr/bin/env bash
# tools/bench/build_time.sh [BUILD_DIR]: what a newcomer waits for, in seconds.
#   1. every sample translation unit compiled alone (one at a time, the build's
#      own command from compile_commands.json, output thrown away);
#   2. a 30-line user program (tools/bench/user_program.cpp: models::gpt2 and
#      the Trainer) compiled at -O2 against the installed library (meson
#      install into a scratch DESTDIR, flags from its redco.pc), then linked
#      and run.
# BUILD_DIR (default build/) must be configured and built. The cold-clone
# `tools/setup main` and CI totals are timed by hand: tools/bench/README.md,
# "Build time", has the commands. Check the machine is otherwise idle first.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json: configure $build first" >&2; exit 2; }

echo "== sample translation units (s, one at a time)"
python3 - "$build" <<'PY'
import json, shlex, subprocess, sys, time
build = sys.argv[1]
rows = []
for e in json.load(open(f"{build}/compile_commands.json")):
    if "/samples/" not in e["file"] or "/common/" in e["file"]:
        continue
    cmd = shlex.split(e["command"])
    out = cmd.index("-o")
    cmd[out + 1] = "/dev/null"
    cmd = [c for i, c in enumerate(cmd) if c not in ("-MD", "-MQ", "-MF") and
           cmd[i - 1] not in ("-MQ", "-MF")]
    t = time.monotonic()
    subprocess.run(cmd, cwd=e["directory"], check=True)
    rows.append((time.monotonic() - t, e["file"].split("/samples/")[1]))
for s, f in sorted(rows, reverse=True):
    print(f"{s:6.1f}  samples/{f}")
PY

echo "== a 30-line user program against the installed library"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR="$stage" meson install -C "$build" --no-rebuild --quiet
pcdir=$(dirname "$(find "$stage" -name redco.pc -print -quit)")
export PKG_CONFIG_PATH="$pcdir"
TIMEFORMAT="%6R  compile at -O2 (tools/bench/user_program.cpp)"
time g++ -std=c++20 -O2 -c tools/bench/user_program.cpp -o "$stage/user_program.o" \
  $(pkg-config --cflags redco)
g++ "$stage/user_program.o" -o "$stage/user_program" $(pkg-config --libs redco)
(cd "$stage" && ./user_program)

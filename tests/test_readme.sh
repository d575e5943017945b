#!/usr/bin/env bash
# tests/test_readme.sh <README.md> <readme_examples.cpp> <readme_examples executable>
# Every ```cpp block of the README appears, line for line (leading blanks
# aside), in tests/readme_examples.cpp, which the build compiles: so each
# example of the README compiles as written (designated initialisers in
# declaration order, `.template` where a lambda's type is generic).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 <README.md> <readme_examples.cpp> <exe>" >&2; exit 2; }
python3 - "$1" "$2" <<'PY'
import re, sys
readme, cpp = (open(p).read() for p in sys.argv[1:3])
strip = lambda text: [l.strip() for l in text.splitlines() if l.strip()]
have = "\n".join(strip(cpp))
blocks = re.findall(r"^```cpp\n(.*?)^```", readme, re.S | re.M)
if not blocks:
    sys.exit(f"FAIL: no ```cpp block in {sys.argv[1]}")
bad = 0
for i, b in enumerate(blocks, 1):
    if "\n".join(strip(b)) not in have:
        print(f"FAIL: README block {i} is not in {sys.argv[2]} as written:\n{b}")
        bad = 1
print(f"{len(blocks)} README C++ blocks compile as written" if not bad else "")
sys.exit(bad)
PY
"$3"

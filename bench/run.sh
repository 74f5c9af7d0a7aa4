#!/usr/bin/env bash
# One command for brimful's proxy benchmark: direct vs bare pass-through vs brimful.
#   bench/run.sh                         # 5 rounds x 5 s per measurement (~10 min)
#   bench/run.sh --rounds 1 --duration 5 # a quick look
# Installs the load tools (Debian packages wrk and hey) when missing, then runs
# bench/proxy_bench.py with the given arguments. Needs 2 cores and taskset.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
missing=()
for tool in wrk hey; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq "${missing[@]}"
fi
python="${PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in "$here/../.venv/bin/python" "$(command -v python3)"; do
        if [ -x "$candidate" ]; then python="$candidate"; break; fi
    done
fi
# aiohttp drives the load and the bare reference proxy (the "bench" extra).
"$python" -c "import aiohttp" 2>/dev/null ||
    "$python" -m pip install -q -c "$here/../constraints.txt" "aiohttp>=3.10,<4"
exec "$python" "$here/proxy_bench.py" "$@"

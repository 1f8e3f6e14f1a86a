#!/usr/bin/env bash
# Runs every red-team attack against this worktree's flakebot and prints one BLOCKED / GOT THROUGH line per attack.
# Run from anywhere: attacks/run.sh   (needs `make venv`; nix for attacks/team; takes ~10 min on 2 shared cores)
set -u
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export FLAKEBOT_CACHE_DIR=$PWD/artifacts/test-cache
run() { out=$(timeout 900 "$PY" "$@" 2>&1); line=$(printf '%s\n' "$out" | grep -E ': (BLOCKED|GOT THROUGH) -- ' | tail -1)
        printf '%s\n' "${line:-$* : GOT THROUGH -- (no verdict; script failed: $(printf '%s' "$out" | tail -1 | cut -c1-200))}" | cut -c1-400; }
run attacks/a10_evil_crate.py
run attacks/a20_swap_binaries.py
run attacks/a21_delete_binary.py
run attacks/a22_intent_outside.py
for w in log proof card manifest sqlite; do run attacks/a23_fifo_records.py "$w"; done
run attacks/a24_garbled_json.py
run attacks/a25_dirs_swapped.py
run attacks/a40_wrong_input.py
rm -rf artifacts/rt3-tmp
timeout 1200 "$PY" -m pytest attacks/team -p no:cacheprovider --basetemp=artifacts/rt3-tmp -q -s 2>&1 | grep -E '^A3[0-9].*: (BLOCKED|GOT THROUGH)' | cut -c1-300

#!/usr/bin/env bash
# The test suite, set-up included. Exits non-zero on any failure, and when no test was collected.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test || exit 1
# The layer contract (pyproject.toml, [tool.importlinter]) first: a module importing upward fails fast.
.venv/bin/lint-imports || exit 1
# ruff (pyproject.toml, [tool.ruff]): pyflakes, pycodestyle and bugbear over the whole tree.
.venv/bin/ruff check . || exit 1
# One worker more than cores (at most 4): many tests wait on child processes (workers and ranks importing torch,
# hang limits running out), so a third worker on a 2-core machine keeps both cores busy: 9:33 against 10:52 there.
workers=$(.venv/bin/python -c "import os; print(min(4, (os.cpu_count() or 1) + 1))")
# loadgroup: tests marked xdist_group share a worker (tests/test_engine.py's engines start once).
# --durations: the slowest tests named in every log, against the 10-minute budget of a 2-core CI machine.
.venv/bin/python -m pytest tests -p xdist -n "$workers" --dist loadgroup --durations=15 "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "error: no tests were collected" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# Re-renders every committed page from its plan and stored results (PLAN.md per op, reports/README.md across ops).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
plans=(plan.yaml kernels/plans/*.yaml)
for plan in "${plans[@]}" tests/thirdparty/*.yaml; do "$py" -m harness report "$plan" >/dev/null; done
"$py" -m harness overview "${plans[@]}"

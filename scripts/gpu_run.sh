#!/usr/bin/env bash
# Runs the bundled plans on a GPU machine and leaves their results under reports/ (the nightly job).
#   scripts/gpu_run.sh numerics [pytest args]   every numerics and vLLM cell of every bundled plan
#   scripts/gpu_run.sh bench [pytest args]      the benchmark items (device-timed)
# Each plan's run rewrites reports/<op>/results/<sm>-<gpu>.json and reports/<op>/PLAN.md; commit them.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off, also for the ranks of tensor-parallel cells (they inherit this environment).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python=${PYTHON:-python3}
plans=(plan.yaml kernels/plans/fused_add_rms_norm.yaml kernels/plans/silu_and_mul.yaml)
what=${1:?usage: scripts/gpu_run.sh numerics|bench [pytest args]}
shift
status=0
for plan in "${plans[@]}"; do
  case "$what" in
    numerics) "$python" -m pytest --plan "$plan" -m "not bench" -p no:cacheprovider "$@" || status=1 ;;
    bench) "$python" -m pytest --plan "$plan" --bench -m bench -p no:cacheprovider "$@" || status=1 ;;
    *) echo "unknown: $what" >&2; exit 2 ;;
  esac
done
exit $status

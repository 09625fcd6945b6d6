#!/usr/bin/env bash
# Runs the bundled plans on a GPU machine and leaves their results under reports/ (the nightly job).
#   scripts/gpu_run.sh numerics [pytest args]   every numerics and vLLM cell of every bundled plan
#   scripts/gpu_run.sh bench [pytest args]      the benchmark items (device-timed), one plan's timings at a time
#   scripts/gpu_run.sh calibrate [args]         the calibration corpus's table (python -m tests.calibration)
#   scripts/gpu_run.sh stale [pytest args]      only what is missing or stale on this machine's SM (--cells stale):
#                                               cells, vLLM items and benchmarks, one plan at a time (timings alone)
# JOBS=N runs N plans' numerics side by side (they share the GPUs), then each plan's cells left "not run" for memory
# the others held again, one plan at a time. Benchmarks take turns on the GPU: the next plan's
# run starts while one plan is timed and waits for its turn before its first item (HARNESS_GPU_TURN), so no
# other process times meanwhile. LOGS=DIR keeps one log per plan there.
# Each plan's run rewrites reports/<op>/results/<sm>-<gpu>.json and reports/<op>/PLAN.md; commit them.
# vLLM's compiled kernels (the vllm baselines, and the plans' `providers: [vllm]` cells) load from an
# installed vLLM or from HARNESS_VLLM_OPS_LIBRARY=<vLLM's _C_stable_libtorch.abi3.so>; without either, those
# baselines and cells are reported not run.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off, also for the ranks of tensor-parallel cells (they inherit this environment).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python=${PYTHON:-python3}
# Bytecode cached across processes and runs: where Python writes none (PYTHONDONTWRITEBYTECODE, an install without
# .pyc files, as on the H200 machines), every process here (one per plan, 8 precompile processes each) compiles
# torch's, Inductor's and Triton's sources again, 13 s against 4 s a process on an H200 machine.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-op-plan/pycache}
# Inductor's cache (and the precompile stamp in it) kept where a reboot or a /tmp clean-up leaves it, not in its
# default /tmp/torchinductor_<user>: a night whose plans and shapes are unchanged then skips every plan's precompile
# step (8.8-26.7 s a plan on an H200, about 4.7 of the 24.3 minutes all plans took on a fresh machine).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-op-plan/inductor}
# PLANS="a.yaml b.yaml" runs those plans only (default: every bundled plan).
read -r -a plans <<< "${PLANS:-plan.yaml $(echo kernels/plans/*.yaml)}"
what=${1:?usage: scripts/gpu_run.sh numerics|bench|stale|calibrate [pytest args]}
shift
jobs=${JOBS:-1}
logs=${LOGS:-}
[ -n "$logs" ] && mkdir -p "$logs"
case "$what" in
  numerics) select=(-m "not bench" --cells all) ;;  # every cell, whatever the profile (no pairwise sample)
  bench) select=(--bench -m bench); jobs=2 ;;  # one timing, one starting up or writing its report
  stale) select=(--cells stale); jobs=1 ;;  # a plan's stale benchmarks are timed with nothing else running
  calibrate) ;;  # the calibration corpus (tests/calibration): correct and broken kernels through every check
  *) echo "unknown: $what" >&2; exit 2 ;;
esac
# JOBS=N plans side by side on one GPU size themselves by its free memory: each worker's caching allocator is capped
# at 0.9 x free / N (HARNESS_GPU_MEMORY_FRACTION; the 0.1 left for CUDA contexts), so together they never ask for more
# than is free. An out-of-memory a solo run would not hit (at the cap, or memory others hold) is the machine's: the
# cell is "not run here", never failed (harness/runtime/device.py, memory_held_elsewhere).
if [ "$what" != bench ] && [ "$jobs" -gt 1 ] && [ -z "${HARNESS_GPU_MEMORY_FRACTION:-}" ]; then
  share="import torch; free, total = torch.cuda.mem_get_info(); print(f'{0.9 * free / total / $jobs:.4f}')"
  if fraction=$("$python" -c "$share" 2>/dev/null); then
    export HARNESS_GPU_MEMORY_FRACTION=$fraction
  fi
fi
[ "$what" = calibrate ] && exec "$python" -m tests.calibration --jobs "$jobs" "$@"
pids=()
made=()  # what this script created, removed at its exit
# The turn on the GPU the plans' runs take one after another (harness/plugin/state.py, take_gpu_turn): the
# interpreter start, collection, CUDA context and report of each plan, 10-20 s a plan on an H200 machine, no longer
# add to the night, as the timed items of one plan still run with no other timing beside them.
if [ "$what" = bench ] && [ -z "${HARNESS_GPU_TURN:-}" ]; then
  HARNESS_GPU_TURN=$(mktemp "${TMPDIR:-/tmp}/gpu-turn.XXXXXX")
  export HARNESS_GPU_TURN
  made+=("$HARNESS_GPU_TURN")
fi
trap '[ ${#made[@]} -eq 0 ] || rm -rf "${made[@]}"' EXIT
# Every plan's benchmark shapes compiled first, in one pool of processes (one per core): each plan's run then skips
# its own precompile step, which started 8 processes and imported torch in each, plan after plan. Not where -k picks
# some items: each plan's run then compiles just the shapes it times.
subset=0
for arg in "$@"; do case "$arg" in -k*) subset=1 ;; esac; done
if [ "$what" = bench ] && [ $subset = 0 ]; then
  plog=/dev/stdout
  [ -n "$logs" ] && plog="$logs/precompile.log"
  "$python" scripts/precompile.py "${plans[@]}" > "$plog" 2>&1
fi
# A cancelled job (CI's SIGTERM, Ctrl-C, timeout) stops the plans' pytest processes too: left running in the
# background, one would share the GPU with whatever is timed next.
trap 'kill -INT "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM
for plan in "${plans[@]}"; do
  log=/dev/stdout
  [ -n "$logs" ] && log="$logs/$(basename "$plan" .yaml).$what.log"
  "$python" -m pytest --plan "$plan" "${select[@]}" -p no:cacheprovider "$@" > "$log" 2>&1 &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
# Plans side by side leave cells "not run" where memory other plans held ran out: each plan runs those again with the
# GPU to itself (`--cells retry`; a plan with none collects, selects nothing and stops, a few seconds).
if [ "$what" = numerics ] && [ "$jobs" -gt 1 ]; then
  unset HARNESS_GPU_MEMORY_FRACTION
  for plan in "${plans[@]}"; do
    log=/dev/stdout
    [ -n "$logs" ] && log="$logs/$(basename "$plan" .yaml).retry.log"
    "$python" -m pytest --plan "$plan" -m "not bench" --cells retry -p no:cacheprovider "$@" > "$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1  # 5: nothing to retry
  done
fi
exit $status

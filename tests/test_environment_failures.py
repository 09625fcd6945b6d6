"""Environment failures are never the kernel's: memory other processes hold, a library's stand-in, code that needs
CUDA to import. Each makes the cell "not run here", with why; the kernel's own faults still fail it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness.results.store import to_json
from harness.runtime.device import MEMORY_FRACTION_ENV, apply_memory_cap, free_device_memory, memory_held_elsewhere
from harness.runtime.resolve import resolve
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.runtime.workers import Worker
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from kernels.rms_norm import rms_norm as correct_rms_norm
from tests.plans import cpu_machine_only, read_results, rms_norm_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
HERE = "tests.test_environment_failures"
CELL = "decode-fp32-tp1-eager-cpu"

# torch's own message (c10 CUDACachingAllocator) as the H200 run printed it, with twelve plans side by side
OTHERS_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
              "1.23 GiB is free. Process 2235 has 21.29 GiB memory in use. Process 2236 has 18.00 GiB memory in use. "
              "Including non-PyTorch memory, this process has 20.00 GiB memory in use. Of the allocated memory "
              "18.50 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated. If reserved "
              "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
CAP_OOM = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
           "60.00 GiB is free. Process 2235 has 30.00 GiB memory in use. Including non-PyTorch memory, this process "
           "has 33.00 GiB memory in use. 31.46 GiB allowed; Of the allocated memory 30.00 GiB is allocated by "
           "PyTorch, and 2.00 GiB is reserved by PyTorch but unallocated.")
# A kernel asking for 1 PiB: more than the GPU has, whoever else is there
ABSURD_OOM = ("CUDA out of memory. Tried to allocate 1048576.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
              "100.00 GiB is free. Process 2235 has 21.29 GiB memory in use. Of the allocated memory 0.10 GiB is "
              "allocated by PyTorch, and 0.00 GiB is reserved by PyTorch but unallocated.")


def _run(plan: Path, cell: str = CELL, examples: int = 10) -> dict:
    return to_json(run_cell(CellTask.load(plan, cell, RunSettings(examples, "ci", None))).record)


# ---------------------------------------------------------------- out of memory


@pytest.mark.parametrize("text, expected", [
    (OTHERS_OOM, "the GPU ran out of memory (39.3 GiB held by other processes)"),
    (CAP_OOM, "the GPU ran out of memory (30.0 GiB held by other processes; this process's cap is 31.5 GiB "
              "(HARNESS_GPU_MEMORY_FRACTION: plans side by side share the GPU))"),
    # no NVML: what is neither free nor this process's (allocated + reserved) is the others'
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which 0.50 GiB is "
     "free. Of the allocated memory 9.50 GiB is allocated by PyTorch, and 0.00 GiB is reserved by PyTorch but "
     "unallocated.", "the GPU ran out of memory (70.0 GiB held by other processes)"),
    (ABSURD_OOM, None),
    # the request plus this process's live tensors exceed the whole GPU: the kernel's, even with others there
    (OTHERS_OOM.replace("Tried to allocate 2.00 GiB", "Tried to allocate 125.00 GiB"), None),
    # a CPU's out of memory: the kernel's, as before
    ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate "
     "1125899906842624 bytes.", None),
    # a raw cudaMalloc's, with no size and (here) nothing known of other processes: the kernel's
    ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", None),
])
def test_an_out_of_memory_is_the_kernels_only_when_no_solo_run_could_meet_it(monkeypatch, text, expected):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the message alone, not this machine's GPU
    assert memory_held_elsewhere(text) == expected


_calls = {"n": 0}


def oom_from_others(out, x, weight, eps):
    """A correct kernel on a GPU whose memory other processes hold: every call is denied."""
    raise torch.OutOfMemoryError(OTHERS_OOM)


def oom_once(out, x, weight, eps):
    """A correct kernel denied once (caches full), then served."""
    _calls["n"] += 1
    if _calls["n"] == 1:
        raise torch.OutOfMemoryError(OTHERS_OOM)
    return correct_rms_norm(out, x, weight, eps)


def oom_absurd(out, x, weight, eps):
    raise torch.OutOfMemoryError(ABSURD_OOM)


def test_memory_held_by_other_processes_makes_the_cell_not_run_here(tmp_path):
    rec = _run(rms_norm_plan(tmp_path, f"{HERE}:oom_from_others"))
    assert rec["status"] == "not_run", rec
    assert rec["reason"] == "the GPU ran out of memory (39.3 GiB held by other processes)", rec["reason"]
    assert rec["examples"] == 2  # the first example, and its one retry with caches freed; then it stops


def test_an_example_denied_memory_once_is_retried_and_passes(tmp_path):
    _calls["n"] = 0
    rec = _run(rms_norm_plan(tmp_path, f"{HERE}:oom_once"))
    assert rec["status"] == "passed", rec["reason"]
    assert _calls["n"] > 2


def test_a_kernel_asking_for_more_than_the_gpu_has_still_fails(tmp_path):
    rec = _run(rms_norm_plan(tmp_path, f"{HERE}:oom_absurd"))
    assert rec["status"] == "failed", rec
    assert "out of memory at num_tokens=" in rec["reason"] and "asked for more memory than" in rec["reason"]


def test_the_memory_cap_and_freeing_touch_no_cuda_on_a_cpu_run(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a CPU run's test: on a GPU the cap applies")
    monkeypatch.setenv(MEMORY_FRACTION_ENV, "0.25")
    apply_memory_cap()
    free_device_memory()
    assert not torch.cuda.is_initialized()


def test_gpu_run_caps_each_plan_at_its_share_of_free_memory_with_jobs(tmp_path):
    """JOBS=2: the fraction is measured once and exported to every plan's run (a stand-in python records it); then
    each plan's cells left not run for memory the other held run again (`--cells retry`) with the GPU to itself."""
    seen = tmp_path / "seen"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = -c ]; then echo 0.2000; exit 0; fi
case "$*" in *"--cells retry"*) echo "retry:${{{MEMORY_FRACTION_ENV}:-unset}}" >> {seen}; exit 5 ;; esac
echo "${{{MEMORY_FRACTION_ENV}:-unset}}" >> {seen}
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PYTHON": str(fake), "PLANS": "a.yaml b.yaml", "JOBS": "2"}
    env.pop(MEMORY_FRACTION_ENV, None)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "numerics"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr  # exit 5 (nothing to retry) is no failure
    assert seen.read_text().split() == ["0.2000", "0.2000", "retry:unset", "retry:unset"]
    seen.unlink()
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), "numerics"], env={**env, "JOBS": "1"},
                   capture_output=True, text=True, timeout=60)
    assert seen.read_text().split() == ["unset", "unset"]  # one plan at a time has the GPU to itself: no retry


# ---------------------------------------------------------------- a library's stand-in


class TritonPlaceholder(types.ModuleType):
    """As vLLM's (vllm.triton_utils.importing) where Triton has no backend: jit a no-op, the rest missing."""

    def __init__(self):
        super().__init__("triton")
        self.jit = lambda fn: fn


triton = TritonPlaceholder()


def launches_through_a_stand_in(out, x, weight, eps):
    block = triton.next_power_of_2(x.shape[-1])  # the AttributeError vLLM's CPU build gave
    return block


def kernel_launch_through_a_stand_in(out, x, weight, eps):
    kernel = triton.jit(lambda *args: None)
    kernel[(x.shape[0],)](out, x)  # TypeError: not subscriptable, in a module whose triton is the stand-in


@pytest.mark.parametrize("kernel, error", [("launches_through_a_stand_in", "AttributeError: module 'triton' has no "
                                                                           "attribute 'next_power_of_2'"),
                                           ("kernel_launch_through_a_stand_in", "TypeError")])
def test_a_kernel_running_against_a_library_stand_in_is_not_run_here(tmp_path, kernel, error):
    rec = _run(rms_norm_plan(tmp_path, f"{HERE}:{kernel}"))
    assert rec["status"] == "not_run", rec
    assert rec["reason"].startswith(f"triton cannot run on this machine (the kernel ran against a stand-in for it: "
                                    f"{error}"), rec["reason"]


def test_a_kernels_own_attribute_error_still_fails(tmp_path):
    (tmp_path / "own_mistake.py").write_text("def rms_norm(out, x, weight, eps):\n    return x.no_such_method()\n")
    rec = _run(rms_norm_plan(tmp_path, "own_mistake:rms_norm"))
    assert rec["status"] == "failed" and "the kernel raised AttributeError" in rec["reason"], rec


# An op whose library registered its schema but no code for this device (a schema-only or other-device build)
_SCHEMA_ONLY = torch.library.Library("harness_env_test", "DEF")
_SCHEMA_ONLY.define("schema_only(Tensor x) -> Tensor")


def calls_an_op_with_no_code_for_this_device(out, x, weight, eps):
    out.copy_(torch.ops.harness_env_test.schema_only(x))


def built_without_this_gpus_architecture(out, x, weight, eps):
    raise RuntimeError("CUDA error: no kernel image is available for execution on the device\nCUDA kernel errors "
                       "might be asynchronously reported at some other API call")  # torch's text, as a launch gives it


@pytest.mark.parametrize("kernel, error", [
    ("calls_an_op_with_no_code_for_this_device", "NotImplementedError: Could not run 'harness_env_test::schema_only'"),
    ("built_without_this_gpus_architecture", "RuntimeError: CUDA error: no kernel image is available")])
def test_a_kernel_built_with_no_code_for_this_machine_is_not_run_here(tmp_path, kernel, error):
    rec = _run(rms_norm_plan(tmp_path, f"{HERE}:{kernel}"))
    assert rec["status"] == "not_run", rec
    assert rec["reason"].startswith("the kernel as built has no code for this cpu") and error in rec["reason"], rec


def test_vllms_own_triton_stand_in_is_not_run_here(tmp_path):
    """vLLM's CPU build replaces triton with its placeholder; a kernel using it, in a worker as a run has it."""
    pytest.importorskip("vllm")
    probe = subprocess.run([sys.executable, "-c", "from vllm.triton_utils import HAS_TRITON; print(HAS_TRITON)"],
                           capture_output=True, text=True, timeout=300)
    if probe.stdout.strip().splitlines()[-1:] != ["False"]:
        pytest.skip("vLLM's Triton is the real one on this machine")
    (tmp_path / "vllm_side.py").write_text(
        "from vllm.triton_utils import triton\n\n\n"
        "def rms_norm(out, x, weight, eps):\n"
        "    return triton.next_power_of_2(x.shape[-1])\n")
    plan = rms_norm_plan(tmp_path, "vllm_side:rms_norm")
    worker = Worker()
    try:
        outcome = worker.call(run_cell, CellTask.load(plan, CELL, RunSettings(5, "ci", None)), 300)
    finally:
        worker.stop()
    rec = to_json(outcome.record)
    assert rec["status"] == "not_run", rec
    assert rec["reason"].startswith("triton cannot run on this machine") and "next_power_of_2" in rec["reason"], rec


# ---------------------------------------------------------------- code that needs CUDA to import


def _module(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body + "\n\nfrom kernels.rms_norm import rms_norm  # noqa: E402,F401\n")


@pytest.mark.parametrize("body, words", [
    ("raise RuntimeError('Torch not compiled with CUDA enabled')",
     "RuntimeError: Torch not compiled with CUDA enabled"),
    ("import deep_gemm  # noqa: F401", "ModuleNotFoundError"),
    ("raise ImportError('libcudart.so.12: cannot open shared object file: No such file or directory')",
     "ImportError: libcudart.so.12: cannot open shared object file"),
])
def test_code_that_cannot_be_imported_on_this_machine_makes_its_cells_not_run_here(tmp_path, monkeypatch, body, words):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # a CUDA-only package, missing here
    _module(tmp_path, "cuda_only", body)
    plan = rms_norm_plan(tmp_path, "cuda_only:rms_norm")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("cuda_only", None)
    resolved = resolve(load_plan(plan))  # no PlanError: the plan is right, this machine cannot import its code
    assert any(f"op.kernel: cuda_only cannot be imported on this machine: {words}" in w for w in resolved.warnings), \
        resolved.warnings
    rec = _run(plan)
    assert rec["status"] == "not_run", rec
    assert rec["reason"].startswith(f"cuda_only cannot be imported on this machine: {words}"), rec["reason"]


@pytest.mark.parametrize("kernel, words", [
    ("kernels.rms_nrom:rms_norm", "No module named 'kernels.rms_nrom'"),  # a misspelt module
    ("kernels.rms_norm:rms_nrom", "has no attribute 'rms_nrom'"),  # a misspelt function
    ("imports_a_typo:rms_norm", "No module named 'numpyy'"),  # the module's own misspelt import
])
def test_a_misspelt_import_is_still_an_invalid_plan_at_its_line(tmp_path, monkeypatch, kernel, words):
    _module(tmp_path, "imports_a_typo", "import numpyy  # noqa: F401")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PlanError) as error:
        resolve(load_plan(rms_norm_plan(tmp_path, kernel)))
    assert "plan.yaml:4: op.kernel: expected an importable object" in str(error.value), str(error.value)
    assert words in str(error.value)


@cpu_machine_only
def test_a_cuda_only_plan_runs_on_a_cpu_machine_instead_of_being_invalid(tmp_path):
    """The run goes on (no "invalid plan", exit 4): the cells say why, and the report is written."""
    _module(tmp_path, "gpu_side", "import torch\n\ntorch.zeros(1, device='cuda')  # as a module that sets up at import")
    plan = rms_norm_plan(tmp_path, "gpu_side:rms_norm", matrix={"sm": ["cpu", "sm90"]})
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.plugin", "--plan", str(plan),
                           "--plan-profile", "ci", "--reports-dir", str(reports), "-p", "no:cacheprovider", "-q",
                           "-rs"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu_side cannot be imported on this machine: AssertionError: Torch not compiled with CUDA enabled" \
        in proc.stdout, proc.stdout
    cells = read_results(reports / "rms_norm" / "results" / "cpu.json")["cells"]
    assert cells[CELL]["status"] == "not_run"
    assert cells[CELL]["reason"] == ("gpu_side cannot be imported on this machine: AssertionError: Torch not compiled "
                                     "with CUDA enabled")
    assert (reports / "rms_norm" / "PLAN.md").exists()

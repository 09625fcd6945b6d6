"""Time limits per example, not per cell, and small reproducers after a crash.

Most tests run `pytest --plan` on CPU (pytester's, in this process; the cells run in the run's own worker processes,
whose limits these are), with a kernel written into the test's directory (plain torch): a slow but correct one, one
that hangs on one example, one that segfaults from a token count on (alone, or on one rank of a TP group), one that
a rank imports slowly; and the default plan in a process of its own on one core beside a CPU hog.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from tests.plans import cpu_machine_only, read_plan, read_results, rms_norm_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]

# Plain torch, so no example pays the Triton interpreter's first-launch cost (about 0.7 s on a 2-core machine,
# several seconds beside a CPU hog) and the times below are the kernels' own.
KERNELS = '''
import os
import signal
import time

from kernels.rms_norm import rms_norm_ref

CRASH_AT = 5


def rms_norm(out, x, weight, eps):
    out.copy_(rms_norm_ref(x, weight, eps))


def slow(out, x, weight, eps):
    """Right, and 1 s per call: a cell of 6 examples takes twice its 3 s limit."""
    time.sleep(1.0)
    rms_norm(out, x, weight, eps)


SEEN: set = set()


def hangs_on_the_third_example(out, x, weight, eps):
    """Hangs on the third input it is given: an example's repeated and padded calls (determinism, padding
    isolation) share its first row, so they count once."""
    SEEN.add(float(x[0].double().sum()))
    if len(SEEN) == 3:
        time.sleep(600)
    rms_norm(out, x, weight, eps)


def crashes_from_5_tokens(out, x, weight, eps):
    """A segfault for every input of 5 tokens or more (as an out-of-bounds access past a fixed buffer would)."""
    if x.shape[0] >= CRASH_AT:
        os.kill(os.getpid(), signal.SIGSEGV)
    rms_norm(out, x, weight, eps)


def crashes_on_rank_1_from_2_tokens(out, x, weight, eps):
    import torch.distributed as dist

    if dist.get_rank() == 1 and x.shape[0] >= 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    rms_norm(out, x, weight, eps)
'''

# A kernel module that rank 1 of a group takes 4 s to import (a busy machine, a slow file system).
SLOW_IMPORT = '''
import time

import torch.distributed as dist

from timed_kernels import rms_norm

if dist.is_initialized() and dist.get_rank() == 1:
    time.sleep(4)
'''


ARGS = ("--plan-profile", "ci", "--no-report", "-p", "no:cacheprovider", "-p", "no:xdist", "-q")


def _write_kernels(folder: Path) -> None:
    (folder / "timed_kernels.py").write_text(KERNELS)
    (folder / "slow_import.py").write_text(SLOW_IMPORT)


def _cells(reports: Path) -> dict:
    results = next(reports.glob("*/results/cpu.json"), None)
    return read_results(results)["cells"] if results else {}


def _run(pytester, plan: Path, *args: str) -> tuple[SimpleNamespace, dict, float]:
    """`pytest --plan plan` in pytester's folder, in this process (the cells run in the run's worker processes
    either way; a fresh pytest process would import torch and the harness again): its exit status and output, the
    cells of its results file, its wall time."""
    _write_kernels(pytester.path)
    start = time.monotonic()
    result = pytester.runpytest_inprocess("-p", "harness.plugin", "--plan", str(plan), "--reports-dir",
                                          str(pytester.path / "reports"), *ARGS, *args)
    wall = time.monotonic() - start
    outcome = SimpleNamespace(returncode=int(result.ret), stdout=result.stdout.str(), stderr=result.stderr.str())
    return outcome, _cells(pytester.path / "reports"), wall


def _run_on(cpus: set[int], tmp_path: Path, plan: Path, *args: str) \
        -> tuple[subprocess.CompletedProcess, dict, float]:
    """`pytest --plan plan` in a process of its own in tmp_path, it and its workers on `cpus` only."""
    _write_kernels(tmp_path)
    reports = tmp_path / "reports"
    cmd = [sys.executable, "-m", "pytest", "-p", "harness.plugin", "--plan", str(plan), "--reports-dir", str(reports),
           *ARGS, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "TRITON_INTERPRET": "1"}
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    return proc, _cells(reports), time.monotonic() - start


@cpu_machine_only
def test_a_slow_correct_kernel_passes_although_the_cell_outlasts_its_limit(pytester):
    plan = rms_norm_plan(pytester.path, "timed_kernels:slow", numerics={"examples": 6, "timeout_s": 3})
    proc, cells, _ = _run(pytester, plan)
    cell = cells["decode-fp32-tp1-eager-cpu"]
    assert proc.returncode == 0 and cell["status"] == "passed", proc.stdout + proc.stderr
    assert cell["examples"] == 6 and cell["duration_s"] > 1.5 * 3, cell  # 6 s of kernel calls under a 3 s limit


@cpu_machine_only
def test_a_kernel_that_hangs_on_one_example_fails_as_hung_after_the_others(pytester):
    plan = rms_norm_plan(pytester.path, "timed_kernels:hangs_on_the_third_example",
                         numerics={"examples": 6, "timeout_s": 3, "batch_invariance": "off"})
    proc, cells, _ = _run(pytester, plan)
    cell = cells["decode-fp32-tp1-eager-cpu"]
    assert proc.returncode == 1 and cell["status"] == "failed", proc.stdout + proc.stderr
    assert cell["reason"].startswith("no example finished within 3 s (numerics.timeout_s); 2 examples had finished: "
                                     "the kernel did not return on num_tokens="), cell["reason"]
    assert cell["reason"].endswith("(a hang or an endless loop?)"), cell["reason"]
    assert cell["examples"] == 2
    assert "shrunk after the fault" not in cell["facts"]  # a hang is not replayed: each replay would cost the limit


@cpu_machine_only
def test_a_crash_is_shrunk_in_fresh_workers_to_the_smallest_crashing_input(pytester):
    plan = rms_norm_plan(pytester.path, "timed_kernels:crashes_from_5_tokens", matrix={"dtype": ["fp32", "fp16"]},
                         numerics={"examples": 10, "max_num_seqs": 32, "timeout_s": 60})
    proc, cells, wall = _run(pytester, plan)
    # The second cell of the phase takes the example the first shrank to: one replay confirms it, no walk from it.
    later = cells["decode-fp16-tp1-eager-cpu"]
    assert later["minimal_example"].startswith("num_tokens=5 hidden=1 "), later
    assert later["facts"]["shrunk after the fault"]["replays"] == 1, later
    cell = cells["decode-fp32-tp1-eager-cpu"]
    assert proc.returncode == 1 and cell["status"] == "failed", proc.stdout + proc.stderr
    assert "was killed by SIGSEGV" in cell["reason"], cell["reason"]
    shrunk = cell["facts"]["shrunk after the fault"]
    first = int(re.match(r"num_tokens=(\d+)", shrunk["from"]).group(1))
    assert first > 5, shrunk  # the first crashing example hypothesis drew
    assert cell["minimal_example"] == shrunk["to"], cell
    assert cell["minimal_example"].startswith("num_tokens=5 hidden=1 "), cell  # exactly the threshold
    assert 0 < shrunk["replays"] <= 20 and shrunk["seconds"] <= 60 + 10, shrunk
    assert "(spent)" not in shrunk["budget"], shrunk
    assert "minimal example: num_tokens=5 hidden=1 " in proc.stdout, proc.stdout
    assert "reproduce: pytest --plan plan.yaml --reports-dir reports --replay decode-fp32-tp1-eager-cpu" in proc.stdout
    print(f"crash shrunk from {shrunk['from']!r} to {shrunk['to']!r} in {shrunk['replays']} replays, "
          f"{shrunk['seconds']} s; whole run {wall:.1f} s")


@cpu_machine_only
def test_a_rank_still_importing_the_kernel_is_outside_the_limit(pytester):
    plan = rms_norm_plan(pytester.path, "slow_import:rms_norm", matrix={"tp": [2]}, tp={"kind": "trivial"},
                         numerics={"examples": 3, "max_num_seqs": 8, "timeout_s": 2})
    proc, cells, _ = _run(pytester, plan)
    cell = cells["decode-fp32-tp2-eager-cpu"]
    assert proc.returncode == 0 and cell["status"] == "passed", proc.stdout + proc.stderr


@cpu_machine_only
def test_a_crash_on_one_rank_is_shrunk_in_fresh_groups(pytester):
    plan = rms_norm_plan(pytester.path, "timed_kernels:crashes_on_rank_1_from_2_tokens", matrix={"tp": [2]},
                         tp={"kind": "trivial"}, numerics={"examples": 6, "max_num_seqs": 4})
    proc, cells, _ = _run(pytester, plan)
    cell = cells["decode-fp32-tp2-eager-cpu"]
    assert cell["reason"].startswith("rank 1 of 2 was killed by SIGSEGV"), cell
    shrunk = cell["facts"]["shrunk after the fault"]
    assert int(re.match(r"num_tokens=(\d+)", shrunk["from"]).group(1)) > 2, shrunk
    assert cell["minimal_example"].startswith("num_tokens=2 hidden=1 "), cell
    assert cell["facts"]["worker_starts"] == 1  # the group that ran the cell; replays restart it as they need


@cpu_machine_only
def test_the_default_plan_passes_beside_a_cpu_hog(tmp_path):
    """The run and its workers on one core, which a spinning process keeps busy: worker start and imports are slow,
    each example slower; a correct kernel still passes. The plan is the bundled one with a 10 s limit instead of
    300 s, so it proves it in seconds. One core and one spinning process, not every core and as many: that load
    is the same for the run, and the rest of a parallel test suite keeps the other cores."""
    vllm = read_plan(ROOT / "plan.yaml")["implementations"]["vllm"]  # timed, not audited: the kernel's cells only
    plan = write_plan(tmp_path / "plan.yaml", ROOT / "plan.yaml", numerics={"timeout_s": 10},
                      implementations={"vllm": {**vllm, "role": ["baseline"]}})
    core = {min(os.sched_getaffinity(0))}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, core))]
    try:
        proc, cells, wall = _run_on(core, tmp_path, plan, "--examples", "3",
                                    "-k", "decode and eager and tp1 and cpu and bf16")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = {c: r["status"] for c, r in cells.items() if r["status"] != "not_run"}
    assert ran == {"decode-bf16-tp1-eager-cpu": "passed"}, ran
    print(f"on one core beside a spinning process: {wall:.1f} s")


def test_shrink_example_bisects_each_field_to_the_smallest_reproducing_value(tmp_path):
    from harness.runtime.inputs import Example
    from harness.cells.matrix import Cell
    from harness.plan.load import load_plan
    from harness.runtime.runner import shrink_example

    plan = load_plan(rms_norm_plan(tmp_path, matrix={"phase": ["decode", "chunked_prefill"]},
                                   numerics={"max_num_seqs": 64}))
    drawn = Example(num_tokens=40, sizes={"hidden": 97}, layouts={"x": ("strided", 15)}, scale="tiny", seed=3)
    cases = [  # (cell, first faulting example, when it faults, the smallest faulting example)
        ("decode", drawn, lambda e: e.num_tokens >= 5,
         "num_tokens=5 hidden=1 x:contiguous scale=normal (N(0,1)) seed=3"),
        ("decode", drawn, lambda e: e.layouts["x"] != ("contiguous", 0) and e.layouts["x"][1] >= 7,
         "num_tokens=1 hidden=1 x:strided+7 scale=normal (N(0,1)) seed=3"),
        ("chunked_prefill", Example(num_tokens=300, decode_tokens=20, sizes={"hidden": 128}, seed=3),
         lambda e: e.decode_tokens >= 3 and e.num_tokens - e.decode_tokens >= 9,
         "num_tokens=12 (decode 3 + prefill 9) hidden=1 scale=normal (N(0,1)) seed=3"),
    ]
    for phase, first, faults, smallest in cases:
        replays = []
        found = shrink_example(plan, Cell(phase, "fp32", 1, "eager", "cpu"), first,
                               lambda e, replays=replays, faults=faults: replays.append(e) or faults(e))
        assert found.describe() == smallest and len(replays) <= 25, (found.describe(), len(replays))
    # A spent budget (every replay "does not reproduce") leaves the first example as it was.
    assert shrink_example(plan, Cell("decode", "fp32", 1, "eager", "cpu"), drawn, lambda e: False) == drawn


def test_the_deadline_restarts_with_each_example_under_a_total_cap():
    from harness.runtime.inputs import Example
    from harness.runtime.workers import SETUP_TIMEOUT_S, TOTAL_TIMEOUT_FACTOR, CallProgress

    watch = CallProgress(2.0, reports=True)
    assert watch.deadline() == watch.started + SETUP_TIMEOUT_S  # before the first example: set-up, not the limit
    assert watch.expired().kind == "setup"
    for n in range(3):
        watch.update("example", {"example": Example(num_tokens=n + 1)})
        assert watch.deadline() == watch.last + 2.0
        watch.update("finished", {"failed": n == 1})
    watch.update("example", {"example": Example(num_tokens=9)})
    hung = watch.expired()
    assert (hung.kind, hung.examples, hung.example.num_tokens) == ("hung", 3, 9)
    assert hung.reason == ("no example finished within 2 s (numerics.timeout_s); 3 examples had finished: the kernel "
                           "did not return on num_tokens=9 scale=normal (N(0,1)) seed=0 (a hang or an endless loop?)")
    assert watch.first_failed.num_tokens == 2
    watch.first -= TOTAL_TIMEOUT_FACTOR * 2.0 - 1.0  # the cell started 19 s ago: the 20 s cap comes first
    assert watch.deadline() == watch.first + 20.0
    slow = watch.expired()
    assert slow.kind == "too slow" and slow.reason.startswith("the cell was still running after 20 s (10 x "
                                                              "numerics.timeout_s), its total limit, with 3 examples "
                                                              "finished"), slow
    whole = CallProgress(2.0, reports=False)  # a function that reports no progress: one limit for the call
    assert whole.deadline() == whole.started + 2.0
    assert whole.expired().reason.startswith("timed out after 2 s (numerics.timeout_s)")


def test_a_worker_started_ahead_keeps_its_start_outside_the_first_calls_limit():
    """Benchmarks start their worker before compiling the shapes; importing torch there must not eat the first
    item's time limit."""
    from harness.runtime.workers import Worker

    worker = Worker()
    worker.start()
    try:
        assert worker.call(os.getpid, None, timeout_s=0.5) == worker.proc.pid  # importing torch takes longer
        assert worker.starts == 1
    finally:
        worker.stop()


def test_every_replay_after_a_fault_runs_in_a_process_of_its_own():
    """A replay that corrupts memory without crashing must not decide the next: no process serves two replays."""
    from harness.runtime.shrinking import Replays
    from harness.runtime.workers import Fault, Worker

    class NoTask:  # each replay calls os.getpid() alone
        def replaying(self, example):
            return None

    worker = Worker()
    replays = Replays(worker, os.getpid, NoTask(), 60.0, Fault("crashed", kind="crashed"), max_replays=3)
    seen = []
    replays.same_fault = lambda value: seen.append(value) or False
    try:
        assert [replays(None) for _ in range(3)] == [False, False, False]
    finally:
        replays.close()
        worker.stop(kill=True)
    assert len(set(seen)) == 3 and os.getpid() not in seen, seen

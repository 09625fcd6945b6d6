"""Worker tasks: the parsed plan travels to the worker pickled, and no worker reads the plan file again."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from harness.runtime.tasks import CellTask, RunSettings, read_task, write_task
from harness.cells.matrix import Cell
from harness.plan.load import load_plan

from tests.plans import rms_norm_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))]


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_every_bundled_plan_pickles_to_an_equal_plan(path):
    plan = load_plan(path)
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_a_task_round_trips_through_a_file(tmp_path):
    task = CellTask.load(ROOT / "plan.yaml", "decode-bf16-tp1-eager-cpu", RunSettings(3, "ci", None))
    assert task.cell == Cell("decode", "bf16", 1, "eager", "cpu") and task.replay is None
    write_task(task, tmp_path / "task.pickle")
    assert read_task(tmp_path / "task.pickle") == task


def test_a_worker_runs_the_plan_it_was_handed_not_the_file(tmp_path):
    """The plan file is gone by the time the worker runs the cell: the task carries the plan."""
    from harness.runtime.runner import run_cell
    from harness.runtime.workers import Worker

    path = rms_norm_plan(tmp_path, hidden=[64], numerics={"examples": 2, "max_num_seqs": 8})
    task = CellTask.load(path, "decode-fp32-tp1-eager-cpu", RunSettings(2, "ci", None))
    path.unlink()
    worker = Worker()
    try:
        outcome = worker.call(run_cell, task, timeout_s=300)
    finally:
        worker.stop()
    assert outcome.record.status == "passed", outcome
    assert outcome.record.examples == 2


def test_work_done_meanwhile_overlaps_the_call_and_its_error_waits_for_the_reply():
    """A benchmark item's record is written while the worker runs the next item (`meanwhile`): that work runs
    while the call is under way, and a failure there (a full disk) is raised only once the worker's reply is read,
    so the next call gets its own reply, not the last one's."""
    import os
    import time

    from harness.runtime.workers import Worker

    worker, seen = Worker(), []
    try:
        worker.call(os.getpid, None, timeout_s=300)  # started and ready
        start = time.monotonic()
        assert worker.call(time.sleep, 1.0, timeout_s=300, meanwhile=lambda: seen.append(time.monotonic())) is None
        assert seen and seen[0] - start < 0.5 <= time.monotonic() - start  # ran before the 1 s call ended

        def disk_full():
            raise OSError("No space left on device")

        with pytest.raises(OSError, match="No space left"):
            worker.call(os.getenv, "HARNESS_NO_SUCH_VARIABLE", timeout_s=300, meanwhile=disk_full)
        assert worker.call(os.getpid, None, timeout_s=300) == worker.proc.pid  # in step: its own reply
    finally:
        worker.stop()


def test_a_worker_asked_to_stop_ends_by_itself_while_its_caller_goes_on():
    """The run's end asks its workers to stop, writes the report while they wind down, then waits for them: the
    process exits cleanly of its own accord, and the later stop() finds it gone."""
    import os

    from harness.runtime.workers import Worker

    worker = Worker()
    try:
        child = worker.call(os.getpid, None, timeout_s=300)
        proc = worker.proc
        assert child == proc.pid
        worker.ask_to_stop()
        proc.join(120)
        assert proc.exitcode == 0  # it returned from its loop: not killed, not crashed
    finally:
        worker.stop()
    assert worker.proc is None


def test_a_worker_sees_the_callers_environment_as_it_is_now(monkeypatch):
    """Workers fork from a server started with the caller's environment of that moment; each worker still gets the
    caller's environment as it is when the worker starts (a plan's run sets TRITON_INTERPRET, vLLM's ops library,
    Inductor's settings after the first worker started)."""
    import os

    from harness.runtime.workers import Worker

    monkeypatch.setenv("HARNESS_TEST_UNSET_LATER", "1")
    first, later = Worker(), Worker()
    try:
        first.call(os.getpid, None, timeout_s=300)  # the fork server runs from here on
        monkeypatch.setenv("HARNESS_TEST_SET_LATER", "yes")
        monkeypatch.delenv("HARNESS_TEST_UNSET_LATER")
        assert later.call(os.getenv, "HARNESS_TEST_SET_LATER", timeout_s=300) == "yes"
        assert later.call(os.getenv, "HARNESS_TEST_UNSET_LATER", timeout_s=300) is None
    finally:
        first.stop()
        later.stop()


def _state_at_fork(conn) -> None:
    """What a child of the workers' fork server holds before it runs anything of its own."""
    import sys

    import triton.runtime.interpreter as interp

    conn.send((getattr(interp.InterpreterBuilder.binary_op, "_harness_faithful", False),
               all(name in sys.modules for name in ("torch.distributed.tensor", "torch._inductor.compile_fx"))))


def test_workers_fork_from_a_server_that_already_made_the_interpreter_faithful_and_warmed_torch_up():
    """harness.runtime.worker_preload runs in the fork server, so no worker or rank repeats it (1.6 s of CPU a start
    on a 2-core CPU machine, 4.3 s more for a torch_compile cell's imports). With a CUDA build of torch the server
    does none of it (it must not touch CUDA's driver)."""
    import torch

    from harness.runtime import workers

    ctx = workers._forking_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_state_at_fork, args=(child,), daemon=True)
    proc.start()
    try:
        assert parent.poll(300), "the forked child sent nothing"
        faithful, warmed = parent.recv()
    finally:
        proc.join(10)
    if torch.cuda._is_compiled():
        assert not faithful
    else:
        assert faithful and warmed


def test_the_process_under_the_sanitizer_gets_the_cell_as_a_task_file(tmp_path, monkeypatch):
    """run_memcheck hands the cell to `python -m harness.runtime.memcheck TASK` pickled (here under a stand-in for
    compute-sanitizer that runs the process and reports no memory error, as the tool does on a clean kernel)."""
    from harness.runtime import memcheck

    tool = tmp_path / "compute-sanitizer"
    tool.write_text('#!/bin/sh\nshift 6\n"$@"\nstatus=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $status\n')
    tool.chmod(0o755)
    monkeypatch.setattr(memcheck, "sanitizer", lambda: str(tool))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU machine: the kernel in Triton's interpreter
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = load_plan(rms_norm_plan(tmp_path, hidden=[64]))
    outcome = memcheck.run_memcheck(plan, Cell("decode", "fp32", 1, "eager", "cpu"), timeout_s=300)
    assert outcome.record.status == "passed", outcome.record.reason
    assert outcome.record.examples == memcheck.EXAMPLES
    # the lanes after memcheck hand their processes the same task
    assert outcome.record.facts["sanitizer"] == "memcheck, racecheck, initcheck, synccheck"
    assert [outcome.record.facts[lane] for lane in memcheck.LANES] == ["clean"] * 3

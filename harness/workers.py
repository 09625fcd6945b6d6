"""Fault isolation: cells run in a child process that is replaced after a crash, a hang or a poisoned device.

One worker serves many cells (starting one costs an interpreter plus torch and triton imports),
so the price of isolation is paid once per pytest process and again only after a fault. A cell
that kills its worker, or outlives its time limit, fails with the cause in words; the next cell
gets a fresh worker on a healthy device.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import asdict

from .runner import RunSettings, run_cell


def _worker_main(conn, env: dict) -> None:
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from .hardware import use_triton_interpreter

    use_triton_interpreter()
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            result = run_cell(task["plan"], task["cell"], RunSettings(**task["run"]), task.get("tol_default"))
        except BaseException as exc:  # a harness-side failure still reports instead of killing the worker
            result = {"status": "failed", "reason": f"harness error: {type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc(), "fatal": False}
        conn.send(result)
        if result.get("fatal"):
            return  # the device context is unusable: exit so the parent starts a fresh worker


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {"SIGSEGV": " (segmentation fault: an out-of-bounds access?)", "SIGKILL": " (killed: out of memory?)",
                "SIGABRT": " (aborted)", "SIGBUS": " (bus error)"}.get(name, "")
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


class Worker:
    """A child process that runs cells; restarted on demand after it dies or is killed."""

    def __init__(self):
        self.proc = None
        self.conn = None
        self.starts = 0
        self.start_seconds = 0.0

    def _start(self) -> None:
        t0 = time.monotonic()
        ctx = mp.get_context("spawn")  # fork after CUDA init is unsafe; spawn gives a clean device context
        parent, child = ctx.Pipe()
        env = {k: v for k, v in os.environ.items() if k.startswith(("TRITON_", "CUDA_", "NCCL_", "TORCH_"))}
        self.proc = ctx.Process(target=_worker_main, args=(child, env), daemon=True, name="harness-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        self.starts += 1
        self.start_seconds += time.monotonic() - t0

    def run(self, plan_path: str, cell_id: str, run: RunSettings, timeout_s: float, tol_default=None) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        task = {"plan": str(plan_path), "cell": cell_id, "run": asdict(run), "tol_default": tol_default}
        try:
            self.conn.send(task)
            if not self.conn.poll(timeout_s):
                self.stop(kill=True)
                return {"status": "failed", "reason": f"timed out after {timeout_s:g} s (numerics.timeout_s): "
                        "the kernel did not return (a hang or an endless loop?)", "fatal": True}
            result = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.stop(kill=True)
            return {"status": "failed", "reason": f"the worker process running this cell {describe_exit(code)}; "
                    "the cell crashed the process (later cells run in a fresh one)", "fatal": True}
        if result.get("fatal"):
            self.stop(kill=False)
        return result

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill and self.proc.is_alive():
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()
        self.proc = self.conn = None

"""Fault isolation: cells run in a child process that is replaced after a crash, a hang or a poisoned device.

One worker serves many cells (starting one costs an interpreter plus torch and triton imports),
so the price of isolation is paid once per pytest process and again only after a fault. A cell
that kills its worker, or outlives its time limit, fails with the cause in words; the next cell
gets a fresh worker on a healthy device.

Tensor-parallel cells run in a WorkerGroup: N processes joined by torch.distributed (gloo on CPU,
NCCL with one GPU per rank), started once per TP size and kept for every later cell of that size.
Rank 0 takes the cell, runs its hypothesis loop and drives the other ranks (tp.py). A rank that
crashes or hangs fails the cell with its exit or its stack, and the whole group is replaced.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import asdict
from datetime import timedelta

from .matrix import Cell
from .runner import RunSettings, run_cell

# Multicast NVLink (NVLS) is off for every group: where the fabric does not support it, NCCL and
# symmetric memory fail at init or hang.
TP_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GROUP_START_TIMEOUT_S = 300.0  # N interpreters importing torch and triton, then joining the group, on a busy machine
FOLLOWER_ACK_TIMEOUT_S = 60.0  # ranks above 0 report back right after rank 0 ends the cell
# Collectives inside a cell; the parent's numerics.timeout_s normally fires first and kills the group.
PROCESS_GROUP_TIMEOUT_S = 3600


def _inherited_env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(("TRITON_", "CUDA_", "NCCL_", "TORCH_"))}


def _worker_main(conn, env: dict) -> None:
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from .hardware import use_triton_interpreter

    use_triton_interpreter()  # imports torch: the slow part of a start
    conn.send("ready")  # a cell's time limit starts after this, so a slow start never times a cell out
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
    """A child process that runs cells; restarted on demand after it dies or is killed.

    Cells of a TP size above 1 go to that size's WorkerGroup, started on first use.
    """

    def __init__(self):
        self.proc = None
        self.conn = None
        self.starts = 0
        self.start_seconds = 0.0
        self.groups: dict[int, WorkerGroup] = {}

    def _start(self) -> None:
        t0 = time.monotonic()
        ctx = mp.get_context("spawn")  # fork after CUDA init is unsafe; spawn gives a clean device context
        parent, child = ctx.Pipe()
        env = _inherited_env()
        self.proc = ctx.Process(target=_worker_main, args=(child, env), daemon=True, name="harness-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        try:
            if parent.poll(GROUP_START_TIMEOUT_S):
                parent.recv()  # "ready"; a worker that died starting shows up as a crash of the first cell
        except EOFError:
            pass
        self.starts += 1
        self.start_seconds += time.monotonic() - t0

    def run(self, plan_path: str, cell_id: str, run: RunSettings, timeout_s: float, tol_default=None) -> dict:
        tp = Cell.from_id(cell_id).tp
        if tp > 1:
            if tp not in self.groups:
                self.groups[tp] = WorkerGroup(tp)
            return self.groups[tp].run(plan_path, cell_id, run, timeout_s, tol_default)
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
        for group in self.groups.values():
            group.stop(kill)
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


# ---------------------------------------------------------------- tensor-parallel groups


def _exit_with_parent(parent_pid: int) -> None:
    """A rank whose pytest process died (even by SIGKILL) exits too: no stray processes, ever."""

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _rank_main(conn, rank: int, size: int, backend: str, store: str, stacks: str, env: dict, parent_pid: int) -> None:
    os.environ.update(env)
    os.setpgrp()  # killing this process group also ends anything the rank started (compile workers)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _exit_with_parent(parent_pid)
    stacks_file = open(stacks, "w")
    faulthandler.register(signal.SIGUSR1, file=stacks_file, all_threads=True)  # where a hung rank is stuck
    try:
        from .hardware import use_triton_interpreter

        use_triton_interpreter()
        import torch
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(rank)  # one GPU per rank
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=size,
                                timeout=timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))
        from . import tp
    except BaseException:
        conn.send({"error": traceback.format_exc()})
        return
    conn.send({"ready": True})
    device = "cuda" if backend == "nccl" else "cpu"
    while True:
        try:
            task = conn.recv()
        except EOFError:
            break
        if task is None:
            break
        if rank == 0:
            reply = _lead_cell(task, tp)
        else:
            try:
                tp.follow_cell(task, rank, size, device)
                reply = {"ok": True}
            except BaseException:
                reply = {"error": traceback.format_exc(), "fatal": True}
        if backend == "nccl":
            torch.cuda.empty_cache()  # groups of every TP size share GPU 0..N-1: hold no cached blocks between cells
        conn.send(reply)
        if reply.get("fatal"):
            break  # the group is replaced before the next cell
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def _lead_cell(task: dict, tp) -> dict:
    """Rank 0: run the cell's hypothesis loop (driving the other ranks), then release them."""
    tp.last_rank_failure.update(traceback=None, restart=False)
    try:
        result = run_cell(task["plan"], task["cell"], RunSettings(**task["run"]), task.get("tol_default"))
    except BaseException as exc:  # ranks may be out of step now: the group is replaced
        result = {"status": "failed", "reason": f"harness error: {type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(), "fatal": True}
    try:
        tp.finish_cell()
    except BaseException as exc:
        result.update(fatal=True, status="failed",
                      reason=result.get("reason") or f"the ranks could not be released after the cell: {exc}")
    if result["status"] != "passed" and tp.last_rank_failure["traceback"]:
        result["traceback"] = tp.last_rank_failure["traceback"]
    if tp.last_rank_failure["restart"]:
        result["fatal"] = True  # a rank raised: its process (or device) may be in any state
    return result


class GroupFault(Exception):
    """A rank of the group died, or the group did not start."""


class GroupTimeout(Exception):
    """A rank did not answer in time."""


class WorkerGroup:
    """N rank processes in one torch.distributed group, serving every cell of one TP size."""

    def __init__(self, size: int):
        from .hardware import detect

        self.size = size
        self.backend = "nccl" if detect().has_cuda else "gloo"
        self.procs: list = []
        self.conns: list = []
        self.dir: str | None = None
        self.starts = 0
        self.start_seconds = 0.0

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def _stacks_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.stacks")

    def _start(self) -> None:
        t0 = time.monotonic()
        ctx = mp.get_context("spawn")  # fork after torch (or CUDA) init is unsafe
        self.dir = tempfile.mkdtemp(prefix=f"harness-tp{self.size}-")
        env = {**_inherited_env(), **TP_ENV}
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, name=f"harness-tp{self.size}-rank{rank}", daemon=True,
                               args=(child, rank, self.size, self.backend, os.path.join(self.dir, "store"),
                                     self._stacks_path(rank), env, os.getpid()))
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        self.starts += 1
        deadline = time.monotonic() + GROUP_START_TIMEOUT_S
        try:
            for rank in range(self.size):
                msg = self._receive(rank, deadline)
                if "error" in msg:
                    raise GroupFault(f"rank {rank} could not join the {self.backend} group:\n{msg['error']}")
        except GroupTimeout:
            raise GroupFault(f"the ranks did not join the {self.backend} group within {GROUP_START_TIMEOUT_S:g} s")
        finally:
            self.start_seconds += time.monotonic() - t0

    def _receive(self, rank: int, deadline: float) -> dict:
        """The next message from `rank`; GroupFault as soon as any rank has died, GroupTimeout at the deadline."""
        conn = self.conns[rank]
        while True:
            if conn.poll(0.05):
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    self.procs[rank].join(5)  # its pipe closed: it is exiting
            for r, proc in enumerate(self.procs):
                if proc.exitcode is not None:
                    raise GroupFault(f"rank {r} of {self.size} {describe_exit(proc.exitcode)}")
            if time.monotonic() > deadline:
                raise GroupTimeout()

    def run(self, plan_path: str, cell_id: str, run: RunSettings, timeout_s: float, tol_default=None) -> dict:
        t0 = time.monotonic()
        if not self.alive:
            self.stop(kill=True)  # whatever is left of a broken group
            try:
                self._start()
            except GroupFault as exc:
                self.stop(kill=True)
                return self._facts({"status": "failed", "fatal": True, "duration_s": round(time.monotonic() - t0, 3),
                                    "reason": f"the {self.size}-rank worker group did not start: {exc}"})
        task = {"plan": str(plan_path), "cell": cell_id, "run": asdict(run), "tol_default": tol_default}
        t0 = time.monotonic()
        try:
            for conn in self.conns:
                conn.send(task)
            result = self._receive(0, t0 + timeout_s)
            if not result.get("fatal"):
                for rank in range(1, self.size):
                    ack = self._receive(rank, time.monotonic() + FOLLOWER_ACK_TIMEOUT_S)
                    if "error" in ack:
                        result = {"status": "failed", "fatal": True, "traceback": ack["error"],
                                  "reason": f"rank {rank} of {self.size} failed in the cell: "
                                            f"{ack['error'].strip().splitlines()[-1]}"}
            if result.get("fatal"):
                self._raise_if_a_rank_died()  # a rank that died explains rank 0's failure better than rank 0 can
        except GroupTimeout:
            where, stacks = self._where_stuck()
            self.stop(kill=True)
            result = {"status": "failed", "fatal": True, "traceback": stacks,
                      "reason": f"timed out after {timeout_s:g} s (numerics.timeout_s): {where}"}
        except (GroupFault, BrokenPipeError, ConnectionResetError) as exc:
            self.stop(kill=True)
            result = {"status": "failed", "fatal": True,
                      "reason": f"{exc} while running this cell; the group is restarted for later cells"}
        if "duration_s" not in result:
            result["duration_s"] = round(time.monotonic() - t0, 3)
        if result.get("fatal"):
            self.stop()
        return self._facts(result)

    def _raise_if_a_rank_died(self, grace_s: float = 1.0) -> None:
        deadline = time.monotonic() + grace_s
        for rank, proc in enumerate(self.procs[1:], 1):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is not None:
                raise GroupFault(f"rank {rank} of {self.size} {describe_exit(proc.exitcode)}")

    def _facts(self, result: dict) -> dict:
        result.setdefault("facts", {}).update(ranks=self.size, backend=self.backend, worker_starts=self.starts)
        return result

    def _where_stuck(self) -> tuple[str, str]:
        """Ask every rank for its Python stack (faulthandler on SIGUSR1): which rank is stuck where."""
        for proc in self.procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)
        stuck, dumps = [], []
        for rank in range(self.size):
            try:
                text = open(self._stacks_path(rank)).read()
            except OSError:
                text = ""
            # The main thread's stack is the one that runs _rank_main; its first frame is the innermost.
            main = next((block for block in re.split(r"\n(?=\S)", text) if "in _rank_main" in block), "")
            frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', main)
            dumps.append(f"rank {rank}:\n{main.strip() or '(no stack)'}")
            if frames and "torch/distributed" not in frames[0][0]:  # not waiting for the others: stuck itself
                stuck.append(f"rank {rank} of {self.size} did not return (at {frames[0][0]}:{frames[0][1]} "
                             f"in {frames[0][2]})")
        where = "; ".join(stuck) or "the ranks did not finish the cell (a hang or an endless loop?)"
        return where, "\n\n".join(dumps)

    def stop(self, kill: bool = False) -> None:
        """End every rank: politely (None on the pipe) unless `kill`, and by SIGKILL to its process group
        for any that is still there after a few seconds."""
        if not kill:
            for conn in self.conns:
                try:
                    conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
            deadline = time.monotonic() + 10
            for proc in self.procs:
                proc.join(max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive() or kill:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the rank's own process group (os.setpgrp in _rank_main)
                except (ProcessLookupError, PermissionError):
                    pass
                if proc.is_alive():
                    proc.kill()  # it had not made its process group yet
            proc.join(5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

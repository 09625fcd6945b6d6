"""Fault isolation: items run in a child process that is replaced after a crash, a hang or a poisoned device.

The layer is generic: `Worker.call(fn, kwargs, timeout_s)` runs a module-level function in a child
process (sent by reference, as pickle sends functions) and returns its value, or a `Fault` saying in
words why there is none. Numerics cells, benchmark items and vLLM integration items all run this way.
One worker serves many calls (starting one costs an interpreter plus torch and triton imports), so
the price of isolation is paid once per pytest process and again only after a fault. A value whose
`fatal` attribute is true (a poisoned CUDA context) also retires the worker.

Tensor-parallel cells run in a WorkerGroup: N processes joined by torch.distributed (gloo on CPU,
NCCL with one GPU per rank), started once per TP size and kept for every later cell of that size.
Every rank gets the same call; rank 0's value is the result (harness.tp has rank 0 drive the
others). A rank that crashes or hangs faults the call with its exit or its stack, and the whole
group is replaced.
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
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .device import detect
from .interpreter import make_faithful

# Multicast NVLink (NVLS) is off for every group: where the fabric does not support it, NCCL and
# symmetric memory fail at init or hang.
TP_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GROUP_START_TIMEOUT_S = 300.0  # N interpreters importing torch and triton, then joining the group, on a busy machine
FOLLOWER_ACK_TIMEOUT_S = 60.0  # ranks above 0 report back right after rank 0 ends the cell
# Collectives inside a cell; the parent's numerics.timeout_s normally fires first and kills the group.
PROCESS_GROUP_TIMEOUT_S = 3600


def _inherited_env() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(("TRITON_", "CUDA_", "NCCL_", "TORCH_"))}


@dataclass
class Fault:
    """A call that gave no value: the function raised, the process died, or it outlived its time limit."""

    reason: str
    traceback: str | None = None
    facts: dict | None = None


def _serve(conn, fn: Callable, kwargs: dict) -> bool:
    """Run one call and send its reply; returns whether this process must exit (a fatal value)."""
    try:
        value = fn(**kwargs)
        reply = ("ok", value)
    except BaseException as exc:  # a harness-side failure still replies instead of killing the process
        reply = ("raised", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    conn.send(reply)
    return reply[0] == "ok" and bool(getattr(reply[1], "fatal", False))


def _worker_main(conn, env: dict) -> None:
    os.environ.update(env)  # TRITON_INTERPRET among them, before any kernel imports triton
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    make_faithful()  # on a CPU machine: the interpreter computes what a GPU computes (harness.interpreter)
    conn.send("ready")  # a call's time limit starts after this, so a slow start never times a call out
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None or _serve(conn, *task):
            return  # asked to stop, or the device context is unusable: the parent starts a fresh worker


def _fault(reply: tuple) -> Any:
    """The caller's view of a reply: the value, or a Fault for a call that raised."""
    if reply[0] == "ok":
        return reply[1]
    return Fault(f"harness error: {reply[1]}", reply[2])


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
    """A child process that runs calls; restarted on demand after it dies, hangs or reports a fatal value."""

    def __init__(self):
        self.proc = None
        self.conn = None
        self.starts = 0

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # fork after CUDA init is unsafe; spawn gives a clean device context
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, _inherited_env()), daemon=True,
                                name="harness-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        try:
            if parent.poll(GROUP_START_TIMEOUT_S):
                parent.recv()  # "ready"; a worker that died starting shows up as a crash of the first call
        except EOFError:
            pass
        self.starts += 1

    def call(self, fn: Callable, kwargs: dict, timeout_s: float) -> Any:
        """`fn(**kwargs)` in the worker: its value, or a Fault."""
        if self.proc is None or not self.proc.is_alive():
            self._start()
        try:
            self.conn.send((fn, kwargs))
            if not self.conn.poll(timeout_s):
                self.stop(kill=True)
                return Fault(f"timed out after {timeout_s:g} s (numerics.timeout_s): the kernel did not return "
                             "(a hang or an endless loop?)")
            reply = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.stop(kill=True)
            return Fault(f"the worker process running this cell {describe_exit(code)}; the cell crashed the "
                         "process (later cells run in a fresh one)")
        value = _fault(reply)
        if getattr(value, "fatal", False):
            self.stop(kill=False)
        return value

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
    make_faithful()  # on a CPU machine: the interpreter computes what a GPU computes (harness.interpreter)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # one GPU per rank
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=size,
                                timeout=timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))
    except BaseException:
        conn.send({"error": traceback.format_exc()})
        return
    conn.send({"ready": True})
    while True:
        try:
            task = conn.recv()
        except EOFError:
            break
        if task is None:
            break
        fatal = _serve(conn, *task)
        if backend == "nccl":
            torch.cuda.empty_cache()  # groups of every TP size share GPU 0..N-1: hold no cached blocks between cells
        if fatal:
            break  # the group is replaced before the next cell
    try:
        dist.destroy_process_group()
    except Exception:
        pass


class GroupFault(Exception):
    """A rank of the group died, or the group did not start."""


class GroupTimeout(Exception):
    """A rank did not answer in time."""


class WorkerGroup:
    """N rank processes in one torch.distributed group, serving every cell of one TP size."""

    def __init__(self, size: int):
        self.size = size
        self.backend = "nccl" if detect().has_cuda else "gloo"
        self.procs: list = []
        self.conns: list = []
        self.dir: str | None = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def _stacks_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.stacks")

    def _start(self) -> None:
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

    @property
    def facts(self) -> dict:
        return {"ranks": self.size, "backend": self.backend, "worker_starts": self.starts}

    def call(self, fn: Callable, kwargs: dict, timeout_s: float) -> Any:
        """`fn(**kwargs)` on every rank: rank 0's value, or a Fault naming the rank that failed and how."""
        if not self.alive:
            self.stop(kill=True)  # whatever is left of a broken group
            try:
                self._start()
            except GroupFault as exc:
                self.stop(kill=True)
                return Fault(f"the {self.size}-rank worker group did not start: {exc}", facts=self.facts)
        try:
            for conn in self.conns:
                conn.send((fn, kwargs))
            value = _fault(self._receive(0, time.monotonic() + timeout_s))
            fatal = isinstance(value, Fault) or getattr(value, "fatal", False)
            if not fatal:
                for rank in range(1, self.size):
                    ack = self._receive(rank, time.monotonic() + FOLLOWER_ACK_TIMEOUT_S)
                    if ack[0] != "ok":
                        value, fatal = Fault(f"rank {rank} of {self.size} failed in the cell: {ack[1]}", ack[2]), True
                        break
            if fatal:
                self._raise_if_a_rank_died()  # a rank that died explains rank 0's failure better than rank 0 can
        except GroupTimeout:
            where, stacks = self._where_stuck()
            self.stop(kill=True)
            value, fatal = Fault(f"timed out after {timeout_s:g} s (numerics.timeout_s): {where}", stacks), True
        except (GroupFault, BrokenPipeError, ConnectionResetError) as exc:
            self.stop(kill=True)
            value, fatal = Fault(f"{exc} while running this cell; the group is restarted for later cells"), True
        if fatal:
            self.stop()  # ranks may be out of step: the next call gets a fresh group
        if isinstance(value, Fault):
            value.facts = self.facts
        return value

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

"""Fault isolation: items run in a child process that is replaced after a crash, a hang or a poisoned device.

The layer is generic: `Worker.call(fn, task, timeout_s)` runs `fn(task)` in a child process and returns
its value, or a `Fault` saying in words why there is none. The function goes by reference (as pickle
sends module-level functions), the task pickled: a frozen dataclass carrying the parsed plan
(harness.runtime.tasks), so the child never reads the plan file. Numerics cells, benchmark items and
vLLM integration items all run this way.
One worker serves many calls, so the price of isolation is paid once per pytest process and again only
after a fault. Workers and TP ranks are forked from multiprocessing's fork server, which imported torch, triton
and the harness once and touched no device: a start is a fork, not an interpreter and torch import, and each
child still gets a device context of its own and the caller's environment of the moment. A value whose
`fatal` attribute is true (a poisoned CUDA context) also retires the worker.

No library pool (multiprocessing.Pool, concurrent.futures, pytest-forked) is used because none times
a call per reported example, names the example in flight when its process dies or hangs, retires a
process whose CUDA context is poisoned, or runs one call on every rank of a torch.distributed group.

Time limits. A function that has a `progress` parameter reports how it is getting on: the worker passes
it a callable that sends each event to the parent at once, over the call's pipe. A numerics cell calls
`progress("example", example=ex)` before each example and `progress("finished", failed=...)` after
it. The parent then allows `timeout_s` per example, not per call: the limit restarts on every
progress message, so a slow cell on a busy machine keeps going and only a cell in which an example
does not finish within `timeout_s` fails as hung, naming that example and how many had finished.
Worker start, imports and the cell's set-up (everything before its first example) have a limit of
their own (SETUP_TIMEOUT_S); a cell may run at most TOTAL_TIMEOUT_FACTOR x `timeout_s` from its first
example. A function without a `progress` parameter (benchmarks, vLLM items) has `timeout_s` for the
whole call.

Faults and their examples. The parent remembers the example in flight and the first that failed, so
a call that crashed its worker (or poisoned the device) still names its input, from which
harness.runtime.shrinking replays smaller inputs.

Tensor-parallel cells run in a WorkerGroup: N processes joined by torch.distributed (gloo on CPU,
NCCL with one GPU per rank), started once per TP size and kept for every later cell of that size.
Every rank gets the same call; rank 0's value is the result (harness.runtime.tp has rank 0 drive the
others). A rank that crashes or hangs faults the call with its exit or its stack, and the whole
group is replaced.
"""

from __future__ import annotations

import faulthandler
import inspect
import multiprocessing as mp
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from harness.runtime.device import apply_memory_cap, detect, free_device_memory
from harness.interpreter import make_faithful

# Multicast NVLink (NVLS) is off for every group: where the fabric does not support it, NCCL and
# symmetric memory fail at init or hang.
TP_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GROUP_START_TIMEOUT_S = 300.0  # N interpreters importing torch and triton, then joining the group, on a busy machine
FOLLOWER_ACK_TIMEOUT_S = 60.0  # ranks above 0 report back right after rank 0 ends the cell
# Collectives inside a cell; the parent's numerics.timeout_s normally fires first and kills the group.
PROCESS_GROUP_TIMEOUT_S = 3600
# A cell's set-up before its first example (the kernel imported, its reference and runner built, on
# every rank) has this long, or numerics.timeout_s if that is longer: imports are outside the per-example limit.
SETUP_TIMEOUT_S = 300.0
# A cell that keeps finishing examples is still stopped after this many times numerics.timeout_s.
TOTAL_TIMEOUT_FACTOR = 10


def _forking_context():
    """Workers and ranks fork from a server that imported FORKSERVER_PRELOAD and touched no device: a clean device
    context (forking after CUDA init is unsafe) without a Python start and torch import per process."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def _mirror_env(env: dict) -> None:
    """The caller's environment as it is now, not the fork server's, which is the caller's when the server started
    (a plan's run, or a test, may set TRITON_INTERPRET, HARNESS_VLLM_OPS_LIBRARY, TORCHINDUCTOR_* since)."""
    for name in set(os.environ) - set(env):
        del os.environ[name]
    os.environ.update(env)


@dataclass
class Fault:
    """A call that gave no value: the function raised, the process died, or it outlived its time limit.

    kind: "raised" (harness-side error), "crashed" (the process died), "hung" (no example finished in time),
    "too slow" (the total cap), "setup" (the call did not get to its first example in time).
    example: the example in flight when it happened, where the function reported one; examples: how many
    had finished."""

    reason: str
    traceback: str | None = None
    facts: dict | None = None
    kind: str = "raised"
    example: Any = None
    examples: int | None = None


def reports_progress(fn: Callable) -> bool:
    """Whether `fn` takes a `progress` callable (and so is timed per example, not per call)."""
    try:
        return "progress" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class _Progress:
    """The `progress` callable a reporting function gets in the worker: each event goes to the parent at once."""

    def __init__(self, conn):
        self.conn = conn

    def __call__(self, event: str, **details) -> None:
        self.conn.send(("progress", event, details))


def _invoke(fn: Callable, task: Any, **progress) -> Any:
    """`fn(task)`; `fn()` for a call without a task (None)."""
    return fn(**progress) if task is None else fn(task, **progress)


def _serve(conn, fn: Callable, task: Any, reports: bool = False) -> bool:
    """Run one call and send its reply; returns whether this process must exit (a fatal value)."""
    try:
        value = _invoke(fn, task, progress=_Progress(conn)) if reports else _invoke(fn, task)
        reply = ("ok", value)
    except BaseException as exc:  # a harness-side failure still replies instead of killing the process
        reply = ("raised", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    conn.send(reply)
    return reply[0] == "ok" and bool(getattr(reply[1], "fatal", False))


def start_up() -> None:
    """What every worker and rank does at its start, outside every call's time limit: on a CPU machine the
    interpreter made to compute what a GPU computes (harness.interpreter), and the imports torch makes
    lazily, on first use (torch.testing's first comparison imports torch.distributed.tensor, sympy, torch.fx: 0.7 s
    on a 2-core CPU machine, several times that on a busy one). Cheap where the fork server did it already
    (harness.runtime.worker_preload)."""
    make_faithful()
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))


def _worker_main(conn, env: dict, prepare: tuple[Callable, Any] | None = None) -> None:
    _mirror_env(env)  # TRITON_INTERPRET among them, before any kernel module decorates its kernels
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    start_up()
    apply_memory_cap()  # plans side by side on one GPU (HARNESS_GPU_MEMORY_FRACTION)
    if prepare:
        try:
            _invoke(*prepare)
        except Exception:  # the first call meets the same error, and reports it where it belongs
            pass
    conn.send("ready")  # a call's time limit starts after this, so a slow start never times a call out
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None or _serve(conn, *task):
            return  # asked to stop, or the device context is unusable: the parent starts a fresh worker
        free_device_memory()  # sit on no cached blocks between cells: other processes may share the GPU


def _fault(reply: tuple) -> Any:
    """The caller's view of a reply: the value, or a Fault for a call that raised."""
    if reply[0] == "ok":
        return reply[1]
    return Fault(f"harness error: {reply[1]}", reply[2])


def describe_example(example: Any) -> str:
    return example.describe() if hasattr(example, "describe") else str(example)


def _examples(n: int) -> str:
    return f"{n} example{'' if n == 1 else 's'}"


@dataclass
class CallProgress:
    """The parent's view of one call: what it reported so far, and when it runs out of time."""

    timeout_s: float
    reports: bool
    started: float = field(default_factory=time.monotonic)
    first: float | None = None  # when the first example started: the per-example clock and the total cap start here
    last: float | None = None  # the last progress: an example started or finished
    finished: int = 0
    running: Any = None  # the example started and not yet finished
    first_failed: Any = None  # the first example that failed
    first_faulted: Any = None  # the first example after which the device was unusable (device_fault)

    def update(self, event: str, details: dict) -> None:
        now = time.monotonic()
        if event == "example":
            self.running, self.last = details.get("example"), now
            self.first = self.first or now
        elif event == "finished":
            self.finished, self.last = self.finished + 1, now
            if details.get("failed") and self.first_failed is None:
                self.first_failed = self.running
            if details.get("device_fault") and self.first_faulted is None:
                self.first_faulted = self.running
            self.running = None

    @property
    def setup_limit_s(self) -> float:
        return max(SETUP_TIMEOUT_S, self.timeout_s)

    @property
    def cap_s(self) -> float:
        return TOTAL_TIMEOUT_FACTOR * self.timeout_s

    def deadline(self) -> float:
        if not self.reports:
            return self.started + self.timeout_s
        if self.first is None:  # still setting up: loading the kernel, building the runner, hypothesis's own start
            return self.started + self.setup_limit_s
        return min(self.last + self.timeout_s, self.first + self.cap_s)

    def expired(self, where: str | None = None, stacks: str | None = None) -> Fault:
        """The Fault for a call past its deadline; `where` says where it was stuck, if known."""
        t = self.timeout_s
        if not self.reports:
            reason, kind = f"timed out after {t:g} s (numerics.timeout_s): {where or 'the kernel did not return'} " \
                           "(a hang or an endless loop?)", "hung"
        elif self.first is None:
            reason, kind = (f"the cell did not get to its first example within {self.setup_limit_s:g} s (importing "
                            f"the kernel, building its runner): {where or 'it did not return'}",
                            "setup")
        elif self.first + self.cap_s < self.last + t:  # the total cap came first
            reason, kind = (f"the cell was still running after {self.cap_s:g} s ({TOTAL_TIMEOUT_FACTOR} x "
                            f"numerics.timeout_s), its total limit, with {_examples(self.finished)} finished in that "
                            "time: a slow cell, not a hang (fewer numerics.examples, smaller sizes or a larger "
                            "numerics.timeout_s)", "too slow")
        elif self.running is None:
            reason, kind = (f"no example finished within {t:g} s (numerics.timeout_s); {_examples(self.finished)} "
                            f"had finished: {where or 'the cell stopped between two examples'}", "hung")
        else:
            reason, kind = (f"no example finished within {t:g} s (numerics.timeout_s); {_examples(self.finished)} "
                            f"had finished: {where or 'the kernel did not return'} on {describe_example(self.running)} "
                            "(a hang or an endless loop?)", "hung")
        return Fault(reason, stacks, kind=kind, example=self.running, examples=self.finished)

    def crashed(self, reason: str, in_a_peer: bool = False) -> Fault:
        """The Fault for a process that died. Its example: the one in flight; or, where the process that died is
        a peer of the one reporting (a rank of a group), the first that failed, since rank 0 sees the
        collectives fail on that example and goes on to fail others before the parent notices."""
        example = (self.first_failed or self.running) if in_a_peer else self.running
        return Fault(reason, kind="crashed", example=example, examples=self.finished)


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


def _send_stop(conns: list) -> None:
    """None on each pipe: the process at its other end returns from its loop (one already gone is left be)."""
    for conn in conns:
        try:
            conn.send(None)
        except (OSError, BrokenPipeError):
            pass


class Worker:
    """A child process that runs calls; restarted on demand after it dies, hangs or reports a fatal value."""

    def __init__(self):
        self.proc = None
        self.conn = None
        self.starts = 0
        self.progress: CallProgress | None = None  # of the last call
        self.ready = False  # the running process has said it is ready

    @property
    def facts(self) -> dict:
        return {}

    def start(self, prepare: tuple[Callable, Any] | None = None) -> None:
        """Start the process without waiting for it, so that its imports, and `prepare` ((fn, task): `fn(task)`
        loading what its calls will need), overlap the caller's work; the first call waits until it is ready. A
        process that dies is restarted without `prepare`."""
        if self.proc is not None and self.proc.is_alive():
            return
        ctx = _forking_context()
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, dict(os.environ), prepare), daemon=True,
                                name="harness-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        self.starts += 1
        self.ready = False

    def _start(self) -> Fault | None:
        self.start()
        if self.ready:
            return None
        parent = self.conn
        try:
            if not parent.poll(GROUP_START_TIMEOUT_S):
                self.stop(kill=True)
                return Fault(f"the worker process did not start within {GROUP_START_TIMEOUT_S:g} s (starting Python "
                             "and importing torch and triton)", kind="setup")
            parent.recv()  # "ready"; a worker that died starting shows up as a crash of the first call
        except EOFError:
            pass
        self.ready = True
        return None

    def call(self, fn: Callable, task: Any, timeout_s: float, meanwhile: Callable[[], None] | None = None) -> Any:
        """`fn(task)` in the worker (`fn()` where `task` is None): its value, or a Fault. Timed per example when `fn`
        reports progress. `meanwhile()` runs in this process once the call is under way (writing the last item's
        results while the worker times the next); what it raises is raised once the call is done."""
        if self.proc is None or not self.proc.is_alive() or not self.ready:
            fault = self._start()  # outside the call's time limit
            if fault:
                return fault
        watch = self.progress = CallProgress(timeout_s, reports_progress(fn))
        error = None
        try:
            self.conn.send((fn, task, watch.reports))
            if meanwhile is not None:
                try:
                    meanwhile()
                except Exception as exc:  # raised once the worker's reply is read (below)
                    error = exc
            while True:
                if not self.conn.poll(max(0.0, watch.deadline() - time.monotonic())):
                    self.stop(kill=True)
                    return watch.expired()
                reply = self.conn.recv()
                if reply[0] != "progress":
                    break
                watch.update(reply[1], reply[2])
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.stop(kill=True)
            return watch.crashed(f"the worker process running this cell {describe_exit(code)}; the cell crashed "
                                 "the process (later cells run in a fresh one)")
        finally:
            if error is not None:  # the worker's reply is read first, so the next call starts in step
                raise error
        value = _fault(reply)
        if getattr(value, "fatal", False):
            self.stop(kill=False)
        return value

    def ask_to_stop(self) -> None:
        """Ask the process to end without waiting: it winds down while the caller goes on; `stop` waits for it."""
        _send_stop([self.conn] if self.conn is not None else [])

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill and self.proc.is_alive():
            self.proc.kill()
        else:
            self.ask_to_stop()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()
        self.proc = self.conn = None


# ---------------------------------------------------------------- tensor-parallel groups


def _exit_with_parent() -> None:
    """A rank whose pytest process died (even by SIGKILL) exits too: no stray processes, ever. Its parent is the
    fork server, which exits when the pytest process does; the rank is then re-parented."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _rank_main(conn, rank: int, size: int, backend: str, store: str, stacks: str, env: dict) -> None:
    _mirror_env(env)
    os.setpgrp()  # killing this process group also ends anything the rank started (compile workers)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _exit_with_parent()
    stacks_file = open(stacks, "w")
    faulthandler.register(signal.SIGUSR1, file=stacks_file, all_threads=True)  # where a hung rank is stuck
    start_up()
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)  # one GPU per rank
            apply_memory_cap()
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
            free_device_memory()  # groups of every TP size share GPU 0..N-1: hold no cached blocks between cells
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
        self.progress: CallProgress | None = None  # of the last call

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def _stacks_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.stacks")

    def _start(self) -> None:
        ctx = _forking_context()
        self.dir = tempfile.mkdtemp(prefix=f"harness-tp{self.size}-")
        env = {**os.environ, **TP_ENV}
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, name=f"harness-tp{self.size}-rank{rank}", daemon=True,
                               args=(child, rank, self.size, self.backend, os.path.join(self.dir, "store"),
                                     self._stacks_path(rank), env))
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
            raise GroupFault(f"the ranks did not join the {self.backend} group within {GROUP_START_TIMEOUT_S:g} s") \
                from None

    def _reply(self, rank: int, watch: CallProgress) -> tuple:
        """`rank`'s reply to the call, taking in its progress messages (each may move the deadline)."""
        while True:
            msg = self._receive(rank, watch.deadline)
            if msg[0] != "progress":
                return msg
            watch.update(msg[1], msg[2])

    def _receive(self, rank: int, deadline: float | Callable[[], float]) -> dict:
        """The next message from `rank`; GroupFault as soon as any rank has died, GroupTimeout at the deadline
        (a time, or a function giving it)."""
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
            if time.monotonic() > (deadline() if callable(deadline) else deadline):
                raise GroupTimeout()

    @property
    def facts(self) -> dict:
        return {"ranks": self.size, "backend": self.backend, "worker_starts": self.starts}

    def call(self, fn: Callable, task: Any, timeout_s: float) -> Any:
        """`fn(task)` on every rank: rank 0's value, or a Fault naming the rank that failed and how.
        Timed per example from rank 0's progress when `fn` reports progress (rank 0 starts its first example
        once every rank has set up the cell)."""
        if not self.alive:
            self.stop(kill=True)  # whatever is left of a broken group
            try:
                self._start()  # outside the call's time limit
            except GroupFault as exc:
                self.stop(kill=True)
                return Fault(f"the {self.size}-rank worker group did not start: {exc}", facts=self.facts,
                             kind="setup")
        watch = self.progress = CallProgress(timeout_s, reports_progress(fn))
        try:
            for conn in self.conns:
                conn.send((fn, task, watch.reports))
            value = _fault(self._reply(0, watch))
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
            value, fatal = watch.expired(where, stacks), True
        except (GroupFault, BrokenPipeError, ConnectionResetError) as exc:
            self.stop(kill=True)
            value, fatal = watch.crashed(f"{exc} while running this cell; the group is restarted for later cells",
                                         in_a_peer=True), True
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
        where = "; ".join(stuck) or "the ranks did not finish the cell"
        return where, "\n\n".join(dumps)

    def ask_to_stop(self) -> None:
        """Ask every rank to end, without waiting (Worker.ask_to_stop)."""
        _send_stop(self.conns)

    def stop(self, kill: bool = False) -> None:
        """End every rank: politely (None on the pipe) unless `kill`, and by SIGKILL to its process group
        for any that is still there after a few seconds."""
        if not kill:
            self.ask_to_stop()
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


# Workers and ranks fork from a server that imported these (no device touched): a fork, not a Python start and
# torch import (on a 2-core CPU machine a TP-2 cell's plan ran in 6.6 s against 14-19 s spawned); the last one does
# there, once, what each child would do at its start (harness.runtime.worker_preload).
FORKSERVER_PRELOAD = ["torch", "triton", "hypothesis", "harness.runtime.runner", "harness.runtime.tp",
                      "harness.runtime.worker_preload"]

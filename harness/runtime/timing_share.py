"""Timings shared between the plans of one benchmark run: where a later plan times the same call on the same inputs
in the same graph mode as an earlier one, it takes that timing instead of measuring it again.

vLLM's own kernels have plans of their own (kernels/plans/vllm_*.yaml) with the op, reference, arguments and sizes
of a bundled plan: their kernel is the bundled plan's `vllm` baseline and their `native` and `compiled` baselines
are the bundled plan's, so every one of their timings was already measured that night (about a third of the
nightly's items). scripts/gpu_run.sh bench points HARNESS_SHARED_TIMINGS at a new, empty folder for each run; off
(unset), every plan times everything itself.

The same call: one function (a Python function by module, name and the digest of its source file; vLLM's compiled
op by name and the library it came from; `compiled` is the native code under this torch's Inductor) given the same
arguments as the item built them (each tensor's dtype, shape, strides and a sample of its values, of the first and
last rotated input set, and how many sets there are). Each implementation is still checked against its own plan's
reference and tolerance; only the timing loop is skipped. The record names the plan and item the samples came from
(ImplFigures.timed_in), and its page says how many of its figures were taken over.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from harness.runtime.device import detect, inductor_settings, package_version
from harness.runtime.resolve import named_baseline, resolve
from harness.runtime.timing import Timing
from harness.runtime.vllm_kernels import LIBRARY_ENV
from harness.spec.plan import Plan
from harness.spec.vllm_ops import vllm_kernel_for
from harness.spec.vllm_schemas import VLLM_KERNELS

SHARE_ENV = "HARNESS_SHARED_TIMINGS"
SAMPLED_VALUES = 4096  # values of each tensor that go into its fingerprint (a strided sample of the whole)


@dataclass
class SharedTiming:
    timing: Timing
    launches: int | None
    origin: str  # "<op> <item id> <implementation>" of the run that measured it


@lru_cache(maxsize=None)
def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _source_digest(fn: Any) -> str:
    try:
        return _file_digest(inspect.getsourcefile(fn) or "")
    except (TypeError, OSError):  # a builtin or an object without a file: its name alone
        return ""


def _python(fn: Any) -> str:
    fn = inspect.unwrap(fn)
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}@{_source_digest(fn)}"


def _vllm_op(in_tree: str) -> str:
    # Where the ops came from: the named library, else the installed vLLM (harness.runtime.vllm_kernels).
    library = os.environ.get(LIBRARY_ENV) or f"vllm {package_version('vllm')}"
    return f"torch.ops._C.{in_tree}@{library}"


def _call(plan: Plan, name: str) -> tuple[str, list[str], bool] | None:
    """What implementation `name` runs, the plan arguments it is passed and whether by position (vLLM's ops) or by
    keyword (Python functions: the names say which parameter each is). None: nothing to share it by."""
    every = [a.name for a in plan.args]
    if name == "kernel":
        if plan.vllm_kernel:
            return _vllm_op(VLLM_KERNELS[plan.vllm_kernel].in_tree), every, True
        return f"kernel {_python(resolve(plan).kernel)}", every, False
    if name in ("native", "compiled"):  # the reference's calling convention: its inputs, by keyword
        what = f"reference {_python(resolve(plan).native)}"
        if name == "compiled":  # the same function under the same Inductor compiles to the same code
            what = f"torch.compile {torch.__version__} {inductor_settings()} {what}"
        return what, [a.name for a in plan.args if a.role != "output"], False
    if name == "vllm":
        spec = vllm_kernel_for(plan)
        return (_vllm_op(spec.in_tree), list(spec.args), True) if spec else None
    path = dict(plan.benchmark.named).get(name)
    fn = named_baseline(plan, path) if path else None
    if fn is None or isinstance(fn, str):
        return None
    prepare = plan.benchmark.prepare(name)
    prepared = named_baseline(plan, prepare) if prepare else None
    if isinstance(prepared, str):
        return None
    return f"kernel {_python(fn)}" + (f" prepared by {_python(prepared)}" if prepared else ""), every, False


def _fingerprint(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return repr(value)
    flat = value.detach().flatten()
    sample = flat[:: max(1, flat.numel() // SAMPLED_VALUES)][:SAMPLED_VALUES].contiguous().cpu()
    values = hashlib.sha256(sample.view(torch.uint8).numpy().tobytes()).hexdigest()[:16] if sample.numel() else ""
    return f"{value.dtype} {tuple(value.shape)} {value.stride()} {value.storage_offset() % 1024} {values}"


def built_inputs(sets: list[dict]) -> tuple[dict, dict] | None:
    """Each argument of the first and last rotated input set as the item built them, taken before any implementation
    runs on them (an in-place kernel changes its inputs, and the implementations after it time on those); None where
    timings are not shared (HARNESS_SHARED_TIMINGS unset)."""
    if not os.environ.get(SHARE_ENV):
        return None
    return tuple({name: _fingerprint(value) for name, value in values.items()} for values in (sets[0], sets[-1]))


def timing_key(plan: Plan, name: str, graph_mode: str, built: tuple[dict, dict] | None, count: int) -> str | None:
    """The key of implementation `name` timed in `graph_mode` over `count` input sets whose first and last are
    `built` (built_inputs), on this machine; None where timings are not shared or the call has no identity."""
    call = _call(plan, name) if built is not None else None
    if call is None:
        return None
    what, passed, positional = call
    hw = detect()
    parts = [what, "by position" if positional else "by keyword", graph_mode, str(count), hw.gpu, hw.sm]
    for prints in built:
        parts += [f"{i if positional else arg}={prints.get(arg, 'absent')}" for i, arg in enumerate(passed)]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{part}\0".encode())
    return digest.hexdigest()[:40]


def _path(key: str) -> Path:
    return Path(os.environ[SHARE_ENV]) / f"{key}.json"


def shared_timing(key: str | None) -> SharedTiming | None:
    """The timing an earlier plan of this run stored under `key`, if any."""
    if key is None:
        return None
    try:
        data = json.loads(_path(key).read_text())
        return SharedTiming(Timing(**data["timing"]), data["launches"], data["origin"])
    except (OSError, ValueError, KeyError, TypeError):  # none stored, or a file a crash left half written
        return None


def share_timing(key: str | None, timing: Timing, launches: int | None, origin: str) -> None:
    """Store a timing for the later plans of this run (written whole, then renamed into place)."""
    if key is None:
        return
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        json.dump({"timing": asdict(timing), "launches": launches, "origin": origin}, tmp)
    os.replace(tmp.name, path)

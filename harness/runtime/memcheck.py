"""Memory safety on GPUs: a cell's examples called under compute-sanitizer memcheck.

A kernel whose loads are unmasked but whose stores are masked returns the right values: only a memory
checker sees it read past a row or a tensor. A `memcheck` cell runs a bounded number of drawn examples,
eagerly, in a fresh process under `compute-sanitizer --tool memcheck`, with PyTorch's caching allocator
off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that every tensor is an allocation of its own size: a read or
write past its end lands outside it, where memcheck reports it (with the allocator on it lands inside a
cached block and nothing is seen). The first error is reported with the kernel, the access and the
example that was running.

Where memcheck finds nothing, three lanes run the same examples, each in a sanitizer process of its own: racecheck
(shared-memory data races), initcheck (reads of device global memory never written) and synccheck (invalid barrier
use). Each lane is a check of its own (harness.results.checks), bounded by its share of the time the cell has left;
a tool that is missing, cannot run here or runs out of time is "not run" in the record's facts, never the kernel's
failure. The cell also runs the reference and the comparisons, whose torch and cuBLAS kernels the tools may flag
(initcheck reads of buffers torch leaves unwritten): only reports placed in the kernel's own code
(`kernel_errors`, by the names and files `kernel_identity` lists in the lane's process) fail the cell; the others are
facts.

`python -m harness.runtime.memcheck TASK` is the process under the sanitizer, TASK a file holding the cell's
`CellTask` (the parsed plan, the cell, EXAMPLES examples) pickled; `run_memcheck` writes it and starts the process.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from harness.runtime.device import detect
from harness.runtime.inputs import Example
from harness.cells.matrix import Cell
from harness.plan.model import Plan
from harness.results.store import CellRecord, InputsSeen, Status, from_json, to_json
from harness.runtime.runner import CellCheck, Outcome, not_run, run_examples
from harness.runtime.tasks import CellTask, RunSettings, read_task, write_task
from harness.runtime.resolve import KernelUnavailable, is_triton_kernel

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"memcheck": 1, "racecheck": 1, "initcheck": 1, "synccheck": 1}

EXAMPLES = 3  # drawn examples per memcheck cell: each costs the sanitizer's start and its slowed launches
RUN = RunSettings(EXAMPLES, "ci", None)  # derandomized, no example database: the sanitizer's process writes nothing
MARK = "harness-memcheck-example: "

# The lanes after a clean memcheck, in order, with their tools' options. racecheck reports each hazard (its threads,
# block and launch backtrace) and its analysis (both source lines); initcheck leaves --track-unused-memory off (an
# op may leave part of a buffer unused); backtraces are asked for, as kernel_errors reads the launch's host frames.
LANES = {
    "racecheck": ["--racecheck-report", "all"],
    "initcheck": ["--show-backtrace", "yes"],
    "synccheck": ["--show-backtrace", "yes"],
}
FOUND = {"racecheck": "hazard", "initcheck": "uninitialised read", "synccheck": "barrier error"}
LANE_PRINT_LIMIT = 100  # the reference's kernels run first: room for the kernel's own reports after theirs
MIN_LANE_S = 5.0  # a lane given less is not started: its process alone takes seconds to start and import torch
LANE_ENV = "HARNESS_SANITIZER_LANE"  # set in a lane's process: it prints the kernel's identity first
IDENTITY = "harness-sanitizer-kernel: "


def sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/compute-sanitizer")
    return str(default) if default.exists() else None


class AnnouncedCheck(CellCheck):
    """Prints each example before its call, so an error in the sanitizer's output can be placed."""

    def __call__(self, ex: Example) -> None:
        print(MARK + ex.describe(), flush=True)
        super().__call__(ex)


def main(argv: list[str]) -> int:
    task: CellTask = read_task(argv[0])
    plan, cell = task.plan, task.cell
    try:
        check = AnnouncedCheck(plan, cell, detect().device)
    except KernelUnavailable as exc:
        outcome = not_run(cell, str(exc))
    else:
        if os.environ.get(LANE_ENV):  # the lane's filter needs it; memcheck's own output stays as it was
            print(IDENTITY + json.dumps(kernel_identity(plan, cell, check.kernel)), flush=True)
        outcome = run_examples(plan, cell, check, task.run)
    print("harness-memcheck-record: " + json.dumps(to_json(outcome.record)), flush=True)
    return 0


def run_memcheck(plan: Plan, cell: Cell, timeout_s: float) -> Outcome:
    """The cell's examples under memcheck, then, where it passes, under each of the LANES in what is left of
    `timeout_s`: failed with the first memory error, or the first lane's error in the kernel's own code."""
    deadline = time.monotonic() + timeout_s
    outcome = _memcheck(plan, cell, timeout_s)
    if outcome.record.status == Status.PASSED:
        run_lanes(plan, cell, outcome.record, deadline)
    return outcome


def _memcheck(plan: Plan, cell: Cell, timeout_s: float) -> Outcome:
    """The cell's examples under memcheck: failed with the first memory error, else passed (values checked too)."""
    rec = CellRecord(**cell.axes(), status=Status.NOT_RUN)
    tool = sanitizer()
    if tool is None:
        rec.reason = "memcheck needs compute-sanitizer (CUDA's toolkit); this machine has none"
        return Outcome(rec)
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harness-memcheck-") as tmp:
        task = Path(tmp) / "task.pickle"
        write_task(CellTask(plan, cell, RUN), task)
        cmd = [tool, "--tool", "memcheck", "--leak-check", "no", "--print-limit", "10", sys.executable, "-m",
               "harness.runtime.memcheck", str(task)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
            text = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            rec.status, rec.reason = Status.FAILED, f"timed out after {timeout_s:g} s under compute-sanitizer memcheck"
            return Outcome(rec)
    rec.duration_s = round(time.monotonic() - start, 3)
    errors = re.search(r"ERROR SUMMARY: (\d+) error", text)
    inner = re.search(r"harness-memcheck-record: (\{.*\})", text)
    if inner:
        data = json.loads(inner.group(1))
        rec.examples = data.get("examples")
        rec.facts = {**data.get("facts", {}), "sanitizer": "memcheck", "caching_allocator": "off"}
        if data.get("passing"):
            rec.passing = from_json(InputsSeen, data["passing"], "memcheck record")
        if data.get("status") == Status.NOT_RUN.value:  # vLLM's kernel cannot be loaded here
            return not_run(cell, data.get("reason", ""))
    if errors is None:
        rec.status = Status.FAILED
        rec.reason = f"compute-sanitizer did not finish (exit {proc.returncode}): {text.strip()[-400:]}"
        return Outcome(rec)
    count = int(errors.group(1))
    if count:
        rec.status = Status.FAILED
        lines = text.splitlines()
        at = next((i for i, ln in enumerate(lines) if "Invalid" in ln or "Error" in ln and "=====" in ln), 0)
        block = [ln.strip("= ").strip() for ln in lines[at:at + 6] if ln.strip("= ").strip()]
        before = "\n".join(lines[:at])
        examples = re.findall(MARK + r"(.*)", before)
        rec.reason = f"memcheck: {count} memory error(s); first: {'; '.join(block[:4])}"
        rec.minimal_example = examples[-1] if examples else None
        return Outcome(rec)
    if inner and json.loads(inner.group(1)).get("status") != "passed":
        data = json.loads(inner.group(1))
        rec.status, rec.reason = Status.FAILED, data.get("reason", "")
        rec.minimal_example = data.get("minimal_example")
        return Outcome(rec)
    if not inner:  # the process under the sanitizer ended before its result (an import error, a crash)
        rec.status = Status.FAILED
        rec.reason = f"the cell's process under compute-sanitizer gave no result: {text.strip()[-400:]}"
        return Outcome(rec)
    rec.status = Status.PASSED
    return Outcome(rec)


# ---------------------------------------------------------------- the lanes: racecheck, initcheck, synccheck


@dataclass
class Lane:
    """One lane's outcome: its fact for the record, and where the kernel's own errors were found, the cell's reason
    and the example that was running. `ran`: the tool ran to its summary (a lane not run says why in its fact)."""

    tool: str
    fact: str
    ran: bool = True
    reason: str = ""
    example: str | None = None


def run_lanes(plan: Plan, cell: Cell, rec: CellRecord, deadline: float) -> None:
    """The LANES after a clean memcheck, each given its share of the time left before `deadline`: the first lane to
    find errors in the kernel's own code fails the cell; every lane's outcome is a fact of the record."""
    start, ran = time.monotonic(), ["memcheck"]
    for i, name in enumerate(LANES):
        lane = run_lane(name, plan, cell, (deadline - time.monotonic()) / (len(LANES) - i))
        rec.facts[name] = lane.fact
        ran += [name] if lane.ran else []
        if lane.reason and rec.status == Status.PASSED:
            rec.status, rec.reason, rec.minimal_example = Status.FAILED, lane.reason, lane.example
    rec.facts["sanitizer"] = ", ".join(ran)
    rec.duration_s = round((rec.duration_s or 0.0) + time.monotonic() - start, 3)


def run_lane(lane: str, plan: Plan, cell: Cell, limit_s: float) -> Lane:
    """The cell's examples (memcheck's, drawn alike) in a fresh process under compute-sanitizer's `lane` tool."""
    tool = sanitizer()
    if tool is None:
        return Lane(lane, "not run: no compute-sanitizer on this machine", ran=False)
    if limit_s < MIN_LANE_S:
        return Lane(lane, f"not run: {max(limit_s, 0):.0f} s of the cell's time limit left for it", ran=False)
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", LANE_ENV: lane}  # initcheck: an allocation per tensor
    with tempfile.TemporaryDirectory(prefix=f"harness-{lane}-") as tmp:
        task = Path(tmp) / "task.pickle"
        write_task(CellTask(plan, cell, RUN), task)
        cmd = [tool, "--tool", lane, *LANES[lane], "--print-limit", str(LANE_PRINT_LIMIT), sys.executable, "-m",
               "harness.runtime.memcheck", str(task)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, env=env)
        except subprocess.TimeoutExpired:
            return Lane(lane, f"not run: did not finish in {limit_s:.0f} s, its share of the cell's time limit",
                        ran=False)
        except OSError as exc:  # the tool cannot be started here
            return Lane(lane, f"not run: compute-sanitizer could not start ({exc})", ran=False)
    return judge_lane(lane, (proc.stdout or "") + (proc.stderr or ""), proc.returncode)


# A line of compute-sanitizer's own saying the tool could not check the process (not a report of the kernel's).
CANNOT_RUN = re.compile(r"^=+ +((?:error: (?!race reported|potential|barrier error|uninitialized|warpgroup|host api)"
                        r"|.*\b(?:not supported|unsupported)\b|.*internal sanitizer error).*)$", re.M | re.I)


def judge_lane(tool: str, text: str, returncode: int) -> Lane:
    """A lane's output judged: errors in the kernel's own code fail the cell (the tool's first one, its source line
    and the example running); errors elsewhere, warnings and errors the output does not place are facts."""
    counted = _summary(tool, text)
    cannot = CANNOT_RUN.search(text)
    if counted is None or cannot:
        why = cannot.group(1).strip() if cannot else \
            f"compute-sanitizer {tool} did not finish (exit {returncode}): {text.strip()[-300:]}"
        return Lane(tool, f"not run: {why}", ran=False)
    reports = parse_reports(tool, text)
    errors = [r for r in reports if r.severity == "error"]
    own, others = kernel_errors(errors, _identity(text))
    what, notes = FOUND[tool], []
    if others:
        notes.append(f"{len(others)} {what}(s) outside the kernel, not counted (first in {others[0].where()})")
    warnings = [r for r in reports if r.severity != "error"]
    if warnings:
        notes.append(f"{len(warnings)} warning(s), not counted (first: {warnings[0].describe()})")
    if counted and not errors:
        notes.append(f"{counted} error(s) its output does not place, not counted")
    if "harness-memcheck-record: " not in text and not own:  # the process ended early: the lane saw only part
        return Lane(tool, f"not run: the process under {tool} gave no result (exit {returncode}): "
                          f"{text.strip()[-300:]}", ran=False)
    if not own:
        return Lane(tool, "; ".join(notes) or "clean")
    count = len(own) if others else max(len(own), counted)
    before = "\n".join(text.splitlines()[:own[0].at])
    examples = re.findall(MARK + r"(.*)", before)
    # racecheck's analysis names both racing source lines: it says more than the first hazard's byte
    shown = next((r for r in own if "race reported" in r.lines[0].lower()), own[0])
    return Lane(tool, "; ".join([f"failed: {count} {what}(s) in the kernel", *notes]),
                reason=f"{tool}: {count} {what}(s); first: {shown.describe()}",
                example=examples[-1] if examples else None)


def _summary(tool: str, text: str) -> int | None:
    """The error count of the tool's closing summary, None where it printed none (it did not finish)."""
    race = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed(?:[\s=]*\((\d+) errors?)?", text)
    if tool == "racecheck" and race:
        return int(race.group(2) or race.group(1))
    found = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
    return int(found.group(1)) if found else None


def _identity(text: str) -> dict | None:
    found = re.search(re.escape(IDENTITY) + r"(\{.*\})", text)
    return json.loads(found.group(1)) if found else None


# The first line of each report a lane's tool prints, by tool (its severity word first, where it has one).
HEADS = {
    "racecheck": re.compile(r"^(?:(error|warning|info):\s*)?(?:race reported between|potential \w+ hazard|"
                            r"potential invalid __shared__)", re.I),
    "initcheck": re.compile(r"^(?:(error|warning):\s*)?(?:uninitialized __\w+__ memory read|"
                            r"host api memory access error)", re.I),
    "synccheck": re.compile(r"^(?:(error|warning):\s*)?(?:barrier error detected|"
                            r"warpgroup mma sequence error detected)", re.I),
}
PLACE = re.compile(r"([^\s:()\[\]]+\.\w+):(\d+)")  # file.py:42, kernel.cu:17 (a full path, or its name alone)


@dataclass
class Report:
    """One report of a sanitizer's output: its lines (the tool's prefix stripped), where it starts in the output,
    the device functions it names, the source lines it places the access at and the libraries of its launch's host
    frames."""

    lines: list[str]
    at: int
    severity: str = "error"
    kernels: list[str] = field(default_factory=list)
    places: list[tuple[str, int]] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)

    def where(self) -> str:
        return self.kernels[0].split("(")[0][:120] if self.kernels else "host code"

    def describe(self) -> str:
        """Its first lines, without the backtraces, and a source line they do not already say."""
        shown = [ln for ln in self.lines if not ln.startswith(("Saved host backtrace", "Host Frame", "Device Frame",
                                                                "in "))][:3]
        shown[0] = re.sub(r"^(?:error|warning|info):\s*", "", shown[0], flags=re.I)
        text = "; ".join(ln if len(ln) <= 240 else ln[:237] + "..." for ln in shown)
        place = next((f"{Path(f).name}:{n}" for f, n in self.places), "")
        return text + (f" ({place})" if place and not PLACE.search(text) else "")


def parse_reports(tool: str, text: str) -> list[Report]:
    """The reports of a lane's tool in its output, each from its first line to the next line of the tool's own that
    is not indented under it (the process's own lines in between are skipped)."""
    reports: list[Report] = []
    current: Report | None = None
    for i, raw in enumerate(text.splitlines()):
        if not raw.startswith("="):
            continue  # the process's own output
        body = raw.lstrip("=")
        content = body.strip()
        head = HEADS[tool].match(content)
        if head:
            current = Report([content], i, (head.group(1) or "error").lower())
            reports.append(current)
        elif current is not None and content and body.startswith("  "):
            current.lines.append(content)
        else:
            current = None
    for r in reports:
        _locate(r)
    return reports


def _locate(report: Report) -> None:
    """The device functions, source lines and host libraries a report names, in the layouts compute-sanitizer
    prints: `at kernel+0x70 in file.py:42`, `at 0x70 in /path/file.py:42:kernel`, `at kernel():0x160 in file.cu:6`,
    `at void ns::kernel<T>(T *)+0x70`, and `Host Frame: sym [0x..] in lib.so` (or its library on the next line)."""
    host = False
    for ln in report.lines:
        if ln.startswith("Host Frame"):
            lib = re.search(r" in (\S+)\s*$", ln) or re.search(r"Host Frame:\s*(/\S+)", ln)
            report.libraries += [Path(lib.group(1)).name] if lib else []
            host = lib is None
            continue
        if host and ln.startswith("in "):
            report.libraries.append(Path(ln[3:].strip()).name)
        host = False
        spots = re.split(r"\bat ", ln)[1:]
        if ln.startswith("Device Frame:"):
            spots = [ln.split(":", 1)[1]]
        for spot in spots:
            kernel, place = _spot(spot)
            report.kernels += [kernel] if kernel else []
            report.places += [place] if place else []


def _spot(spot: str) -> tuple[str, tuple[str, int] | None]:
    """The device function and source line of one `at ...` location ("" and None where it is no location, such as
    `at kernel launch time` or `at 0x7f.. of size 1,024 bytes`)."""
    spot = re.sub(r"\s*\[\d+ hazards?\]\s*$", "", spot.strip())
    older = re.match(r"([^\s:()\[\]]+\.\w+):(\d+):(.+?)(?: \(.*\))?$", spot)
    if older:  # an older Device Frame: /path/file.cu:20:kernel(int*) (kernel(int*) : 0x8f0)
        return older.group(3), (older.group(1), int(older.group(2)))
    left, sep, right = spot.rpartition(" in ")
    left, right = (left, right) if sep else (spot, "")
    found = re.match(r"([^\s:()\[\]]+\.\w+):(\d+)(?::(.+))?$", right.strip())
    place = (found.group(1), int(found.group(2))) if found else None
    if re.fullmatch(r"0x[0-9a-fA-F]+", left.strip()) and sep:  # the offset first, the kernel after its line
        return (found.group(3) or "" if found else right.strip()), place
    kernel = re.sub(r"(?:\+|\s*:\s*)0x[0-9a-fA-F]+$", "", left.strip())
    return ("", None) if kernel == left.strip() else (kernel.strip(), place)


def _bare(kernel: str) -> tuple[str, str]:
    """A device function's bare name and its outermost namespace: `void vllm::rms_norm_kernel<c10::BFloat16>(...)`
    gives ("rms_norm_kernel", "vllm")."""
    name = re.sub(r"^(?:void|static|__global__)\s+", "", kernel.strip()).split("(")[0].split("<")[0].strip()
    parts = name.split("::")
    return parts[-1].strip(), parts[0].strip() if len(parts) > 1 else ""


def kernel_errors(reports: list[Report], identity: dict | None) -> tuple[list[Report], list[Report]]:
    """The reports that belong to the kernel under test, and the others'. A report is the kernel's when a device
    function it names is one the kernel's code defines (by its bare name, outside any namespace: torch's
    `at::native::reduce_kernel` is never a user's `reduce_kernel`) or lies in a namespace of the kernel's code, when
    it places the access in a source file of the kernel's, or when a host frame of its launch lies in one of the
    kernel's shared libraries. Any other report (torch's, cuBLAS's, the reference's own
    kernels), and every report where the kernel's identity is unknown, is another's: never the kernel's failure."""
    if not identity:
        return [], list(reports)
    names, namespaces = set(identity.get("names", ())), set(identity.get("namespaces", ()))
    files, libraries = set(identity.get("files", ())), set(identity.get("libraries", ()))

    def owned(r: Report) -> bool:
        bare = [_bare(k) for k in r.kernels]
        return (any(ns in namespaces or (n in names and not ns) for n, ns in bare if n)
                or any(Path(f).name in files for f, _ in r.places)
                or any(lib in libraries for lib in r.libraries))

    own = [r for r in reports if owned(r)]
    return own, [r for r in reports if not owned(r)]


# ---------------------------------------------------------------- the kernel's identity, in the lane's process

# A CUDA kernel's name where source text defines it: `__global__ void name(`, `template <..> __global__ void name(`.
GLOBAL_FUNCTION = re.compile(r"__global__\s+(?:[\w:]+\s+)*?(\w+)\s*\(")
LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
NAMESPACE = re.compile(r"\bnamespace\s+(\w+)\s*\{")
# Namespaces of torch's and NVIDIA's libraries: never the kernel's, whatever its source declares.
LIBRARY_NAMESPACES = {"at", "c10", "torch", "std", "cub", "thrust", "cutlass", "cute", "cublas", "cudnn", "flash"}
DEVICE_SOURCES, LIBRARY = (".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp"), ".so"
PACKAGE_FILES = 5000  # files of the kernel's package looked at, at most


def kernel_identity(plan: Plan, cell: Cell, kernel) -> dict:
    """What names the kernel under test's code in a sanitizer's report (kernel_errors reads it). Its Triton
    kernels and CUDA `__global__` functions by name, and the files holding them, from its module and the modules of
    its package loaded with it; the namespaces their sources open; the CUDA sources and shared libraries of its
    package folder (less any library name torch ships too); for a library's torch.ops kernel, the library's
    namespace (vLLM's compiled kernels are `vllm::...`). An implementation in torch's own code (native, compiled)
    owns nothing: torch's kernels are the reference's too."""
    identity: dict[str, set] = {"names": set(), "namespaces": set(), "files": set(), "libraries": set()}
    entry = plan.implementation(cell.provider) if cell.provider else None
    if entry is not None and entry.name is not None:  # a torch.ops kernel: the namespaces its library's code opens
        namespace, sep, _ = entry.name.partition("::")  # no namespace: vLLM's torch.ops._C, C++ namespace vllm
        identity["namespaces"].update({namespace if sep else "vllm", (entry.library or "").split(".")[0]} - {""})
    elif entry is None or entry.path is not None:
        fn = inspect.unwrap(getattr(kernel, "fn", kernel))  # a prepared implementation's call
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if module is not None:
            _identify(module, identity)
    identity["namespaces"] -= LIBRARY_NAMESPACES
    identity["names"].discard("")
    return {key: sorted(values) for key, values in identity.items()}


def _identify(module: ModuleType, identity: dict[str, set]) -> None:
    top = module.__name__.split(".")[0]
    folders = list(getattr(sys.modules.get(top), "__path__", None) or []) if "." in module.__name__ else []
    modules = [m for name, m in list(sys.modules.items()) if folders and isinstance(m, ModuleType)
               and (name == top or name.startswith(top + "."))]
    for m in modules or [module]:
        for obj in list(vars(m).values()):
            if is_triton_kernel(obj):
                while not hasattr(obj, "src") and hasattr(obj, "fn"):  # an autotuner or heuristics around it
                    obj = obj.fn
                identity["names"].add(getattr(obj, "__name__", ""))
                code = getattr(obj, "__code__", None) or getattr(getattr(obj, "fn", None), "__code__", None)
                identity["files"] |= {Path(code.co_filename).name} if code else set()
            elif isinstance(obj, ModuleType) and str(getattr(obj, "__file__", "")).endswith(LIBRARY):
                identity["libraries"].add(Path(obj.__file__).name)  # an extension built for it (load_inline's)
        try:
            source = LAUNCH_BOUNDS.sub("", inspect.getsource(m))
        except (OSError, TypeError):  # a compiled module, or one without a file
            continue
        identity["names"] |= set(GLOBAL_FUNCTION.findall(source))
        identity["namespaces"] |= set(NAMESPACE.findall(source)) if "__global__" in source else set()
    seen = 0
    for folder in folders:
        for _, dirs, names in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "node_modules"]
            identity["files"] |= {n for n in names if n.endswith(DEVICE_SOURCES)}
            identity["libraries"] |= {n for n in names if n.endswith(LIBRARY)}
            seen += len(names)
            if seen > PACKAGE_FILES:
                break
    torch_module = sys.modules.get("torch")
    if torch_module is not None and getattr(torch_module, "__file__", None):  # _C.*.so names are common
        here = Path(torch_module.__file__).parent
        identity["libraries"] -= {p.name for d in (here, here / "lib") if d.is_dir() for p in d.iterdir()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

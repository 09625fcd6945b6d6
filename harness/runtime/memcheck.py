"""Memory safety on GPUs: a cell's examples called under compute-sanitizer memcheck.

A kernel whose loads are unmasked but whose stores are masked returns the right values: only a memory
checker sees it read past a row or a tensor. A `memcheck` cell runs a bounded number of drawn examples,
eagerly, in a fresh process under `compute-sanitizer --tool memcheck`, with PyTorch's caching allocator
off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that every tensor is an allocation of its own size: a read or
write past its end lands outside it, where memcheck reports it (with the allocator on it lands inside a
cached block and nothing is seen). The first error is reported with the kernel, the access and the
example that was running.

`python -m harness.runtime.memcheck TASK` is the process under the sanitizer, TASK a file holding the cell's
`CellTask` (the parsed plan, the cell, EXAMPLES examples) pickled; `run_memcheck` writes it and starts the process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.runtime.device import detect
from harness.runtime.inputs import Example
from harness.plan.matrix import Cell
from harness.plan.model import Plan
from harness.results.store import CellRecord, InputsSeen, Status, from_json, to_json
from harness.runtime.runner import CellCheck, Outcome, not_run, run_examples
from harness.runtime.tasks import CellTask, RunSettings, read_task, write_task
from harness.runtime.resolve import KernelUnavailable

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"memcheck": 1}

EXAMPLES = 3  # drawn examples per memcheck cell: each costs the sanitizer's start and its slowed launches
RUN = RunSettings(EXAMPLES, "ci", None)  # derandomized, no example database: the sanitizer's process writes nothing
MARK = "harness-memcheck-example: "


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
        outcome = run_examples(plan, cell, check, task.run)
    print("harness-memcheck-record: " + json.dumps(to_json(outcome.record)), flush=True)
    return 0


def run_memcheck(plan: Plan, cell: Cell, timeout_s: float) -> Outcome:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

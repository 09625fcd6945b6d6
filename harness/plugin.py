"""The pytest plugin: `pytest --plan plan.yaml` turns a plan into one test item per matrix cell.

Data flows one way: plan -> cells (items) -> results file -> report. Items are ordinary pytest
items with readable ids, so -k, -m, --lf, --junitxml and xdist behave as usual.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from .plan import AXES, PlanError, load_plan

_STATE_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("plan", "plan-driven kernel test matrix")
    group.addoption("--plan", action="store", default=None, metavar="PLAN",
                    help="plan file to expand into matrix cells (e.g. plan.yaml)")
    group.addoption("--examples", action="store", type=int, default=None, metavar="N",
                    help="hypothesis examples per cell (default: the plan's numerics.examples, x5 for nightly)")
    group.addoption("--plan-profile", action="store", default=None, choices=("dev", "ci", "nightly"),
                    help="numerics profile: dev (random, example database), ci (derandomized, no database), "
                         "nightly (5x examples). Default: ci when CI is set, else dev")
    group.addoption("--reports-dir", action="store", default=None, metavar="DIR",
                    help="where reports/<op>/ lives (default: reports/ beside the plan's rootdir)")
    group.addoption("--isolation", action="store", default="process", choices=("process", "none"),
                    help="process: run cells in a worker process replaced after crashes and hangs (default); "
                         "none: run in the pytest process (for debuggers)")
    group.addoption("--max-cpu-ranks", action="store", type=int, default=4, metavar="N",
                    help="largest tensor-parallel size run on a machine without GPUs (gloo ranks; default 4)")
    group.addoption("--bench", action="store_true", default=False,
                    help="also collect benchmark items (kernel vs reference eager / compiled / vLLM)")
    group.addoption("--no-report", action="store_true", default=False,
                    help="do not regenerate reports/<op>/PLAN.md at the end of the run")


def pytest_configure(config):
    from .hardware import use_triton_interpreter

    use_triton_interpreter()  # before anything imports triton: kernels then run on CPUs without CUDA
    plan_arg = config.getoption("--plan", None)
    for axis in AXES:
        config.addinivalue_line("markers", f"{axis}: matrix axis marker (values become markers too)")
    if not plan_arg:
        return
    plan_path = Path(plan_arg).resolve()
    try:
        plan = load_plan(plan_path)
    except PlanError as exc:
        raise pytest.UsageError(f"invalid plan: {exc}") from None
    for values in plan.matrix.values():
        for v in values:
            name = f"tp{v}" if isinstance(v, int) else v
            config.addinivalue_line("markers", f"{name}: cells with this matrix value")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(plan_path)]  # `pytest --plan X` alone collects the plan, not the test suite
    profile = config.getoption("--plan-profile") or ("ci" if os.environ.get("CI") else "dev")
    examples = config.getoption("--examples") or plan.numerics.examples * (5 if profile == "nightly" else 1)
    reports = Path(config.getoption("--reports-dir") or config.rootpath / "reports")
    config.stash[_STATE_KEY] = {"plan": plan, "plan_path": plan_path, "profile": profile, "examples": examples,
                                "op_dir": reports / plan.name, "recorder": None, "worker": None}
    if config.getoption("--bench"):
        from .bench import PytestBenchmarkMachineInfo

        config.pluginmanager.register(PytestBenchmarkMachineInfo(), "harness-bench-machine-info")
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")  # pytest then finishes the session: results kept, report written


def _state(config) -> dict | None:
    return config.stash.get(_STATE_KEY, None)


def record(config, section: str, key: str, rec: dict) -> None:
    """Store one result ('cells' or 'benchmarks') in this run's results file."""
    rec = {**rec, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _state(config)["recorder"].record(section, key, rec)


def pytest_collect_file(file_path: Path, parent):
    state = _state(parent.config)
    if state and file_path.resolve() == state["plan_path"]:
        return PlanFile.from_parent(parent, path=file_path)
    return None


class PlanFile(pytest.File):
    def collect(self):
        from .hardware import detect
        from .matrix import decide, expand

        state = _state(self.config)
        plan, hw = state["plan"], detect()
        for cell in expand(plan):
            decision = decide(plan, cell, hw, self.config.getoption("--max-cpu-ranks"))
            item = CellItem.from_parent(self, name=f"numerics[{cell.id}]", cell=cell, decision=decision)
            for axis, value in cell.axes().items():
                item.add_marker(f"tp{value}" if axis == "tp" else value)
            if decision.kind == "xfail":
                item.add_marker(pytest.mark.xfail(reason=decision.reason, strict=True))
            yield item
        from .vllm_support import collect_vllm_items

        yield from collect_vllm_items(self, plan, hw)  # vLLM's own layer reaching the kernel (not run without vllm)
        if self.config.getoption("--bench"):
            from .bench import collect_bench_items

            yield from collect_bench_items(self, plan, hw)


class CellFailed(Exception):
    """A cell's failure, shown as its message (no traceback: the message says what to do)."""


class CellItem(pytest.Item):
    def __init__(self, *, cell, decision, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.decision, self.outcome = cell, decision, None

    def setup(self):
        if self.decision.kind in ("excluded", "not_run"):
            pytest.skip(self.decision.reason)

    def runtest(self):
        state = _state(self.config)
        plan = state["plan"]
        from .runner import RunSettings, run_cell
        from .workers import Worker

        run = RunSettings(examples=state["examples"], profile=state["profile"],
                          database=str(self.config.rootpath / ".hypothesis" / "examples"))
        if self.config.getoption("--isolation") == "none" and self.cell.tp == 1:  # TP cells always need a group
            self.outcome = run_cell(str(state["plan_path"]), self.cell.id, run)
        else:
            if state["worker"] is None:
                state["worker"] = Worker()
            self.outcome = state["worker"].run(state["plan_path"], self.cell.id, run, plan.numerics.timeout_s)
        if self.outcome["status"] != "passed":
            raise CellFailed(self.failure_text())

    def failure_text(self) -> str:
        o = self.outcome
        lines = [f"cell {self.cell.id} failed: {o['reason']}"]
        if o.get("minimal_example"):
            lines.append(f"minimal example: {o['minimal_example']}")
        lines.append(f"reproduce: {self.repro_command()}")
        if o.get("traceback"):
            lines.append(o["traceback"])
        return "\n".join(lines)

    def repro_command(self) -> str:
        state = _state(self.config)
        try:
            plan = os.path.relpath(state["plan_path"], self.config.invocation_params.dir)
        except ValueError:
            plan = str(state["plan_path"])
        return f"pytest --plan {plan} --plan-profile {state['profile']} -k '{self.cell.id}'"

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CellFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::{self.name}"


# ---------------------------------------------------------------- results and report


def _xdist_worker(config) -> str | None:
    """This process's xdist worker id (not the environment variable: a pytest started from a worker inherits it)."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


def pytest_sessionstart(session):
    state = _state(session.config)
    if not state:
        return
    from .hardware import provenance
    from .results import Recorder

    prov = provenance(session.config.rootpath)
    run_id = f"{prov['date']}-{socket.gethostname()}-{os.getpid()}"
    state["recorder"] = Recorder(state["op_dir"] / "results", state["plan"].name, prov, run_id,
                                 worker=_xdist_worker(session.config))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not isinstance(item, CellItem):
        return
    if report.when == "setup" and report.skipped:
        status = item.decision.kind  # excluded / not_run
        rec = {"status": status, "reason": item.decision.reason}
    elif report.when == "call":
        o = item.outcome or {"status": "failed", "reason": str(call.excinfo.value) if call.excinfo else ""}
        status = o["status"]
        if item.decision.kind == "xfail":
            status = "xfail" if o["status"] == "failed" else "xpass"
        rec = {k: v for k, v in o.items() if k not in ("fatal", "traceback")}
        rec["status"] = status
        if status in ("failed", "xfail"):
            rec["repro"] = item.repro_command()
        if item.decision.kind == "xfail":
            rec["expectation"] = item.decision.reason
    else:
        return
    rec.update(item.cell.axes())
    record(item.config, "cells", item.cell.id, rec)


def pytest_sessionfinish(session, exitstatus):
    state = _state(session.config)
    if not state or state["recorder"] is None:
        return
    if state["worker"] is not None:
        state["worker"].stop()
    if _xdist_worker(session.config):
        return  # the controller folds worker files and writes the report
    state["recorder"].fold_worker_files()
    if session.config.getoption("--no-report"):
        return
    from .report import write_report

    path, problems = write_report(state["plan"], state["op_dir"])
    state["report_path"], state["report_problems"] = path, problems


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = _state(config)
    if not state or "report_path" not in state:
        return
    tr = terminalreporter
    for problem in state["report_problems"]:
        tr.write_line(f"results problem: {problem}", yellow=True)
    tr.write_line(f"living plan written: {state['report_path']}")

"""The run of one plan under pytest: its hooks, from the plan's loading to the report and the terminal summary.

Registered by harness.plugin only when `--plan` is given. Data flows one way: plan -> cells (items, harness.plugin.
items) -> results file -> report. Every item that runs a kernel runs it in an isolated worker
(harness.runtime.workers), so a kernel that crashes, hangs or poisons the device fails its own item only.
"""

from __future__ import annotations

import os
import signal
import socket
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings

from harness.decisions.verdicts import sm_verdicts, verdict
from harness.plugin.items import MARKERS as VLLM_RUN_MARKERS
from harness.plugin.items import BenchItem, CellItem, PlanFile, PlanItem
from harness.plugin.progress import Progress, ProgressReporter
from harness.plugin.replay import failure_path, read_failure, saved_cells, saved_example
from harness.plugin.state import SESSION_KEY, Session, session_of, start_memchecks, xdist_worker
from harness.plugin.summary import SAMPLED_OUT, cells_summary, provider_summary
from harness.rendering.plots import draw_plots
from harness.rendering.report import write_report
from harness.results.merge import collect
from harness.results.stamps import section_of, stamp
from harness.results.store import Recorder, Status, load, other_plans
from harness.runtime.bench.measure import prepare_benchmarks
from harness.runtime.bench.models import check_models
from harness.runtime.check_code import plan_code_warnings
from harness.interpreter import make_faithful, switch_on
from harness.runtime.device import detect, left_for_memory, provenance
from harness.runtime.inputs import with_sequences
from harness.runtime.runner import NIGHTLY_FACTOR
from harness.runtime.vllm_compiled import LIBRARY_ENV
from harness.plan.load import load_plan
from harness.cells.matrix import Cell, every_cell, pairwise_sample
from harness.plan.model import PlanError


def pytest_configure(config):
    switch_on()  # before the plan's kernels import triton: on CPUs they run in its interpreter
    if config.getoption("--isolation") == "none":
        make_faithful()  # cells run in this process: computing what a GPU computes here too (workers do it anyway)
    library = config.getoption("--vllm-ops-library")
    if library:
        os.environ[LIBRARY_ENV] = str(Path(library).resolve())  # workers inherit it
    plan_path = Path(config.getoption("--plan")).resolve()
    try:
        plan = load_plan(plan_path)
        plan_warnings = [*plan.warnings, *plan_code_warnings(plan)]  # a bad import path: a usage error, at its line
        cells = config.getoption("--cells")
        # Benchmark items: with --bench, and where --cells stale may find stale timings (a GPU times them)
        bench = config.getoption("--bench") or (cells == "stale" and detect().device == "cuda")
        if bench:
            check_models(plan)
    except PlanError as exc:
        raise pytest.UsageError(f"invalid plan: {exc}") from None
    reports = Path(config.getoption("--reports-dir") or config.rootpath / "reports")
    others = other_plans(reports / plan.op.name / "results", plan.op.name, plan_key(config.rootpath, plan_path))
    if others:
        raise pytest.UsageError(
            f"invalid plan: {plan_path}:{plan.where('op.name')}: op.name: {plan.op.name!r} is already the op of "
            f"{', '.join(others)}, whose results and page are in {reports / plan.op.name}: give this plan an op.name "
            f"of "
            "its own (or its own --reports-dir)")
    for values in plan.matrix.values():
        for v in values:
            config.addinivalue_line("markers", f"{f'tp{v}' if isinstance(v, int) else v}: cells with this matrix value")
    config.addinivalue_line("markers", "bench: benchmark items (collected with --bench)")
    for line in VLLM_RUN_MARKERS:
        config.addinivalue_line("markers", line)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(plan_path)]  # `pytest --plan X` alone collects the plan, not the test suite
    profile = config.getoption("--plan-profile") or _hypothesis_profile() or ("ci" if os.environ.get("CI") else "dev")
    examples = config.getoption("--examples") or \
        plan.numerics.examples * (NIGHTLY_FACTOR if profile == "nightly" else 1)
    cells = cells or ("all" if profile == "nightly" else "sampled")
    config.stash[SESSION_KEY] = Session(plan, plan_path, profile, examples, reports / plan.op.name,
                                     config.getoption("--isolation"), config.getoption("--max-cpu-ranks"),
                                     # the example database beside the results, not in the plan's folder
                                     str(reports / ".hypothesis" / "examples"), cells=cells,
                                     plan_warnings=plan_warnings, bench=bench,
                                     reports_option=config.getoption("--reports-dir") or "")
    if config.getoption("--replay"):
        _start_replay(session_of(config), config.getoption("--replay"))
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    xdist_controller = bool(getattr(config.option, "numprocesses", None)) and not xdist_worker(config)
    if bench and not config.option.collectonly and not xdist_controller:
        # The benchmark process imports torch, makes its CUDA context and loads vLLM's library (seconds) while
        # this one starts the session and collects.
        session_of(config).worker("kernels").start(prepare=(prepare_benchmarks, plan))


def _start_replay(s: Session, cell_id: str) -> None:
    """--replay CELL: the failure a run saved for the cell, its example as this machine's cells draw it."""
    try:
        cell = Cell.from_id(cell_id)
    except Exception:
        cell = None
    if cell is None or cell not in every_cell(s.plan):
        raise pytest.UsageError(f"--replay {cell_id}: the plan {s.plan_path} has no cell {cell_id!r}")
    data = read_failure(s.op_dir, cell_id)
    if data is None:
        saved = saved_cells(s.op_dir)
        raise pytest.UsageError(
            f"--replay {cell_id}: no failure of this cell is saved in {failure_path(s.op_dir, cell_id).parent}"
            + (f" (saved: {', '.join(saved)})" if saved else " (a run saves the failing example of each cell that "
               "fails)"))
    try:
        example = saved_example(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise pytest.UsageError(f"--replay {cell_id}: {failure_path(s.op_dir, cell_id)} holds no example a replay "
                                f"can use ({type(exc).__name__}: {exc})") from None
    s.replay, s.replay_data = cell_id, data
    s.replay_example = with_sequences(s.plan, cell, example, detect().device)


def _hypothesis_profile() -> str | None:
    """The harness profile chosen with hypothesis's own --hypothesis-profile harness-<name>, if any."""
    current = getattr(settings, "get_current_profile_name", None)  # hypothesis >= 6.1xx; older ones: no choice
    name = current() if current else ""
    return name.removeprefix("harness-") if name.startswith("harness-") else None


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")  # pytest then finishes the session: results kept, report written


def pytest_collect_file(file_path: Path, parent):
    if file_path.resolve() == session_of(parent.config).plan_path:
        return PlanFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    """The GPU and the software stack in pytest-benchmark's machine_info, so saved runs from different GPUs are
    told apart (pytest-benchmark warns when a comparison's machine_info differs)."""
    prov = provenance(config.rootpath)
    machine_info["harness"] = {k: getattr(prov, k) for k in ("sm", "gpu", "device_count", "torch", "triton", "cuda",
                                                             "vllm", "triton_interpreter")}


# ---------------------------------------------------------------- results and report


def plan_key(root: Path, plan_path: Path) -> str:
    """The plan as its runs name it: its path relative to the run's root, else as it is."""
    try:
        return plan_path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(plan_path)


def item_key(item) -> tuple[str, str]:
    """An item's section and key in the results file."""
    if isinstance(item, CellItem):
        return "cells", item.cell.id
    return ("benchmarks", item.spec.id) if isinstance(item, BenchItem) else ("integration", item.name)


def runs_here(item) -> bool:
    """Whether this machine runs the item at all (cells and vLLM route items decide before they run; a benchmark
    item times only on a GPU; fusion and engine items say at set-up, and record it)."""
    if isinstance(item, BenchItem):
        return not item.skip and detect().device == "cuda"
    decision = getattr(item, "decision", None)
    return decision is None or decision.runs


def pytest_sessionstart(session):
    s = session_of(session.config)
    prov = provenance(session.config.rootpath, plan_key(session.config.rootpath, s.plan_path))
    run_id = f"{prov.date}-{socket.gethostname()}-{os.getpid()}"
    s.recorder = Recorder(s.op_dir / "results", s.plan.op.name, prov, run_id, worker=xdist_worker(session.config),
                          stamp=lambda key, rec: stamp(s.plan, rec, Cell.from_id(key).provider
                                                       if section_of(rec) == "cells" else ""))
    if not xdist_worker(session.config):  # the process with the terminal (xdist's controller hears every report)
        s.progress = Progress()
        session.config.pluginmanager.register(ProgressReporter(session.config, s.progress), "harness-progress")


@pytest.hookimpl(tryfirst=True)  # before the terminal reports the collection and xdist's worker sends it
def pytest_collection_finish(session):
    """Sample the cells this machine can run (--cells sampled), when the run selects every cell of the plan: a -k,
    -m, --lf or node-id selection that leaves cells out runs every selected cell. Called once collection, and every
    deselection, is done; under xdist in each worker, which all pick the same sample. Then deselect the cells that
    do not run (leave_out)."""
    s = session_of(session.config)
    cells = [i for i in session.items if isinstance(i, CellItem)]
    if not cells:
        return
    runnable = [i for i in cells if i.decision.runs]
    if not runnable:
        ran = "no cell: none can run here"
    elif s.cells == "all":
        ran = f"every runnable cell ({len(runnable)})"
    elif s.cells == "retry":  # pytest_collection_modifyitems kept those alone
        ran = f"the {len(runnable)} runnable cells a run here left not run for memory other processes held"
    elif s.cells == "stale":  # pytest_collection_modifyitems kept those alone
        ran = f"the {len(runnable)} runnable cells whose records were missing or stale"
    elif len(cells) < len(every_cell(s.plan)):
        ran = f"the {len(runnable)} runnable cells selected (-k, -m, --lf or node ids; no sampling)"
    else:  # the kernel's cells and each provider's sampled apart: each covers its own pairs
        chosen = {c for provider in ("", *s.plan.providers)
                  for c in pairwise_sample([i.cell for i in runnable if i.cell.provider == provider], s.plan.op.name)}
        sample = f"pairwise sample of {len(chosen)} of {len(runnable)} runnable cells"
        ran = f"a {sample}"
        for item in runnable:
            if item.cell not in chosen:
                item.sampled_out = f"sampled out: {sample}; --cells all runs it"
    s.recorder.describe_run(cells=ran)
    leave_out(session, s, [i for i in cells if not i.decision.runs or i.sampled_out])
    if s.progress is not None:
        s.progress.expect(i.cell for i in session.items if isinstance(i, CellItem))
    # Under xdist a worker runs only some items: there each memcheck item runs its own.
    if not xdist_worker(session.config) and not session.config.option.collectonly:
        start_memchecks(s, [i for i in runnable if not i.sampled_out])


def leave_out(session, s: Session, left: list[CellItem]) -> None:
    """Deselect the cells this machine does not run (another SM, too many ranks, no CUDA, excluded by the plan,
    sampled out), as -k deselects: the run's end line counts them once and its summary says why, where each was a
    skip before (a CPU laptop's default run ended "9 passed, 1459 skipped"). A cell not run here or excluded is
    recorded now, with the status and reason its skip recorded, so the results file and the page still know it
    (under xdist by the first worker alone: every worker collects alike); a sampled-out one is not recorded, so an
    earlier run's result for it stays."""
    if not left:
        return
    s.left_out = [(i.cell, SAMPLED_OUT, i.sampled_out) if i.sampled_out else
                  (i.cell, i.decision.status.value, i.decision.reason) for i in left]
    if not session.config.option.collectonly and xdist_worker(session.config) in (None, "gw0"):
        for item in left:
            if not item.sampled_out:  # written with the next record, or at the end
                s.record("cells", item.cell.id, item.result(skipped=True), defer=True)
    gone = set(map(id, left))
    session.items[:] = [i for i in session.items if id(i) not in gone]
    session.config.hook.pytest_deselected(items=left)


def pytest_collection_modifyitems(session, config, items):
    """--cells retry: only the cells and vLLM items whose record in this machine's results file says not run for GPU
    memory other processes held (plans side by side). --cells stale: only the items this machine runs whose record
    is missing on its SM or could now come out differently (Merged.needs_run). The rest are deselected, their
    records kept as they are."""
    s = session_of(config)
    if s.replay:  # the cell replayed alone
        keep = [i for i in items if isinstance(i, CellItem) and i.cell.id == s.replay]
        for item in keep:
            if not item.decision.runs:
                raise pytest.UsageError(f"--replay {s.replay}: this machine cannot run the cell: "
                                        f"{item.decision.reason}")
    elif s.cells == "retry":
        path = s.recorder.machine_file
        records = load(path, s.plan.op.name) if path.exists() else None
        left = {key for section in ("cells", "integration") if records
                for key, rec in records.section(section).items()
                if rec.status == Status.NOT_RUN and left_for_memory(rec.reason)}
        keep = [i for i in items if item_key(i)[1] in left]
    elif s.cells == "stale":
        res = collect(s.plan, s.op_dir)
        keep = [i for i in items if runs_here(i) and res.needs_run(*item_key(i), left_for_memory)]
    else:
        return
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if isinstance(item, CellItem) and (report.when == "call" or report.when == "setup" and report.skipped):
        # The cell's status on its report (xdist sends it to the controller) for the terminal summary.
        report.plan_cell = item.cell.id
        if item.sampled_out:  # not recorded: what an earlier run recorded for the cell stays
            report.plan_status, report.plan_reason = SAMPLED_OUT, item.sampled_out
            return
        skipped = report.when == "setup"
        if skipped and item.decision.runs:  # a skip marker (--benchmark-only, a conftest's): not
            return  # run this time, and not recorded, so what an earlier run recorded for the cell stays
        rec = item.result(skipped=skipped)
        # A cell skipped before it ran (not run here, excluded) is written with the next cell that runs, or at the end.
        session_of(item.config).record("cells", item.cell.id, rec, defer=skipped)
        report.plan_status, report.plan_reason = rec.status.value, rec.reason
    elif isinstance(item, PlanItem) and not isinstance(item, (CellItem, BenchItem)) and report.skipped \
            and isinstance(report.longrepr, tuple):
        # Why a vLLM item did not run here (vLLM not installed), for the summary's line per reason.
        report.plan_item_skip = report.longrepr[2].removeprefix("Skipped: ")


def pytest_report_teststatus(report, config):
    """A cell that found it cannot run here (vLLM's kernel not installed, no compute-sanitizer) prints no `s` of
    its own: the terminal summary counts them by reason. -v still lists each; -rs too."""
    if report.skipped and getattr(report, "plan_status", None) in (SAMPLED_OUT, Status.NOT_RUN, Status.EXCLUDED):
        return "skipped", "", "SKIPPED"
    return None


@pytest.hookimpl(optionalhook=True)  # xdist's hook, on its controller: a worker went down with its workeroutput
def pytest_testnodedown(node, error):
    s = session_of(node.config)
    left = getattr(node, "workeroutput", {}).get(LEFT_OUT)
    if left and not s.left_out:
        s.left_out = [(Cell.from_id(cell), status, reason) for cell, status, reason in left]


LEFT_OUT = "harness_left_out"  # the cells a worker deselected, in its workeroutput for xdist's controller


def pytest_sessionfinish(session, exitstatus):
    s = session_of(session.config)
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and s.left_out:
        # Every selected cell was decided here, and recorded so (not run here, excluded): a run that did its work,
        # as when those cells were skips, not pytest's "no tests collected".
        session.exitstatus = pytest.ExitCode.OK
    if s.recorder is None:
        return
    s.recorder.flush()
    if s.gpu_turn is not None:  # every record is written: the next plan's run may time
        s.gpu_turn.close()
    # The workers wind down while the report is written: a benchmark worker took 1.3 s to exit on an H200 machine.
    for worker in s.workers.values():
        worker.ask_to_stop()
    try:
        if xdist_worker(session.config):
            if xdist_worker(session.config) == "gw0":  # every worker deselected alike: one tells the controller
                session.config.workeroutput[LEFT_OUT] = [(c.id, status, why) for c, status, why in s.left_out]
            return  # the controller folds worker files and writes the report
        s.recorder.fold_worker_files()
        if session.config.getoption("--no-report") or session.config.option.collectonly or s.replay:
            return  # listing the cells (--collect-only) or replaying one leaves the page as it was
        draw_plots(s.plan, s.op_dir)
        s.report_path, s.report_problems = write_report(s.plan, s.op_dir)
        res = collect(s.plan, s.op_dir)
        s.verdicts = sm_verdicts(res)
        s.verdict = verdict(res, per_sm=s.verdicts).word
        s.stale = res.stale_summary()
    finally:
        s.stop_workers()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    s = session_of(config)
    reports = [r for rs in terminalreporter.stats.values() for r in rs if getattr(r, "plan_status", None)]
    tried = [(Cell.from_id(r.plan_cell), r.plan_status, r.plan_reason) for r in reports]
    # Not for a listing (--collect-only): its cells to run, none run yet, would be missing from the table.
    cells = tried + s.left_out if not config.option.collectonly else []
    if cells:
        terminalreporter.ensure_newline()
        terminalreporter.section(f"{s.plan.op.name}: numerics cells", sep="-")
        for line in cells_summary(s.plan, [c for c in cells if not c[0].provider]):
            terminalreporter.write_line(line)
        for provider in s.plan.providers:  # its failures are findings about it, not the kernel's (the page's)
            mine = [c for c in cells if c[0].provider == provider]
            nothing_ran = provider_summary(s.plan, provider, [c for c in tried if c[0].provider == provider], mine)
            if nothing_ran:  # one line, not a table of nothing
                terminalreporter.write_line(nothing_ran)
            elif mine:
                terminalreporter.section(f"{s.plan.op.name}: {provider} through the same cells", sep="-")
                for line in cells_summary(s.plan, mine):
                    terminalreporter.write_line(line)
    skipped = Counter(r.plan_item_skip for r in terminalreporter.stats.get("skipped", ())
                      if getattr(r, "plan_item_skip", None))
    for reason, n in skipped.most_common():
        terminalreporter.write_line(f"{n} vLLM item{'s' if n > 1 else ''} not run here: {reason}")
    if s.precompiled.startswith("precompile"):
        terminalreporter.write_line(f"benchmarks: {s.precompiled}")
    for warning in s.plan_warnings:
        terminalreporter.write_line(f"plan warning: {warning}", yellow=True)
    if s.replay_said:
        terminalreporter.write_line(s.replay_said)
    if s.report_path is None:
        return
    for problem in s.report_problems:
        terminalreporter.write_line(f"results problem: {problem}", yellow=True)
    if s.stale:
        terminalreporter.write_line(s.stale, yellow=True)
    if s.verdicts:
        terminalreporter.write_line(f"verdict: {s.verdict}")
        here = detect().sm
        for v in s.verdicts:
            if v.sm == here:
                terminalreporter.write_line(f"  {v.where} (this machine): {v.word}: {v.rule}")
    terminalreporter.write_line(f"living plan written: {s.report_path}")

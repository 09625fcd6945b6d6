"""The pytest plugin's entry point: `pytest --plan plan.yaml` turns a plan into one test item per matrix cell.

Inert without `--plan`: this module imports no torch and changes no environment variable, so an
unrelated test suite in the same environment runs as if the plugin were not installed. With a
plan, it registers harness.plugin.session, which holds the hooks of the run (its items are in
harness.plugin.items; it imports torch and the plan's kernels).
"""

from __future__ import annotations

from harness.plan.vocabulary import AXES, PROFILES

CELL_CHOICES = ("all", "sampled", "retry", "stale")


def pytest_addoption(parser):
    group = parser.getgroup("plan", "plan-driven kernel test matrix")
    group.addoption("--plan", action="store", default=None, metavar="PLAN",
                    help="plan file to expand into matrix cells (e.g. plan.yaml)")
    group.addoption("--examples", action="store", type=int, default=None, metavar="N",
                    help="hypothesis examples per cell (default: the plan's numerics.examples, x5 for nightly)")
    group.addoption("--plan-profile", action="store", default=None, choices=PROFILES,
                    help="numerics profile: dev (random, example database), ci (derandomized, no database), "
                         "nightly (5x examples); also selectable as --hypothesis-profile harness-<name>. "
                         "Default: ci when CI is set, else dev")
    group.addoption("--cells", action="store", default=None, choices=CELL_CHOICES,
                    help="numerics cells to run: all (every cell this machine can run), sampled (a pairwise sample "
                         "of them: every pair of axis values that can run here, in one cell at least) or retry (the "
                         "cells and vLLM items a run here left not run for GPU memory other processes held, e.g. "
                         "plans side by side: run again with the GPU to themselves; the rest deselected) or stale "
                         "(the cells, vLLM items and, on a GPU, benchmarks whose record on this machine's SM is "
                         "missing or could now come out differently; nothing on an unchanged tree). Default: "
                         "all for the nightly profile, sampled for dev and ci. A -k, -m or node-id selection that "
                         "leaves out cells runs every selected one")
    group.addoption("--reports-dir", action="store", default=None, metavar="DIR",
                    help="where reports/<op>/ lives (default: reports/ beside the plan's rootdir)")
    group.addoption("--isolation", action="store", default="process", choices=("process", "none"),
                    help="process: run kernels in a worker process replaced after crashes and hangs (default); "
                         "none: run tp1 numerics cells in the pytest process (for debuggers)")
    group.addoption("--max-cpu-ranks", action="store", type=int, default=4, metavar="N",
                    help="largest tensor-parallel size run on a machine without GPUs (gloo ranks; default 4)")
    group.addoption("--bench", action="store_true", default=False,
                    help="also collect benchmark items (kernel vs reference eager / compiled / vLLM)")
    group.addoption("--vllm-ops-library", action="store", default=None, metavar="PATH",
                    help="a compiled vLLM ops library (e.g. vllm/_C_stable_libtorch.abi3.so) providing torch.ops._C "
                         "without vLLM's Python package (also: HARNESS_VLLM_OPS_LIBRARY)")
    group.addoption("--replay", action="store", default=None, metavar="CELL",
                    help="check again, alone, the failing example a run saved for this cell (reports/<op>/failures/"
                         "<cell>.json, with its inputs where small); says whether it reproduced and records nothing")
    group.addoption("--no-report", action="store_true", default=False,
                    help="do not regenerate reports/<op>/PLAN.md at the end of the run")


def pytest_configure(config):
    for axis in AXES:
        config.addinivalue_line("markers", f"{axis}: matrix axis marker (values become markers too)")
    if config.getoption("--plan", None):
        # The session's hooks (pytest_configure among them) run from here on: pytest calls a plugin's
        # pytest_configure when it is registered during configuration.
        config.pluginmanager.import_plugin("harness.plugin.session")

"""Plans for the harness's own tests, written from Python values by one builder (write_plan), and the small RMSNorm
plans many tests share: rms_norm_plan (CPU cells that run) and small_plan (sm90 cells for pages on synthetic results).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from harness.plan.load import load_plan

# The plans here name the `cpu` SM: on a GPU machine their cells are not run (needs cpu; the machine is sm90), so a
# test asserting what such a run did, or what a CPU machine reports, is a CPU machine's test. A GPU machine's own
# answers are checked by tests/test_gpu_checks.py and by the nightly matrix on the bundled plans.
cpu_machine_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="runs `sm: [cpu]` cells, which a GPU machine does not run")


def hide_vllm(monkeypatch) -> None:
    """As if vLLM were not installed: `import vllm` fails, and no vLLM ops library is named on its own."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delenv("HARNESS_VLLM_OPS_LIBRARY", raising=False)


# Batches of at most 256 tokens, prefills of 16 to 64: for tests whose prefill cells check the harness, not the
# kernel's numbers (the default 8192 drew thousands of rows, seconds each in Triton's interpreter).
SMALL_BATCHES = {"max_num_batched_tokens": 256, "prefill_tokens": [16, 64]}


def write_plan(path: Path, base: str | Path | dict | None = None, **sections) -> Path:
    """Write a plan file at `path` from its sections as Python values (op, matrix, numerics, benchmark, vllm, tp,
    exclude, ...), in the order given, and return the path.

    `base` is a plan to start from: a plan file's path (a bundled plan: read with yaml.safe_load) or its data. A
    section given as a mapping where the base has one updates the base's keys, one level deep (op={"kernel": ...}
    swaps the kernel and keeps the rest of op; a key given None is removed); any other value replaces the section,
    and None removes it. Without a base the sections are written as they are. Written with yaml.safe_dump much as a
    plan is by hand: a list or mapping of plain values on one line (`phase: [decode]`, `numerics: {examples: 20}`),
    any other a key or item a line, and no line folded, so a test finds the line of a key by its text."""
    data = {} if base is None else copy.deepcopy(base) if isinstance(base, dict) else read_plan(base)
    for key, value in sections.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = updated(data[key], value)
        else:
            data[key] = value
    path = Path(path)
    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=10_000))
    return path


def read_plan(path: str | Path) -> dict:
    """A plan file's data, as write_plan starts from it (comments and line numbers are not kept)."""
    return yaml.safe_load(Path(path).read_text())


def updated(mapping: dict, changes: dict) -> dict:
    """`mapping` with the keys of `changes` set, in place where it has them, after its own where not; a key
    changed to None is removed."""
    out = dict(mapping)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def rms_norm_args(functional: bool = False) -> dict:
    """The bundled RMSNorm's arguments: `out` written in place, or (functional) none, the output `y` returned."""
    args = {"out": {"shape": ["num_tokens", "hidden"], "dtype": "act", "role": "output"},
            "x": {"shape": ["num_tokens", "hidden"], "dtype": "act", "layout": ["contiguous", "strided"]},
            "weight": {"shape": ["hidden"], "dtype": "act", "init": "around_one"},
            "eps": 1.0e-6}
    if functional:
        del args["out"]
    return args


def rms_norm_plan(tmp_path: Path, kernel: str = "kernels.rms_norm:rms_norm", *, functional: bool = False,
                  hidden=(64, 128), numerics: dict | None = None, name: str = "plan.yaml", **sections) -> Path:
    """The bundled RMSNorm, small: hidden 64 and 128, one CPU cell (decode, fp32, tp1, eager); `kernel` and
    (functional) a kernel that returns `y` in place of writing `out`. `numerics` is the whole section (default: 20
    examples a cell). The other sections update it as write_plan's do: op={...} and matrix={"phase": [...]} change
    the keys given and keep the rest, and the sections it lacks (benchmark, vllm, tp, ...) are added."""
    op = {"name": "rms_norm", "intent": "drop-in", "kernel": kernel, "reference": "kernels.rms_norm:rms_norm_ref",
          "args": rms_norm_args(functional), "outputs": ["y" if functional else "out"],
          "sizes": {"hidden": list(hidden)}}
    matrix = {"phase": ["decode"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"], "sm": ["cpu"]}
    return write_plan(tmp_path / name, {"op": op, "matrix": matrix}, **{
        "numerics": {"examples": 20} if numerics is None else numerics, **sections})


# vLLM's RMSNorm layer reached through its IR op, rms_norm, as the bundled plan routes it
RMS_NORM_IR_ROUTE = {"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm", "ir_op": "rms_norm",
                     "in_tree_provider": "vllm_c"}
SMALL_BENCHMARK = {"decode": [64], "prefill": [2048]}
# vLLM's rms_norm kernel, as the bundled plan names it: an implementation beside the kernel
VLLM_RMS_NORM = {"name": "rms_norm", "args": ["out", "x", "weight", "eps"]}
SMALL_IMPLEMENTATIONS = {"native": {}, "compiled": {}, "vllm": VLLM_RMS_NORM}


def small_plan(tmp_path: Path, benchmark: dict = SMALL_BENCHMARK, name: str = "small.yaml",
               implementations: dict | None = SMALL_IMPLEMENTATIONS, **sections):
    """The loaded plan of rms_norm at hidden 4096 on two cells per SM (decode and prefill, bf16, tp1, eager), on
    sm90, routed into vLLM through its IR op, timed against native, compiled and vLLM's kernel: for tests of pages
    and decisions on synthetic results. `benchmark` and `implementations` are whole sections; the other sections
    update it as write_plan's do (matrix={"sm": ["cpu", "sm90"]} changes the SMs and keeps the other axes)."""
    args = rms_norm_args()
    del args["x"]["layout"]  # contiguous x only
    op = {"name": "rms_norm", "intent": "drop-in", "kernel": "kernels.rms_norm:rms_norm",
          "reference": "kernels.rms_norm:rms_norm_ref", "replaces": "vllm.model_executor.layers.layernorm:RMSNorm",
          "args": args, "outputs": ["out"], "sizes": {"hidden": [4096]}}
    matrix = {"phase": ["decode", "prefill"], "dtype": ["bf16"], "tp": [1], "graph_mode": ["eager"], "sm": ["sm90"]}
    return load_plan(write_plan(tmp_path / name, {"op": op, "matrix": matrix},
                                **{"benchmark": benchmark, "vllm": RMS_NORM_IR_ROUTE,
                                   "implementations": implementations, **sections}))


def read_results(path: Path) -> dict:
    """A results file as the JSON a run wrote (tests assert on the file, as a user or CI job reads it)."""
    return json.loads(Path(path).read_text())


def any_call(**values):
    """A kernel and reference for plans that only test how inputs are built: it takes any arguments."""
    return None


def ones_for_x(values, *, plan, cell, example, sizes, generator, device):
    """A plan's own input generator (op.generate): x becomes ones, drawn nothing else."""
    return {"x": values["x"].new_ones(values["x"].shape) * (1 + torch.rand((), generator=generator, device=device))}

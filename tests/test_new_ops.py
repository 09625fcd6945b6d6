"""Ops beyond light elementwise ones through one plan format: spec elements and their errors, structured inputs
and their invariants over many draws, quantized comparisons, and the broken kernels the harness must catch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from harness.runtime.batches import draw_batch
from harness.runtime.inputs import build_args, examples
from harness.cells.matrix import Cell
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from harness.results.store import Status
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from tests.plans import cpu_machine_only, read_plan, write_plan

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "kernels" / "plans"
CI = RunSettings(examples=6, profile="ci", database=None)


CPU_SLICE = {"phase": ["decode", "chunked_prefill"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"],
             "sm": ["cpu"]}


def narrowed(tmp_path: Path, plan: str, kernel: str | None = None, matrix: dict = CPU_SLICE, **sections) -> Path:
    """A bundled plan with another kernel and a CPU-only slice of its matrix, without its exclude rules, and with
    no implementation audited beside the kernel (the kernel's own cells only)."""
    implementations = {name: narrowed_entry(entry, matrix)
                       for name, entry in read_plan(PLANS / f"{plan}.yaml")["implementations"].items()}
    return write_plan(tmp_path / f"{plan}.yaml", PLANS / f"{plan}.yaml", op={"kernel": kernel} if kernel else {},
                      matrix=matrix, exclude=None, **{"implementations": implementations, **sections})


def narrowed_entry(entry: dict, matrix: dict) -> dict:
    """An implementation not audited, its contract's dtypes those of the narrowed matrix (a contract names dtypes
    of the matrix only)."""
    entry = {**entry, "role": [r for r in entry.get("role", ["baseline"]) if r != "audited"]}
    dtypes = (entry.get("contract") or {}).get("dtypes")
    if dtypes and "dtype" in matrix:
        entry["contract"] = {**entry["contract"], "dtypes": [d for d in dtypes if d in matrix["dtype"]] or None}
    return entry


# ---------------------------------------------------------------- spec elements and their errors


def _plan_with(tmp_path: Path, args: dict, sizes: dict | None = None, **sections) -> Path:
    """An op `probe` of the given arguments and sizes (default hidden 64) on one CPU cell; `sections` added."""
    return write_plan(
        tmp_path / "p.yaml",
        op={"name": "probe", "intent": "drop-in", "kernel": "tests.plans:any_call", "reference": "tests.plans:any_call",
            "args": args, "outputs": ["out"], "sizes": sizes or {"hidden": [64]}},
        matrix={"phase": ["decode"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"], "sm": ["cpu"]},
        **sections)


def _out(**changes) -> dict:
    """The probe's one argument, `out` [num_tokens, 4], with `changes` to it."""
    return {"out": {"shape": ["num_tokens", 4], "dtype": "act", "role": "output", **changes}}


def test_shapes_are_expressions_over_symbols_and_scalars_can_be_sizes(tmp_path):
    plan = load_plan(_plan_with(tmp_path, {
        "out": {"shape": ["num_tokens", "heads*head"], "dtype": "act", "role": "output"},
        "x": {"shape": ["num_tokens", "heads * head + 2"], "dtype": "act"},
        "lens": {"shape": ["num_seqs + 1"], "dtype": "int32", "init": "query_start_loc"},
        "zero_d": {"shape": [], "dtype": "float32"},
        "width": {"value": "heads*head"},
        "maybe": None}, sizes={"heads": {"values": [4], "awkward": False}, "head": {"values": [8], "awkward": False}}))
    assert [str(d) for d in plan.arg("x").shape] == ["num_tokens", "heads * head + 2"]
    assert plan.arg("zero_d").shape == ()
    assert "int width" in plan.schema() and "Tensor? maybe" in plan.schema()
    cell = Cell("decode", "fp32", 1, "eager", "cpu")
    ex = examples(plan, cell, "cpu").example()
    values = build_args(plan, cell, ex, "cpu")
    assert values["x"].shape[1] == 4 * 8 + 2 and values["width"] == 32 and values["maybe"] is None
    assert values["zero_d"].dim() == 0 and values["lens"].shape == (ex.num_tokens + 1,)  # decode: a sequence a token


@pytest.mark.parametrize("args, sizes, field, words", [
    (_out(shape=["num_tokens", "heads*nope"]), {"heads": [4]}, "op.args.out.shape[1]", "found 'nope'"),
    (_out(dtype="fp9"), {"heads": [4]}, "op.args.out.dtype", "float8_e4m3fn"),
    (_out(init={"integers": [0]}), {"heads": [4]}, "op.args.out.init.integers", "[low, high]"),
    (_out(init="sparkly"), {"heads": [4]}, "op.args.out.init", "positions"),
    (_out(), {"heads": {"values": [4], "divides": "kv"}}, "op.sizes.heads.divides", "another symbol"),
    (_out(), {"heads": {"values": [3], "even": True}}, "op.sizes.heads", "own constraints"),
])
def test_spec_errors_name_the_field(tmp_path, args, sizes, field, words):
    with pytest.raises(PlanError) as err:
        load_plan(_plan_with(tmp_path, args, sizes))
    assert err.value.field == field and words in str(err.value), str(err.value)


@pytest.mark.parametrize("sections, field, words", [
    ({"quantization": {"outputs": {"out": {"scale": "nowhere", "granularity": "per_tensor"}}}},
     "quantization.outputs.out.scale", "an argument or output"),
    ({"quantization": {"outputs": {"out": {"scale": "out", "granularity": "per_tensor"}}}},
     "quantization.outputs.out", "quantized dtype"),
    ({"tolerance": {"outputs": {"elsewhere": {"atol": 0, "rtol": 0}}}}, "tolerance.outputs.elsewhere",
     "one of the keys"),
    ({"numerics": {"cpu_sizes": {"nope": [1]}}}, "numerics.cpu_sizes.nope", "one of the keys"),
])
def test_quantization_tolerance_and_cpu_size_errors(tmp_path, sections, field, words):
    with pytest.raises(PlanError) as err:
        load_plan(_plan_with(tmp_path, _out(shape=["num_tokens", "hidden"]), **sections))
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_every_bundled_plan_validates():
    for path in sorted(PLANS.glob("*.yaml")):
        load_plan(path)


# ---------------------------------------------------------------- structured inputs


@settings(max_examples=60, deadline=None)
@given(phase=st.sampled_from(["decode", "prefill", "chunked_prefill"]), num_tokens=st.integers(2, 1200),
       decode=st.integers(1, 256), seed=st.integers(0, 2**31 - 1), max_len=st.integers(1, 5000),
       block=st.sampled_from([1, 8, 16, 32]))
def test_batches_keep_vllms_invariants(phase, num_tokens, decode, seed, max_len, block):
    decode = min(decode, num_tokens - 1) if phase == "chunked_prefill" else 0
    b = draw_batch(phase, num_tokens, decode, seed, max_len, block)
    assert sum(b.q_lens) == num_tokens and len(b.positions()) == num_tokens
    assert all(1 <= q <= c <= max(max_len, 1) for q, c in zip(b.q_lens, b.context_lens))
    if phase == "decode":
        assert b.q_lens == (1,) * num_tokens
    if phase == "prefill":
        assert b.context_lens == b.q_lens and min(b.positions()) == 0  # prompts start at position 0
    used = [i for t, c in zip(b.block_tables, b.context_lens) for i in t[:-(-c // block)]]
    assert len(used) == len(set(used)) and all(0 <= i < b.num_blocks for i in used)  # distinct, valid ids
    assert all(len(t) == b.max_blocks_per_seq and all(0 <= i < b.num_blocks for i in t) for t in b.block_tables)
    assert max(b.positions()) < max(max_len, 1)
    assert b.query_start_loc()[-1] == num_tokens
    slots = b.slot_mapping()
    assert len(set(slots)) == num_tokens and max(slots) < b.num_blocks * block


# Drawn through @given, not strategy.example() in a loop: example() is for interactive use and cost 9.7 s of CPU
# for these 90 draws on a 2-core machine.
@pytest.mark.parametrize("phase", ["decode", "chunked_prefill", "prefill"])
def test_paged_attention_inputs_are_consistent_over_many_draws(phase):
    plan = load_plan(PLANS / "paged_attention.yaml")
    cell = Cell(phase, "fp16", 1, "eager", "cpu")

    @settings(max_examples=30, database=None, deadline=None)
    @given(examples(plan, cell, "cpu"))
    def consistent(ex):
        v = build_args(plan, cell, ex, "cpu")
        seq_lens, qsl, tables = v["seq_lens"], v["query_start_loc"], v["block_tables"]
        block = v["key_cache"].shape[1]
        assert qsl[0] == 0 and int(qsl[-1]) == ex.num_tokens and bool((qsl[1:] >= qsl[:-1]).all())
        q_lens = qsl[1:] - qsl[:-1]
        assert bool((q_lens <= seq_lens).all()) and bool((seq_lens <= tables.shape[1] * block).all())
        assert int(tables.max()) < v["key_cache"].shape[0] and int(tables.min()) >= 0
        assert v["query"].shape[1] % v["key_cache"].shape[2] == 0  # GQA: query heads per KV head

    consistent()


@pytest.mark.parametrize("phase", ["decode", "prefill", "chunked_prefill"])
def test_rope_positions_stay_below_max_position_and_sizes_keep_their_constraints(phase):
    plan = load_plan(PLANS / "rotary_embedding.yaml")
    cell = Cell(phase, "bf16", 1, "eager", "cpu")

    @settings(max_examples=30, database=None, deadline=None)
    @given(examples(plan, cell, "cpu"))
    def within_limits(ex):
        v = build_args(plan, cell, ex, "cpu")
        assert int(v["positions"].max()) < v["cos_sin_cache"].shape[0]
        s = ex.sizes
        assert s["num_heads"] % s["num_kv_heads"] == 0 and s["rotary_dim"] <= s["head_size"]
        assert s["rotary_dim"] % 2 == 0

    within_limits()


# ---------------------------------------------------------------- the bundled kernels pass, broken ones fail


BROKEN = [
    ("rotary_embedding", "tests.broken.rotary_bugs:always_gptj", "output 'query'"),
    ("rotary_embedding", "tests.broken.rotary_bugs:key_unrotated", "output 'key'"),
    ("rms_norm_static_fp8_quant", "tests.broken.fp8_quant_bugs:scale_multiplied", "quantized elements"),
    ("dynamic_per_token_fp8_quant", "tests.broken.fp8_quant_bugs:scale_ub_ignored", "quantized elements"),
    ("paged_attention", "tests.broken.paged_attention_bugs:attends_whole_blocks", "output 'out'"),
    ("int8_linear_column", "tests.broken.int8_linear_bugs:scale_per_row", "output 'out'"),
]


@pytest.mark.parametrize("plan, kernel, words", BROKEN, ids=[k.split(":")[1] for _, k, _ in BROKEN])
def test_broken_kernel_is_caught(tmp_path, plan, kernel, words):
    path = narrowed(tmp_path, plan, kernel)
    rec = run_cell(CellTask.load(path, "decode-fp32-tp1-eager-cpu", CI)).record
    assert rec.status == Status.FAILED and words in rec.reason, rec.reason
    assert rec.minimal_example and rec.minimal_example.startswith("num_tokens=")


def test_an_in_place_mismatch_says_whether_the_argument_was_written_and_what_was_returned(tmp_path):
    path = narrowed(tmp_path, "rotary_embedding", "tests.broken.rotary_bugs:out_of_place")
    rec = run_cell(CellTask.load(path, "decode-fp32-tp1-eager-cpu", CI)).record
    assert rec.status == Status.FAILED, rec.reason
    assert "'query' was left unchanged by the call" in rec.reason, rec.reason
    assert "the tensor the kernel returned matches the reference: it computed out of place" in rec.reason
    path = narrowed(tmp_path, "rotary_embedding", "tests.broken.rotary_bugs:always_gptj")
    rec = run_cell(CellTask.load(path, "decode-fp32-tp1-eager-cpu", CI)).record
    assert "'query' was written, with other values" in rec.reason and "returned" not in rec.reason, rec.reason


def test_a_kernel_failing_every_input_is_shrunk_below_the_phase_sizes(tmp_path):
    """Hypothesis stops at the phase's fewest tokens (a prefill's 128 here); a kernel that fails every input is
    walked on to the smallest example that fails alike."""
    path = narrowed(tmp_path, "rotary_embedding", "tests.broken.rotary_bugs:key_unrotated",
                    matrix={**CPU_SLICE, "phase": ["prefill"]})
    rec = run_cell(CellTask.load(path, "prefill-fp32-tp1-eager-cpu", RunSettings(3, "ci", None))).record
    assert rec.status == Status.FAILED and "output 'key'" in rec.reason, rec.reason
    # position 0 rotates by nothing, so a key left unrotated fails only from the second token on
    assert 2 <= int(rec.minimal_example.split()[0].removeprefix("num_tokens=")) < 128, rec.minimal_example
    walked = rec.facts["shrunk on"]
    assert walked["from"].startswith("num_tokens=") and walked["to"] == rec.minimal_example, walked
    # the reason is the smaller example's: its mismatched elements are counted out of that example's key
    tokens = [int(e.split()[0].removeprefix("num_tokens=")) for e in (walked["from"], walked["to"])]
    total = int(re.search(r"Mismatched elements: \d+ / (\d+)", rec.reason).group(1))
    assert total % tokens[1] == 0 and total // tokens[1] * tokens[0] != total, rec.reason
    # the walk's checks are not the cell's examples: its bisection from 128 tokens to 2 alone takes 7 or more, while
    # hypothesis's 3 examples and its search for other failures after the first (multiple-bug reporting) took 6
    assert 3 <= rec.examples < 10, rec.examples


def test_relative_error_near_zero_is_taken_against_the_output_scale():
    from harness.runtime.numerics import errors

    expected = torch.tensor([1e-30, 2.0, -4.0], dtype=torch.float64)
    actual = expected + torch.tensor([1e-3, 0.0, 0.0], dtype=torch.float64)
    _, rel, _ = errors(actual, expected)
    assert rel == pytest.approx(1e-3 / (1e-3 * 4.0))  # not 1e27: the error against 0.001 of the largest


def test_quantized_comparison_allows_a_bounded_fraction_one_step_off():
    from harness.runtime.numerics import Mismatch, Stats, compare_quantized

    ref = torch.linspace(-400, 400, 1000).to(torch.float8_e4m3fn)
    bits = ref.view(torch.uint8).clone()
    off = bits.clone()
    off[:5] += 1  # five elements one fp8 step away (same sign)
    compare_quantized("out", off.view(torch.float8_e4m3fn), ref, 0.01, Stats())
    off[:40] = bits[:40] + 1  # 4%: beyond what chance puts one step off in 1000 elements at 1% (27)
    with pytest.raises(Mismatch, match="one step"):
        compare_quantized("out", off.view(torch.float8_e4m3fn), ref, 0.01, Stats())
    far = bits.clone()
    far[500] += 3  # near zero: three steps up stays finite
    with pytest.raises(Mismatch, match="more than one step"):
        compare_quantized("out", far.view(torch.float8_e4m3fn), ref, 0.01, Stats())


def test_a_comparison_without_stats_measures_errors_only_to_explain_a_mismatch(monkeypatch):
    """A benchmark's check after timing keeps no statistics: the fp64 error passes (90% of a comparison's time on
    a CPU machine at 4096 x 4096) run only when the outputs differ, and the message is the same."""
    from harness.runtime import numerics
    from harness.plan.model import Tolerance

    expected = torch.linspace(-2, 2, 4096).to(torch.bfloat16)
    close = (expected.float() * 1.001).to(torch.bfloat16)
    wrong = close.clone()
    wrong[7] += 1
    tol = Tolerance(1.6e-2, 1.6e-2)
    with pytest.raises(numerics.Mismatch) as with_stats:
        numerics.compare("out", wrong, expected, tol, numerics.Stats())
    errors = numerics.errors
    monkeypatch.setattr(numerics, "errors", lambda *a: pytest.fail("errors measured for matching outputs"))
    numerics.compare("out", close, expected, tol, None)
    monkeypatch.setattr(numerics, "errors", errors)
    with pytest.raises(numerics.Mismatch) as without:
        numerics.compare("out", wrong, expected, tol, None)
    assert str(without.value) == str(with_stats.value) and "max abs error" in str(without.value)


NEW_PLANS = ["rotary_embedding", "rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
             "silu_and_mul_quant", "dynamic_per_token_fp8_quant", "int8_linear_column", "int8_linear_row",
             "paged_attention"]


@cpu_machine_only
@pytest.mark.parametrize("plan", NEW_PLANS)
def test_bundled_plan_passes_eager_and_torch_compile_at_tp1_and_tp2(pytester, tmp_path, plan):
    """Every new plan through `pytest --plan` on CPU: eager at tp1 and tp2 (gloo: the plan's own sharding), and
    torch_compile at tp1 (its custom op's registration, fake and opcheck), one phase and dtype, two examples a
    cell: the full matrix runs in the nightly job and its results are committed. torch_compile at tp2 runs for
    the row-parallel linear only (a compiled op inside ranks that all-reduce): for the others it adds no code of
    their own to the two cells above, and cost 6-10 s a plan on a 2-core machine."""
    # Batches of at most 64 tokens for paged attention and RoPE (decode and prefill tokens still mix; paged contexts
    # still span several blocks): the interpreter runs a program per few tokens, and the plans' limit of 8192 drew a
    # 336-token paged-attention batch, 43 of an eager cell's 45 s. The modes and the TP split are what this test runs;
    # tests/kernels/ and the nightly matrix check the numbers.
    small = {"max_num_batched_tokens": 64, "prefill_tokens": [16, 64]}
    path = narrowed(tmp_path, plan, matrix={"phase": ["chunked_prefill"], "dtype": ["bf16"], "tp": [1, 2],
                                            "graph_mode": ["eager", "torch_compile"], "sm": ["cpu"]},
                    numerics=small if plan in ("paged_attention", "rotary_embedding") else {})
    # In this process: the cells run in the run's own worker processes either way, and a fresh pytest process per
    # plan would import torch, Dynamo (the plan's upcast check) and the harness again, 8 s each on a 2-core machine.
    result = pytester.runpytest_inprocess(
        "-p", "harness.plugin", "--plan", str(path), "--examples", "2", "--plan-profile", "ci", "--reports-dir",
        str(tmp_path / "reports"), "--no-report",
        # the cells: the vLLM route and engine items have tests of their own
        "-k", "numerics" if plan == "int8_linear_row" else "numerics and not (tp2 and torch_compile)",
        "-p", "no:cacheprovider", "-q")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=4 if plan == "int8_linear_row" else 3)


def test_a_plans_own_generator_replaces_inputs_and_replays_from_the_seed(tmp_path):
    plan = load_plan(write_plan(tmp_path / "p.yaml", ROOT / "plan.yaml", op={"generate": "tests.plans:ones_for_x"}))
    cell = Cell("decode", "fp32", 1, "eager", "cpu")
    ex = examples(plan, cell, "cpu").example()
    first, again = build_args(plan, cell, ex, "cpu")["x"], build_args(plan, cell, ex, "cpu")["x"]
    assert bool((first == first.flatten()[0]).all()) and torch.equal(first, again)  # the hook's, and seeded


def test_an_optional_input_is_drawn_with_and_without_a_value(tmp_path):
    """`optional: true`: examples pass the tensor and None, and the fake/schema say `Tensor?`."""
    plan = load_plan(ROOT / "kernels/plans/dynamic_per_token_fp8_quant.yaml")
    assert "Tensor? scale_ub" in plan.schema()
    cell, seen = Cell.from_id("decode-bf16-tp1-eager-cpu"), set()

    @settings(max_examples=40, database=None, deadline=None)
    @given(examples(plan, cell, "cpu"))
    def draw(ex):
        value = build_args(plan, cell, ex, "cpu")["scale_ub"]
        seen.add(value is None)
        assert (value is None) == ("scale_ub" in ex.omitted) and ("scale_ub=None" in ex.describe()) == (value is None)

    draw()
    assert seen == {True, False}

"""What vLLM kernel authors get bitten by and no value comparison sees: padding rows a CUDA graph replays with, a
row's bits moving with the batch around it, and two calls on the same inputs giving different bits
(harness.runtime.padding, batch_invariance, determinism). Correct kernels pass each; the kernels of
tests/broken/hazard_kernels.py fail each for its reason. Cells run in this process with the `ci` profile, as
tests/test_broken_kernels.py runs them; the cores are also called directly on plain torch kernels."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from harness.results.checks import BY_NAME, Subject
from harness.results.fingerprints import plan_fingerprint
from harness.results.stamps import subject
from harness.results.store import to_json
from harness.runtime import batch_invariance, determinism, padding
from harness.runtime.inputs import Example, build_args
from harness.runtime.rows import Probes, difference
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from harness.plan.token_rows import rows_dependent, token_inputs
from kernels.rms_norm import rms_norm_ref
from tests.plans import cpu_machine_only, read_plan, rms_norm_plan, write_plan
from tests.test_report import cell, machine, render, section, write_results

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
HAZARDS = "tests.broken.hazard_kernels"
BUNDLED = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))]
ROPE = ROOT / "kernels" / "plans" / "rotary_embedding.yaml"
# Batches of at most 64 tokens: the interpreter's pace (about 2 ms a row on a 2-core CPU machine), and the batch
# sizes probed run up to the phase's largest
SMALL = {"max_num_seqs": 64, "max_num_batched_tokens": 64, "prefill_tokens": [16, 64]}


def run(tmp_path, kernel: str, cell_id: str = "decode-fp32-tp1-eager-cpu", functional: bool = False,
        examples: int = 10, **numerics) -> dict:
    phase, dtype, _, mode, _ = cell_id.split("-")
    plan = rms_norm_plan(tmp_path, kernel, functional=functional, numerics={**SMALL, **numerics},
                         matrix={"phase": [phase], "dtype": [dtype], "graph_mode": [mode]})
    return to_json(run_cell(CellTask.load(plan, cell_id, RunSettings(examples, "ci", None))).record)


# ---------------------------------------------------------------- which records each check stamps


RUNTIME = {"determinism": determinism.applies, "padding isolation": padding.applies,
           "batch invariance": batch_invariance.applies}


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_a_check_runs_on_exactly_the_cells_the_registry_stamps(path):
    """The registry (harness.results.checks) says which records a check made; the runtime decides which cells run
    it: the two must agree on every cell, or a record would claim a check it never ran."""
    plan = load_plan(path)
    for phase, dtype, tp, mode, sm in itertools.product(*(plan.matrix[a] for a in ("phase", "dtype", "tp",
                                                                                     "graph_mode", "sm"))):
        c = Cell(phase, dtype, tp, mode, sm)
        for name, runtime in RUNTIME.items():
            assert BY_NAME[name].applies(subject(plan, c)) == runtime(plan, c), (path.name, c.id, name)


def test_the_checks_apply_narrowly():
    """Eager tp1 cells for a call's own properties; CUDA-graph cells for padding, eager ones on a CPU machine only;
    nothing else (a GPU re-run of stale records stays cheap)."""
    def applies(name, **axes):
        return BY_NAME[name].applies(Subject("cells", **{"sm": "sm90", "dtype": "bf16", "token_rows": True,
                                                         "batch_invariance": True, **axes}))

    assert applies("determinism", graph_mode="eager") and not applies("determinism", graph_mode="cuda_graph")
    assert not applies("determinism", graph_mode="eager", tp=2)
    assert not applies("determinism", graph_mode="memcheck")
    assert applies("padding isolation", graph_mode="cuda_graph")
    assert not applies("padding isolation", graph_mode="eager")  # a GPU pads in its CUDA-graph cells
    assert applies("padding isolation", graph_mode="eager", sm="cpu")  # a CPU machine runs no CUDA-graph cell
    assert not applies("padding isolation", graph_mode="cuda_graph", token_rows=False)
    assert applies("batch invariance", graph_mode="eager")
    assert not applies("batch invariance", graph_mode="eager", batch_invariance=False)
    assert not applies("batch invariance", graph_mode="torch_compile")


def test_which_ops_have_independent_rows():
    plans = {p.stem: load_plan(p) for p in BUNDLED}
    for name in ("plan", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "int8_linear_row",
                 "dynamic_per_token_fp8_quant"):
        assert rows_dependent(plans[name]) == "", name  # RoPE: a token's position travels with it
    assert "block_tables" in rows_dependent(plans["paged_attention"])
    assert token_inputs(plans["paged_attention"]) == ("query",)


def test_the_new_settings_at_their_defaults_stale_no_record(tmp_path):
    """Records made before numerics.batch_invariance and determinism existed keep their fingerprint while the plan
    leaves them at their defaults (they read "not checked for … yet"); a cell's changes where a plan sets one, a
    vLLM item's never."""
    def fingerprints(**numerics):
        plan = load_plan(rms_norm_plan(tmp_path, numerics={"examples": 20, **numerics}))
        return (plan_fingerprint(plan, "cells", dtype="fp32", phase="decode"),
                plan_fingerprint(plan, "integration", dtype="fp32", route="ir", phase="decode"))

    default = fingerprints()
    assert fingerprints(batch_invariance="report", determinism="required") == default
    assert fingerprints(batch_invariance="required")[0] != default[0]
    assert fingerprints(determinism="report")[0] != default[0]
    assert fingerprints(batch_invariance="off", determinism="report")[1] == default[1]


def test_batch_invariance_required_where_it_cannot_be_checked_is_warned(tmp_path):
    plan = load_plan(write_plan(tmp_path / "pa.yaml", ROOT / "kernels/plans/paged_attention.yaml",
                                numerics={"batch_invariance": "required"}))
    warned = [w for w in plan.warnings if "numerics.batch_invariance" in w]
    assert len(warned) == 1 and "its inputs describe the batch's sequences" in warned[0], plan.warnings
    assert not any("batch_invariance" in w for w in load_plan(rms_norm_plan(
        tmp_path, numerics={"examples": 20, "batch_invariance": "required"})).warnings)


# ---------------------------------------------------------------- the cores, on plain torch kernels


def rms_norm_plan_loaded(tmp_path, **numerics):
    return load_plan(rms_norm_plan(tmp_path, "kernels.rms_norm:rms_norm_ref", functional=True,
                                   numerics={**SMALL, **numerics}))


def batch_mean_norm(x, weight, eps):
    """Normalises by the mean square of the whole batch: every row reads every other row, padding included."""
    return x * torch.rsqrt(x.float().pow(2).mean() + eps).to(x.dtype) * weight


def nan_blind_scale(x, weight, eps):
    """Row-wise, times a factor of the batch's largest finite magnitude that is 1 below 1e30: NaN padding is
    ignored, huge padding is not."""
    m = torch.nan_to_num(x.float(), nan=0.0).abs().amax()
    return rms_norm_ref(x, weight, eps) * (m / m.clamp_max(1e30)).to(x.dtype)


def fp64_rms_norm(x, weight, eps):
    """RMSNorm with its mean square and scaling in fp64: the reference's values, other last bits."""
    return ((x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight)


def eager_padded(plan, kernel, base, ex, size):
    def padded(fill):
        return {"y": kernel(**{k: v for k, v in padding.padded_args(plan, base, ex, size, fill).items()})}
    return padded


@pytest.mark.parametrize("kernel, words", [
    (rms_norm_ref, None),
    (batch_mean_norm, "when the 3 padding rows held NaN (NaN in 64 of its 64 elements): the kernel reads the padding"),
    (nan_blind_scale, "when the 3 padding rows held huge finite values (each dtype's max/4)"),
])
def test_padding_isolation_core(tmp_path, kernel, words):
    plan = rms_norm_plan_loaded(tmp_path)
    c = Cell("decode", "fp32", 1, "eager", "cpu")
    ex = Example(num_tokens=5, sizes={"hidden": 64}, seed=3)
    base = build_args(plan, c, ex, "cpu")
    plain = {"y": kernel(**base)}
    failure, note = padding.isolation(plan, eager_padded(plan, kernel, base, ex, 8), plain, 5, 8)
    assert note == ""
    if words is None:
        assert failure == ""
    else:
        assert failure.startswith("padding isolation: real row 0 of 'y' changed") and words in failure, failure


def test_padding_that_changes_rows_alike_whatever_it_holds_is_not_a_leak(tmp_path):
    """A kernel whose result depends on the size it is launched at, but not on what the padding rows hold: noted,
    not failed (batch invariance's finding)."""
    plan = rms_norm_plan_loaded(tmp_path)
    c = Cell("decode", "fp32", 1, "eager", "cpu")
    ex = Example(num_tokens=5, sizes={"hidden": 64}, seed=3)
    base = build_args(plan, c, ex, "cpu")

    def by_size(x, weight, eps):  # past 5 rows the mean square in fp64: other last bits, row by row
        return rms_norm_ref(x, weight, eps) if x.shape[0] <= 5 else fp64_rms_norm(x, weight, eps)

    failure, note = padding.isolation(plan, eager_padded(plan, by_size, base, ex, 8), {"y": by_size(**base)}, 5, 8)
    assert failure == "" and "alike whatever the padding holds" in note, note


def test_padded_rows_keep_the_plans_pad_value_for_integer_inputs(tmp_path):
    args = read_plan(ROPE)["op"]["args"]
    args["positions"]["pad"] = 7
    plan = load_plan(write_plan(tmp_path / "rope.yaml", ROPE, op={"args": args}))
    c = Cell("decode", "fp32", 1, "eager", "cpu")
    ex = Example(num_tokens=3, sizes={"num_heads": 8, "num_kv_heads": 2, "head_size": 64, "rotary_dim": 32,
                                      "max_position": 4096}, seed=1)
    base = build_args(plan, c, ex, "cpu")
    values = padding.padded_args(plan, base, ex, 4, "nan")
    assert values["positions"].tolist() == base["positions"].tolist() + [7]
    assert torch.isnan(values["query"][3]).all() and torch.equal(values["query"][:3], base["query"])
    assert values["cos_sin_cache"] is base["cos_sin_cache"]  # shared, read only
    assert padding.padded_args(plan, base, ex, 4, "huge")["query"][3, 0] == torch.finfo(torch.float32).max / 4


def test_padded_size_is_the_capture_size_above():
    plan = load_plan(ROOT / "plan.yaml")
    sizes = plan.cuda_graph_sizes()
    assert padding.padded_size(plan, 1) == 2 and padding.padded_size(plan, 5) == 8
    assert padding.padded_size(plan, 8) == 16  # at a capture size itself nothing is padded: the next one
    assert padding.padded_size(plan, sizes[-1]) == (sizes[-1] // 256 + 1) * 256


def test_batch_invariance_core(tmp_path):
    plan = rms_norm_plan_loaded(tmp_path)
    c = Cell("decode", "fp32", 1, "eager", "cpu")
    ex = Example(num_tokens=4, sizes={"hidden": 64}, seed=3)
    base = build_args(plan, c, ex, "cpu")

    def batch(m):
        return build_args(plan, c, Example(num_tokens=m, sizes={"hidden": 64}, seed=m), "cpu")

    def call(kernel):
        return lambda values: {"y": kernel(**values)}

    assert batch_invariance.probe(plan, call(rms_norm_ref), base, ex, 4, batch, [8, 16, 32]) is None

    def split_from_16(x, weight, eps):  # the mean square in fp64 from 16 rows on: other last bits
        return fp64_rms_norm(x, weight, eps) if x.shape[0] >= 16 else rms_norm_ref(x, weight, eps)

    found = batch_invariance.probe(plan, call(split_from_16), base, ex, 4, batch, [8, 16, 32])
    assert found is not None and found.size == 16 and found.where == "front" and found.name == "y"
    assert found.verdict().startswith(f"varies from 16 tokens on (first row {found.row} of 'y', at the front")
    assert 0 < found.row_differs <= found.row_elements == 64


def test_placements_keep_the_copies_apart():
    assert batch_invariance.placements(4, 4) == [("front", 0)]
    assert batch_invariance.placements(8, 4) == [("front", 0), ("end", 4)]
    assert batch_invariance.placements(12, 4) == [("front", 0), ("end", 8), ("middle", 4)]
    assert batch_invariance.placements(256, 4) == [("front", 0), ("end", 252), ("middle", 126)]


def test_bitwise_difference():
    a = torch.tensor([[1.0, 2.0], [math.nan, -0.0]])
    assert difference(a, a.clone()) is None
    assert difference(a, torch.tensor([[1.0, 2.0], [math.nan, 0.0]])) is None  # -0 == 0, NaN == the same NaN
    b = a.clone()
    b[1, 0] = 3.0
    d = difference(a, b)
    assert (d.count, d.total, d.index) == (1, 4, (1, 0)) and math.isnan(d.first) and d.second == 3.0
    assert difference(a, a[:1]).other.startswith("shape (2, 2)")


def test_probes_run_on_every_example_once_the_check_failed():
    probes, values = Probes(2), {"x": torch.zeros(3)}
    assert probes.wants(values)
    probes.run(lambda: None)
    probes.run(lambda: None)
    assert not probes.wants(values)  # past its few examples
    probes = Probes(1)
    with pytest.raises(ValueError):
        probes.run(lambda: (_ for _ in ()).throw(ValueError()))
    probes.run(lambda: None)
    assert probes.wants(values)  # hypothesis shrinks and replays the failure: it must run again


# ---------------------------------------------------------------- cells: correct kernels pass, broken ones fail


@cpu_machine_only
@pytest.mark.parametrize("cell_id", ["decode-fp32-tp1-eager-cpu", "prefill-bf16-tp1-eager-cpu"])
def test_a_correct_kernel_passes_every_hazard(tmp_path, cell_id):
    rec = run(tmp_path, "kernels.rms_norm:rms_norm", cell_id)
    assert rec["status"] == "passed", rec["reason"]
    facts = rec["facts"]
    assert facts["determinism"] == "deterministic: called twice on the same inputs"
    assert facts["padding isolation"] == "padding isolated"
    low = 8 if cell_id.startswith("decode") else 16
    assert facts["batch invariance"] == f"batch-invariant: 4 rows alone and at the front, middle and end of {low} … " \
                                        "64-token batches"


@cpu_machine_only
def test_a_correct_kernel_returning_its_output_passes(tmp_path):
    rec = run(tmp_path, "tests.broken.rms_norm_bugs:functional", functional=True)
    assert rec["status"] == "passed", rec["reason"]
    assert rec["facts"]["padding isolation"] == "padding isolated"
    assert rec["facts"]["batch invariance"].startswith("batch-invariant")


@cpu_machine_only
def test_a_correct_in_place_kernel_with_positions_passes(tmp_path):
    """RoPE: query and key rotated in place, positions padded with the plan's pad value, a shared cos/sin cache."""
    plan = write_plan(tmp_path / "rope.yaml", ROPE,
                      matrix={"phase": ["decode"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"],
                              "sm": ["cpu"]},
                      numerics={**SMALL, "cpu_element_budget": 16384}, exclude=None, tp=None,
                      benchmark=None, vllm=None, implementations=None)
    rec = to_json(run_cell(CellTask.load(plan, "decode-fp32-tp1-eager-cpu", RunSettings(6, "ci", None))).record)
    assert rec["status"] == "passed", rec["reason"]
    assert rec["facts"]["padding isolation"] == "padding isolated"
    assert rec["facts"]["batch invariance"].startswith("batch-invariant")
    assert rec["facts"]["determinism"].startswith("deterministic")


@cpu_machine_only
def test_a_kernel_that_reads_the_padding_rows_fails(tmp_path):
    rec = run(tmp_path, f"{HAZARDS}:batch_absmax_scaled")
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("padding isolation: real row 0 of 'out' changed when the 1 padding row held NaN "
                                    "(NaN in"), rec["reason"]
    assert "the kernel reads the padding rows (num_tokens=1 padded to 2" in rec["reason"]
    assert rec["facts"]["padding isolation"].startswith("not isolated: real row 0 of 'out'")


@cpu_machine_only
def test_a_kernel_whose_rows_depend_on_the_batch_size_is_reported_not_failed(tmp_path):
    rec = run(tmp_path, f"{HAZARDS}:split_by_batch")
    assert rec["status"] == "passed", rec["reason"]  # its values are right, and batch invariance is reported
    assert rec["facts"]["batch invariance"].startswith("varies from 32 tokens on (first row "), rec["facts"]
    assert rec["facts"]["padding isolation"] == "padding isolated"  # it never reads the padding rows


@cpu_machine_only
def test_a_kernel_whose_rows_depend_on_the_batch_size_fails_where_invariance_is_required(tmp_path):
    rec = run(tmp_path, f"{HAZARDS}:split_by_batch", batch_invariance="required")
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("batch invariance: row "), rec["reason"]
    assert "of a 32-token batch from the same 4 rows run alone" in rec["reason"]
    assert rec["reason"].endswith("numerics.batch_invariance is required")


@cpu_machine_only
def test_batch_invariance_off_leaves_it_out(tmp_path):
    rec = run(tmp_path, f"{HAZARDS}:split_by_batch", batch_invariance="off")
    assert rec["status"] == "passed" and "batch invariance" not in rec["facts"]


@cpu_machine_only
def test_a_kernel_that_is_not_deterministic_fails(tmp_path):
    rec = run(tmp_path, f"{HAZARDS}:noisy")
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("determinism: output 'out' differs when the op is called again on the same "
                                    "inputs ("), rec["reason"]
    assert "first at [0, " in rec["reason"] and "the kernel is not deterministic" in rec["reason"]


@cpu_machine_only
def test_a_kernel_that_is_not_deterministic_is_reported_where_the_plan_says_so(tmp_path):
    rec = run(tmp_path, f"{HAZARDS}:noisy", determinism="report")
    assert rec["status"] == "passed", rec["reason"]
    assert rec["facts"]["determinism"].startswith("not deterministic: output 'out' differs"), rec["facts"]
    for other in ("padding isolation", "batch invariance"):  # bits that change call to call tell nothing there
        assert rec["facts"].get(other, determinism.UNDECIDED) == determinism.UNDECIDED, rec["facts"]


@cpu_machine_only
def test_an_atomic_reduction_is_deterministic_in_the_interpreter(tmp_path):
    """Triton's interpreter runs a launch's programs in turn: an atomic sum adds in one order there, so only a GPU
    can show it (test_an_atomic_reduction_fails_determinism_on_a_gpu)."""
    rec = run(tmp_path, f"{HAZARDS}:atomic_sum", examples=4)
    assert rec["status"] == "passed", rec["reason"]
    assert rec["facts"]["determinism"].startswith("deterministic")


# ---------------------------------------------------------------- on a GPU: CUDA graphs, streams, atomics


on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def gpu_run(tmp_path, kernel: str, mode: str, **numerics) -> dict:
    major, minor = torch.cuda.get_device_capability()
    sm = f"sm{major}{minor}"
    cell_id = f"decode-bf16-tp1-{mode}-{sm}"
    plan = rms_norm_plan(tmp_path, kernel, hidden=(4096, 2048), numerics={"examples": 15, **numerics},
                         matrix={"dtype": ["bf16"], "graph_mode": [mode], "sm": [sm]})
    return to_json(run_cell(CellTask.load(plan, cell_id, RunSettings(15, "ci", None))).record)


@on_gpu
def test_a_correct_kernel_passes_on_a_gpu(tmp_path):
    eager = gpu_run(tmp_path, "kernels.rms_norm:rms_norm", "eager")
    assert eager["status"] == "passed", eager["reason"]
    assert eager["facts"]["determinism"] == "deterministic: called twice on the same inputs, and on a second CUDA " \
                                            "stream"
    assert eager["facts"]["batch invariance"].startswith("batch-invariant")
    assert "padding isolation" not in eager["facts"]  # a GPU pads in its CUDA-graph cells
    graph = gpu_run(tmp_path, "kernels.rms_norm:rms_norm", "cuda_graph")
    assert graph["status"] == "passed", graph["reason"]
    assert graph["facts"]["padding isolation"] == "padding isolated"


@on_gpu
def test_a_kernel_that_reads_the_padding_rows_fails_its_cuda_graph_cell(tmp_path):
    rec = gpu_run(tmp_path, f"{HAZARDS}:batch_absmax_scaled", "cuda_graph")
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("padding isolation: real row 0 of 'out' changed when the"), rec["reason"]
    assert "the kernel reads the padding rows" in rec["reason"]


@on_gpu
def test_an_atomic_reduction_fails_determinism_on_a_gpu(tmp_path):
    rec = gpu_run(tmp_path, f"{HAZARDS}:atomic_sum", "eager")
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("determinism: output 'out' differs when the op is called again"), rec["reason"]


# ---------------------------------------------------------------- the page


def test_the_page_says_what_each_hazard_check_found(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"phase": ["decode", "prefill"]}))
    op_dir = tmp_path / "reports" / "rms_norm"
    facts = {"determinism": "deterministic: called twice on the same inputs", "padding isolation": "padding isolated"}
    cells = {
        "decode-fp32-tp1-eager-cpu": cell("decode-fp32-tp1-eager-cpu", "passed", facts={
            **facts, "batch invariance": "batch-invariant: 4 rows alone and at the front, middle and end of 8 … "
                                         "256-token batches"}),
        "prefill-fp32-tp1-eager-cpu": cell("prefill-fp32-tp1-eager-cpu", "passed", facts={
            **facts, "batch invariance": "varies from 64 tokens on (first row 3 of 'out', at the middle of the "
                                         "batch: 12 of 64 elements differ from the rows run alone)"}),
    }
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu"), cells)
    text = section(render(plan, op_dir), "Constraints and assumptions")
    assert "- Padding isolation: padding isolated (2 cells: " in text
    assert "- Batch invariance (`numerics.batch_invariance: report`): batch-invariant: 4 rows alone" in text
    assert "varies from 64 tokens on (first row 3 of 'out', at the middle" in text
    assert "- Determinism (`numerics.determinism: required`): deterministic: called twice" in text
    assert "| batch invariance |" not in text  # not in the table of other facts as well

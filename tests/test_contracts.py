"""Kernel contracts (op.contract, a named baseline's contract): validated at load, honoured by every input drawn,
by dtype exclusion, by benchmarks, in the report and in the generated vLLM plugin's supports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from harness.runtime.bench.implementations import implementations
from harness.runtime.bench.measure import run_benchmark
from harness.runtime.bench.specs import BenchSpec, bench_specs, outside_contract, skip_reason

from harness.rendering import report
from harness.cells.hardware import Hardware
from harness.runtime.inputs import build_args, examples, within_contract
from harness.cells.matrix import Cell, decide
from harness.cells.status import Status
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from harness.results.store import to_json
from harness.runtime.runner import RunSettings, run_cell, shrink_example
from harness.runtime.tasks import BenchTask, CellTask
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm.plugin_source import render_plugin
from tests.plans import rms_norm_args, rms_norm_plan, write_plan
from tests.test_vllm_ops import _ruff

ROOT = Path(__file__).resolve().parents[1]
CPU = Hardware("cpu", "cpu", "test cpu", 0, 2)
CI = RunSettings(examples=25, profile="ci", database=None)
BUGS = "tests.broken.contract_bugs"


RMS_VLLM = {"route": "ir", "layer": "vllm.model_executor.layers.layernorm:RMSNorm", "ir_op": "rms_norm"}


def contract_plan(tmp_path: Path, contract: dict, op: dict | None = None, **kw) -> Path:
    """The small RMSNorm plan of tests.plans with `contract` as its op.contract (a key a line, after op.sizes)."""
    return rms_norm_plan(tmp_path, op={**(op or {}), "contract": contract}, **kw)


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def contract_line(path: Path) -> int:
    """The line of op.contract in the plan file (its keys are on the lines after it)."""
    return _line_of(path, "  contract:")


# ---------------------------------------------------------------- validation


# (contract, plan keywords, field, its line counted from op.contract's (1: the contract's first key, on a line of its
# own; 0: a contract of plain values, written on op.contract's line), words the message must contain)
MALFORMED = [
    ({"contigous": ["x"]}, {}, "op.contract.contigous", 1, "one of the keys contiguous, row_stride_multiple_of"),
    ({"contiguous": ["y"]}, {}, "op.contract.contiguous[0]", 1, "one of out, x, weight"),
    ({"contiguous": ["eps"]}, {}, "op.contract.contiguous[0]", 1, "one of out, x, weight"),
    ({"multiple_of": {"hiden": 8}}, {}, "op.contract.multiple_of.hiden", 1, "one of the keys hidden"),
    ({"at_most": {"hidden": 0}}, {}, "op.contract.at_most.hidden", 1, "a positive integer"),
    ({"row_stride_multiple_of": {"x": True}}, {}, "op.contract.row_stride_multiple_of.x", 1, "a positive integer"),
    ({"row_stride_multiple_of": {"weight": 8}}, {}, "op.contract.row_stride_multiple_of.weight", 1,
     "a tensor of 2 or more dimensions"),
    ({"dtypes": ["fp16"]}, {}, "op.contract.dtypes[0]", 1, "one of fp32"),
    ({"dtypes": []}, {}, "op.contract.dtypes", 1, "at least one dtype of matrix.dtype"),
    ({"why": 3}, {}, "op.contract.why", 0, "text"),
    ({"at_least": {"hidden": 256}, "at_most": {"hidden": 128}}, {}, "op.contract.at_most.hidden", 2,
     "at least op.contract.at_least.hidden (256)"),
    # contradictions: nothing of the plan's is left to draw
    ({"multiple_of": {"hidden": 8}}, {"hidden": [63, 127]}, "op.contract.multiple_of.hidden", 1,
     "a constraint that a size of op.sizes.hidden (63, 127) meets"),
    ({"at_least": {"hidden": 256}}, {}, "op.contract.at_least.hidden", 1, "a size of op.sizes.hidden (64, 128)"),
    ({"multiple_of": {"hidden": 8}}, {"numerics": {"examples": 20, "cpu_sizes": {"hidden": [63]}}},
     "op.contract.multiple_of.hidden", 1, "a size of numerics.cpu_sizes.hidden (63)"),
    ({"contiguous": ["x"], "row_stride_multiple_of": {"x": 8}}, {"hidden": [63, 127]},
     "op.contract.row_stride_multiple_of.x", 2, "a multiple that x's rows (hidden wide, drawn contiguous only)"),
]


@pytest.mark.parametrize("contract, plan_kw, field, key, words", MALFORMED, ids=[m[2] for m in MALFORMED])
def test_a_bad_contract_is_a_plan_error_at_its_line(tmp_path, contract, plan_kw, field, key, words):
    path = contract_plan(tmp_path, contract, **plan_kw)
    line = contract_line(path) + key
    with pytest.raises(PlanError) as exc:
        load_plan(path)
    assert (exc.value.field, exc.value.line) == (field, line), str(exc.value)
    assert str(exc.value).startswith(f"{path}:{line}: {field}: expected ") and words in str(exc.value), str(exc.value)


def test_contiguous_for_a_tensor_the_plan_draws_only_strided_is_an_error(tmp_path):
    args = rms_norm_args()
    args["x"]["layout"] = ["strided"]
    path = contract_plan(tmp_path, {"contiguous": ["x"]}, op={"args": args})
    with pytest.raises(PlanError, match=rf":{contract_line(path) + 1}: op.contract.contiguous\[0\]: expected a tensor "
                                        r"the plan draws contiguous \(op.args.x.layout lists contiguous\); found 'x'"):
        load_plan(path)


@pytest.mark.parametrize("entry, field, at, words", [
    ({"picky": {"path": "tests.baselines:rms_norm_into", "contract": {"multiple_of": {"hiddn": 8}}}},
     "implementations.picky.contract.multiple_of.hiddn", "multiple_of: {hiddn: 8}", "one of the keys hidden"),
    ({"picky": {"contract": {}}}, "implementations.picky", "  picky:", "path for a import implementation"),
    ({"picky": {"path": "not a path"}}, "implementations.picky.path", "  picky: {path: not a path}",
     "an import path"),
    ({"picky": {"path": "tests.baselines:rms_norm_into", "contract": {"dtypes": ["bf16"]}}},
     "implementations.picky.contract.dtypes[0]", "dtypes: [bf16]", "one of fp32"),
])
def test_a_bad_baseline_contract_is_a_plan_error(tmp_path, entry, field, at, words):
    """`at`: the text of the line the error names."""
    path = rms_norm_plan(tmp_path, benchmark={"decode": [4]}, implementations=entry)
    with pytest.raises(PlanError) as exc:
        load_plan(path)
    assert exc.value.field == field and exc.value.line == _line_of(path, at), (str(exc.value), path.read_text())
    assert words in str(exc.value), str(exc.value)


def test_a_contract_loads_as_written(tmp_path):
    path = contract_plan(tmp_path, {"contiguous": ["weight"], "row_stride_multiple_of": {"x": 8},
                                    "multiple_of": {"hidden": 8}, "at_least": {"hidden": 16},
                                    "at_most": {"hidden": 16384}, "dtypes": ["bf16", "fp16"],
                                    "why": "vectorised 16-byte loads"},
                         matrix={"dtype": ["fp32", "bf16", "fp16"]})
    plan = load_plan(path)
    c = plan.contract
    assert (c.contiguous, c.row_stride_multiple_of, c.multiple_of) == (("weight",), (("x", 8),), (("hidden", 8),))
    assert (c.at_least, c.at_most, c.dtypes, plan.where("op.contract")) == (
        (("hidden", 16),), (("hidden", 16384),), ("bf16", "fp16"), contract_line(path))
    assert c.describe() == ("weight contiguous; x's row stride a multiple of 8 elements; hidden a multiple of 8; "
                            "hidden at least 16; hidden at most 16384; dtypes bf16, fp16")
    assert load_plan(ROOT / "plan.yaml").contract.empty


# ---------------------------------------------------------------- what is drawn


def _draw_all(plan, cell: Cell, n: int = 150) -> list:
    """`n` examples as the cell draws them (derandomized), each with the arguments built from it."""
    drawn = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None)
    @given(examples(plan, cell, "cpu"))
    def draw(ex):
        drawn.append((ex, build_args(plan, cell, ex, "cpu")))

    draw()
    return drawn


DECODE_BF16 = Cell("decode", "bf16", 1, "eager", "cpu")


def test_drawn_inputs_keep_to_sizes_strides_and_contiguity(tmp_path):
    plan = load_plan(contract_plan(tmp_path, {"contiguous": ["weight"], "row_stride_multiple_of": {"x": 8},
                                              "multiple_of": {"hidden": 8}, "at_least": {"hidden": 16},
                                              "at_most": {"hidden": 96}},
                                   matrix={"dtype": ["bf16"]}, hidden=[64, 128]))
    drawn = _draw_all(plan, DECODE_BF16)
    hiddens, strided = set(), 0
    for ex, values in drawn:
        x, hidden = values["x"], values["x"].shape[-1]
        assert hidden % 8 == 0 and 16 <= hidden <= 96, ex.describe()
        assert x.stride(-2) % 8 == 0 and x.stride(-1) == 1, ex.describe()
        assert values["weight"].is_contiguous() and values["out"].is_contiguous(), ex.describe()
        assert within_contract(plan, ex)
        hiddens.add(hidden)
        strided += not x.is_contiguous()
    # still the plan's size and awkward ones (odd multiples of 8), strided and contiguous x
    assert 64 in hiddens and hiddens - {64}, hiddens
    assert 0 < strided < len(drawn), strided


def test_rows_are_padded_to_the_row_stride_and_contiguous_tensors_stay_contiguous(tmp_path):
    plan = load_plan(contract_plan(tmp_path, {"row_stride_multiple_of": {"x": 8}}, matrix={"dtype": ["bf16"]}))
    odd = 0
    for ex, values in _draw_all(plan, DECODE_BF16):
        assert values["x"].stride(-2) % 8 == 0, ex.describe()
        odd += values["x"].shape[-1] % 2  # awkward widths are still drawn: padded to the multiple
    assert odd
    plan = load_plan(contract_plan(tmp_path, {"contiguous": ["x"], "row_stride_multiple_of": {"x": 8}},
                                   matrix={"dtype": ["bf16"]}))
    for ex, values in _draw_all(plan, DECODE_BF16):  # contiguous only: its width is drawn a multiple of 8
        assert values["x"].is_contiguous() and values["x"].shape[-1] % 8 == 0, ex.describe()


def test_without_a_contract_the_same_plan_draws_what_a_contract_rules_out(tmp_path):
    """The checks above can fail: the same plan with no contract draws odd widths and odd row strides."""
    plan = load_plan(rms_norm_plan(tmp_path, matrix={"dtype": ["bf16"]}))
    drawn = _draw_all(plan, DECODE_BF16)
    assert any(v["x"].shape[-1] % 8 for _, v in drawn)
    assert any(v["x"].stride(-2) % 8 for _, v in drawn)
    assert any(not v["x"].is_contiguous() for _, v in drawn)


def test_a_shrink_after_a_fault_tries_only_examples_inside_the_contract(tmp_path):
    """A fault on strided x only: shrinking its row padding passes paddings the contract rules out, untried."""
    plan = load_plan(contract_plan(tmp_path, {"row_stride_multiple_of": {"x": 8}, "multiple_of": {"hidden": 8}}))
    cell = Cell("decode", "fp32", 1, "eager", "cpu")
    start = next(ex for ex, _ in _draw_all(plan, cell, 100) if ex.layouts["x"][0] == "strided"
                 and ex.layouts["x"][1] > 8)
    tried = []

    def reproduces(ex):
        tried.append(ex)
        return ex.layouts["x"][0] == "strided"

    smallest = shrink_example(plan, cell, start, reproduces)
    assert tried and all(within_contract(plan, ex) for ex in tried), [ex.describe() for ex in tried]
    assert within_contract(plan, smallest) and smallest.layouts["x"][0] == "strided"
    assert smallest.num_tokens == 1 and smallest.sizes["hidden"] == 8


# ---------------------------------------------------------------- a kernel right only inside its contract


CASES = [  # (kernel, its contract, contracts that leave out what it needs)
    ("packed_rows", {"contiguous": ["x"], "multiple_of": {"hidden": 8}},
     [{"multiple_of": {"hidden": 8}}, {"contiguous": ["x"]}, None]),
    ("stride_in_vectors", {"row_stride_multiple_of": {"x": 8}}, [None]),
]


@pytest.mark.parametrize("kernel, contract, weaker", CASES, ids=[c[0] for c in CASES])
@pytest.mark.usefixtures("faithful_interpreter")  # runs kernels in this process, as a worker does
def test_a_kernel_passes_inside_its_contract_and_fails_without_it(tmp_path, kernel, contract, weaker):
    def run(contract):
        path = contract_plan(tmp_path, contract, kernel=f"{BUGS}:{kernel}") if contract else \
            rms_norm_plan(tmp_path, kernel=f"{BUGS}:{kernel}")
        return to_json(run_cell(CellTask.load(path, "decode-fp32-tp1-eager-cpu", CI)).record)

    inside = run(contract)
    assert inside["status"] == "passed", inside["reason"]
    assert inside["facts"]["contract"] == load_plan(contract_plan(tmp_path, contract)).contract.describe()
    for contract in weaker:
        outside = run(contract)
        assert outside["status"] == "failed", (contract, outside)
        assert outside["minimal_example"].startswith("num_tokens="), outside


# ---------------------------------------------------------------- dtypes


def test_cells_of_a_dtype_outside_the_contract_are_excluded(tmp_path):
    path = contract_plan(tmp_path, {"dtypes": ["bf16"], "why": "bf16 loads only"}, matrix={"dtype": ["fp32", "bf16"]},
                         benchmark={"decode": [4]}, implementations={"native": {}})
    plan = load_plan(path)
    fp32 = decide(plan, Cell("decode", "fp32", 1, "eager", "cpu"), CPU, 4)
    assert fp32.status == Status.EXCLUDED
    assert fp32.reason == f"outside the kernel's contract (line {contract_line(path)}): dtypes bf16 (bf16 loads only)"
    assert decide(plan, Cell("decode", "bf16", 1, "eager", "cpu"), CPU, 4).status is None
    specs = {s.dtype: s for s in bench_specs(plan, "cpu")}
    assert skip_reason(plan, specs["fp32"], CPU) == fp32.reason
    assert skip_reason(plan, specs["bf16"], CPU) == ""
    # an exclude rule still wins over the contract
    write_plan(path, path, exclude=[{"dtype": "fp32", "why": "not wanted"}])
    assert "excluded by the plan" in decide(load_plan(path), Cell("decode", "fp32", 1, "eager", "cpu"), CPU, 4).reason


def test_an_expect_rule_only_on_dtypes_outside_the_contract_is_a_warning(tmp_path):
    path = contract_plan(tmp_path, {"dtypes": ["bf16"]}, matrix={"dtype": ["fp32", "bf16"]},
                         expect=[{"dtype": "fp32", "why": "tracked"}])
    assert any("expect[0]" in w for w in load_plan(path).warnings)


# ---------------------------------------------------------------- benchmarks


def baselines(picky_dtypes=("fp32",)) -> dict:
    """Implementations with two of the plan's own baselines, one of them (picky) with a contract."""
    picky = {"path": "tests.baselines:rms_norm_into",
             "contract": {"multiple_of": {"hidden": 128}, "dtypes": list(picky_dtypes)}}
    return {"native": {}, "ref_into": {"path": "tests.baselines:rms_norm_into"}, "picky": picky}


def test_shapes_outside_a_baselines_contract_are_not_timed_for_it_on_cpu(tmp_path):
    path = rms_norm_plan(tmp_path, hidden=[64, 128], benchmark={"decode": [4]}, implementations=baselines())
    plan = load_plan(path)
    assert plan.baselines == ("native", "ref_into", "picky")
    assert [plan.implementation(n).path for n in ("ref_into", "picky")] == ["tests.baselines:rms_norm_into"] * 2
    specs = {s.sizes_dict["hidden"]: s for s in bench_specs(plan, "cpu")}
    assert skip_reason(plan, specs[64], CPU) == ""  # the kernel has no contract: the item runs
    rec = run_benchmark(BenchTask(plan, specs[64])).record
    assert rec.impls["picky"].not_run == "outside picky's contract: hidden 64 is not a multiple of 128"
    assert not rec.impls["picky"].timed
    assert rec.impls["native"].timed and rec.impls["ref_into"].timed and rec.impls["ref_into"].error is None
    rec = run_benchmark(BenchTask(plan, specs[128])).record
    assert rec.impls["picky"].timed and rec.impls["picky"].error is None
    bf16 = BenchSpec("decode", "bf16", "eager", "cpu", 4, (("hidden", 128),), ("ref_into", "picky"))
    assert outside_contract(plan, "picky", bf16) == "outside picky's contract: dtype bf16 is not one of fp32"
    assert outside_contract(plan, "ref_into", bf16) == ""


def test_shapes_outside_the_kernels_contract_are_not_benchmarked(tmp_path):
    plan = load_plan(contract_plan(tmp_path, {"at_most": {"hidden": 64}, "row_stride_multiple_of": {"x": 128}},
                                   hidden=[64, 128], benchmark={"decode": [4]}, implementations={"native": {}}))
    specs = {s.sizes_dict["hidden"]: s for s in bench_specs(plan, "cpu")}
    assert skip_reason(plan, specs[128], CPU) == "outside the kernel's contract: hidden 128 is above 64"
    assert skip_reason(plan, specs[64], CPU) == \
        "outside the kernel's contract: x's row stride 64 is not a multiple of 128"
    assert implementations(plan, "cpu", specs[128])["kernel"].startswith("outside the kernel's contract")


# ---------------------------------------------------------------- the report


def test_the_report_lists_the_contracts_among_the_constraints(tmp_path):
    path = contract_plan(tmp_path, {"contiguous": ["x"], "multiple_of": {"hidden": 8}, "dtypes": ["bf16"],
                                    "why": "16-byte loads"},
                         matrix={"dtype": ["fp32", "bf16"]}, benchmark={"decode": [4]},
                         implementations=baselines(picky_dtypes=["bf16"]))
    text, _ = report.render(load_plan(path), tmp_path / "reports" / "rms_norm")
    constraints = text[text.index("## Constraints and assumptions"):text.index("## High-level design")]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in constraints.splitlines()
            if line.startswith("| ")}
    assert rows["Kernel contract"] == f"x contiguous; hidden a multiple of 8; dtypes bf16: 16-byte loads " \
                                      f"(plan line {contract_line(path)})"
    assert rows["Contract of picky"] == \
        f"hidden a multiple of 128; dtypes bf16 (plan line {_line_of(path, '    contract:')})"
    assert f"outside the kernel's contract (line {contract_line(path)}): dtypes bf16 (16-byte loads)" in text  # fp32


# ---------------------------------------------------------------- the vLLM plugin


def test_the_plugin_checks_the_contract_after_its_own_checks(tmp_path):
    path = contract_plan(tmp_path, {"contiguous": ["x", "out"], "row_stride_multiple_of": {"x": 8},
                                    "multiple_of": {"hidden": 8}, "at_most": {"hidden": 16384},
                                    "dtypes": ["bf16", "fp16"], "why": "vectorised 16-byte loads"},
                         matrix={"dtype": ["bf16", "fp16"]}, vllm=RMS_VLLM)
    text = render_plugin(load_plan(path))
    assert (f"    # op.contract (plan.yaml line {contract_line(path)}): vectorised 16-byte loads\n"
            "    # out: allocated contiguous by run_kernel\n"
            "    return (x.dim() == 2 and x.stride(-1) == 1\n"
            "            and weight.dim() == 1 and weight.stride(-1) == 1 and weight.dtype == x.dtype\n"
            "            and x.is_contiguous()\n"
            "            and x.stride(-2) % 8 == 0\n"
            "            and x.shape[-1] % 8 == 0\n"
            "            and x.shape[-1] <= 16384\n"
            "            and x.dtype in (torch.bfloat16, torch.float16))\n") in text
    (tmp_path / "plugin.py").write_text(text)
    proc = _ruff(tmp_path / "plugin.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "and weight.dtype == x.dtype)\n" in render_plugin(load_plan(ROOT / "plan.yaml"))  # no contract: the plan's


def test_a_symbol_with_a_coefficient_is_read_off_the_shape(tmp_path):
    path = write_plan(tmp_path / "silu.yaml", ROOT / "kernels" / "plans" / "silu_and_mul.yaml",
                      op={"contract": {"multiple_of": {"intermediate": 64}, "row_stride_multiple_of": {"out": 8}}})
    rendered = render_plugin(load_plan(path))
    assert ("return (x.dim() == 2 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0\n"
            "            and (x.shape[-1] // 2) % 8 == 0\n            and (x.shape[-1] // 2) % 64 == 0)") in rendered


_SUPPORTS = r"""
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("plugin", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
w = torch.ones(64, dtype=torch.bfloat16)
padded = torch.zeros(4, 72, dtype=torch.bfloat16)
calls = {
    "inside": (torch.zeros(4, 64, dtype=torch.bfloat16), w),
    "strided": (padded[:, :64], w),
    "hidden 60": (torch.zeros(4, 60, dtype=torch.bfloat16), w[:60]),
    "hidden 16392": (torch.zeros(2, 16392, dtype=torch.bfloat16), torch.ones(16392, dtype=torch.bfloat16)),
    "fp32": (torch.zeros(4, 64), torch.ones(64)),
    "not 2-d": (torch.zeros(64, dtype=torch.bfloat16), w),
}
print(json.dumps({k: m.supports(x, weight, 1e-6) for k, (x, weight) in calls.items()}))
"""


@pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")
def test_the_rendered_plugin_rejects_calls_outside_the_contract(tmp_path):
    """In a fresh process (the plugin registers its op with torch.library, as vLLM would load it)."""
    plan = load_plan(contract_plan(tmp_path, {"contiguous": ["x"], "multiple_of": {"hidden": 8},
                                              "at_most": {"hidden": 16384}, "dtypes": ["bf16"]},
                                   matrix={"dtype": ["fp32", "bf16"]}, vllm=RMS_VLLM))
    (tmp_path / "plugin.py").write_text(render_plugin(plan))
    proc = subprocess.run([sys.executable, "-c", _SUPPORTS, str(tmp_path / "plugin.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"inside": True, "strided": False, "hidden 60": False, "hidden 16392": False, "fp32": False,
                    "not 2-d": False}

"""The plan model: valid plans load; each malformed plan gets its own precise error (file, line, field)."""

from __future__ import annotations

import pickle
import re

import subprocess
import sys
from pathlib import Path

import pytest

from harness.plan.load import load_plan
from harness.runtime.resolve import resolve
from harness.plan.model import PlanError
from tests.plans import read_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]

BASE = """\
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
  phase: [decode, prefill]
  dtype: [fp32, bf16]
  tp: [1, 2]
  graph_mode: [eager, torch_compile]
  sm: [cpu, sm90]
exclude:
  - {dtype: bf16, sm: [cpu], why: "not on this machine"}
expect:
  - {graph_mode: torch_compile, dtype: fp32, status: fail, why: "tracked upstream"}
tolerance:
  bf16: {atol: 1.0e-2, rtol: 2.0e-2}
numerics: {examples: 5}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_bundled_plans_load():
    for path in [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))]:
        plan = load_plan(path)
        code = resolve(plan)
        assert code.kernel is not None and code.reference is not None
        assert plan.op.outputs


PLAN_FILES = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml")),
              *sorted((ROOT / "tests" / "thirdparty").glob("*.yaml"))]


@pytest.mark.parametrize("path", PLAN_FILES, ids=lambda p: p.stem)
def test_a_validated_plan_is_complete_however_it_was_made(path):
    """Plan.model_validate of a file's data, a copy and a pickle round trip give the runtime what loading the file
    gives (the derived arguments, TP split, benchmark sizes, tolerances and warnings included)."""
    from harness.plan.model import Plan
    from harness.plan.yaml_lines import parse
    from tests.test_plan_mutations import canon

    loaded = load_plan(path)
    data, _ = parse(path.read_text())
    for made in (Plan.model_validate(data), loaded.model_copy(), pickle.loads(pickle.dumps(loaded))):
        assert canon(made) == canon(loaded)
        assert made.args and len(made.warnings) == len(loaded.warnings)  # a file's warnings name its path
    assert Plan.model_validate(data).path == Path("") and loaded.path == path


def test_base_plan_fields(tmp_path):
    plan = load_plan(write(tmp_path, BASE))
    assert plan.op.name == "rms_norm" and plan.op.intent == "drop-in"
    assert [a.name for a in plan.args] == ["out", "x", "weight", "eps"]
    assert plan.arg("eps").value == 1e-6 and not plan.arg("eps").is_tensor
    assert plan.arg("x").layouts == ("contiguous", "strided")
    assert [str(d) for d in plan.arg("out").shape] == ["num_tokens", "hidden"]
    assert plan.matrix["tp"] == (1, 2)
    assert plan.exclude[0].why == "not on this machine" and plan.where("exclude[0]") == 20
    assert plan.tolerance["bf16"].atol == 1e-2
    assert plan.numerics.examples == 5


# (what is wrong, old text, new text, line, field, words the message must contain)
MALFORMED = [
    ("unknown top-level key", "numerics: {examples: 5}", "numerics: {examples: 5}\nnumercs: {}", 26, "numercs",
     "one of the keys"),
    ("unknown op key", "  intent: drop-in", "  intent: drop-in\n  kernal: x:y", 4, "op.kernal", "one of the keys"),
    ("missing op.kernel", "  kernel: kernels.rms_norm:rms_norm\n", "", 1, "op.kernel", "this key to be present"),
    ("unknown intent", "intent: drop-in", "intent: faster", 3, "op.intent", "drop-in, fusion"),
    ("bad import path form", "kernel: kernels.rms_norm:rms_norm", "kernel: kernels.rms_norm.rms_norm", 4,
     "op.kernel", "package.module:attribute"),
    ("import path that does not import", "kernel: kernels.rms_norm:rms_norm", "kernel: kernels.nope:rms_norm", 4,
     "op.kernel", "ModuleNotFoundError"),
    ("attribute that does not exist", "kernel: kernels.rms_norm:rms_norm", "kernel: kernels.rms_norm:rms_nrm", 4,
     "op.kernel", "AttributeError"),
    ("shape with an undefined symbol", "x: {shape: [num_tokens, hidden]", "x: {shape: [num_tokens, hiden]", 8,
     "op.args.x.shape[1]", "'hiden'"),
    ("shape entry of the wrong type", "weight: {shape: [hidden]", "weight: {shape: [-3]", 9,
     "op.args.weight.shape[0]", "positive integer"),
    ("unknown dtype", "weight: {shape: [hidden], dtype: act", "weight: {shape: [hidden], dtype: f16", 9,
     "op.args.weight.dtype", "'f16'"),
    ("unknown layout", "layout: [contiguous, strided]", "layout: [contiguous, transposed]", 8,
     "op.args.x.layout[1]", "'transposed'"),
    ("unknown arg key", "init: around_one}", "init: around_one, fill: 3}", 9, "op.args.weight.fill",
     "one of the keys"),
    ("unknown axis value", "phase: [decode, prefill]", "phase: [decode, prefil]", 14, "matrix.phase[1]",
     "'prefil'"),
    ("bad sm", "sm: [cpu, sm90]", "sm: [cpu, hopper]", 18, "matrix.sm[1]", "smXY"),
    ("tp of the wrong type", "tp: [1, 2]", "tp: [1, two]", 16, "matrix.tp[1]", "integer"),
    ("missing matrix axis", "  graph_mode: [eager, torch_compile]\n", "", 13, "matrix.graph_mode",
     "this key to be present"),
    ("repeated axis values", "dtype: [fp32, bf16]", "dtype: [fp32, fp32]", 15, "matrix.dtype", "without repeats"),
    ("exclude rule without why", '{dtype: bf16, sm: [cpu], why: "not on this machine"}', "{dtype: bf16, sm: [cpu]}",
     20, "exclude[0].why", "this key to be present"),
    ("exclude naming a value outside the matrix", "{dtype: bf16, sm: [cpu],", "{dtype: fp16, sm: [cpu],", 20,
     "exclude[0].dtype", "values of matrix.dtype"),
    ("expect with an unknown status", "status: fail", "status: pass", 22, "expect[0].status", "'pass'"),
    ("tolerance for an unknown dtype", "  bf16: {atol", "  bf17: {atol", 24, "tolerance.bf17", "one of the keys"),
    ("tolerance of the wrong type", "atol: 1.0e-2", "atol: tight", 24, "tolerance.bf16.atol", "'tight'"),
    ("numerics of the wrong type", "examples: 5", "examples: five", 25, "numerics.examples", "'five'"),
    # YAML 1.1 reads 1e-2 as the text '1e-2'
    ("a number YAML reads as text", "atol: 1.0e-2", "atol: 1e-2", 24, "tolerance.bf16.atol",
     "YAML reads 1e-2 as text, not a number: write it with a decimal point and a signed exponent (1.0e-2)"),
    ("a scalar argument YAML reads as text", "eps: 1.0e-6", "eps: 1e-6", 10, "op.args.eps",
     "a number (YAML reads 1e-6 as text, not a number: write it with a decimal point and a signed exponent "
     "(1.0e-6))"),
    ("an exponent without its sign", "rtol: 2.0e-2", "rtol: 2.0e2", 24, "tolerance.bf16.rtol", "(2.0e+2)"),
    ("output that is not written", "outputs: [out]", "outputs: [x]", 11, "op.outputs[0]", "mutated input"),
    ("output arg not listed", "outputs: [out]", "outputs: [y]", 7, "op.args.out.role",
     "listed in op.outputs"),
    ("mutates an unknown arg", "outputs: [out]", "outputs: [out]\n  mutates: [z]", 12, "op.mutates[0]", "'z'"),
    ("tp kind unknown", "numerics: {examples: 5}", "numerics: {examples: 5}\ntp: {kind: sharded-ish}", 26,
     "tp.kind", "'sharded-ish'"),
    ("tp shards a missing dimension", "numerics: {examples: 5}",
     "numerics: {examples: 5}\ntp: {kind: sharded, inputs: {x: {shard: 2}}}", 26, "tp.inputs.x.shard",
     "a dimension of a 2-d tensor"),
    ("vllm route unknown", "numerics: {examples: 5}", "numerics: {examples: 5}\nvllm: {route: plugin}", 26,
     "vllm.route", "'plugin'"),
    ("benchmark sizes naming too few or unknown sizes", "numerics: {examples: 5}",
     "numerics: {examples: 5}\nbenchmark:\n  decode: [1]\n  sizes:\n    - {hidden: 64, heads: 2}", 29,
     "benchmark.sizes[0]", "a value for every size of op.sizes (hidden)"),
    ("benchmark sizes outside op.sizes", "numerics: {examples: 5}",
     "numerics: {examples: 5}\nbenchmark:\n  decode: [1]\n  sizes:\n    - {hidden: 96}", 29,
     "benchmark.sizes[0].hidden", "one of op.sizes.hidden (64, 128)"),
    ("an output listed twice", "outputs: [out]", "outputs: [out, out]", 11, "op.outputs[1]",
     "values without repeats (out is listed before)"),
    ("a layout listed twice", "layout: [contiguous, strided]", "layout: [strided, strided]", 8, "op.args.x.layout[1]",
     "values without repeats"),
    ("a benchmark model naming one size twice", "numerics: {examples: 5}",
     "numerics: {examples: 5}\nbenchmark:\n  decode: [1]\n  models: {\"hidden=64,hidden=128\": Llama}", 28,
     "benchmark.models.hidden=64,hidden=128", "naming each symbol once"),
    ("benchmark sizes repeated", "numerics: {examples: 5}",
     "numerics: {examples: 5}\nbenchmark:\n  decode: [1]\n  sizes:\n    - {hidden: 64}\n    - {hidden: 64}", 30,
     "benchmark.sizes[1]", "size combinations without repeats"),
    ("not a mapping at all", BASE, "- just\n- a list\n", 1, "(top level)", "a mapping"),
    ("broken YAML", "  intent: drop-in", "  intent: [drop-in", 4, "(yaml)", "valid YAML"),
]


@pytest.mark.parametrize("what, old, new, line, field, words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_plan_error(tmp_path, what, old, new, line, field, words):
    assert old in BASE, what
    path = write(tmp_path, BASE.replace(old, new, 1))
    with pytest.raises(PlanError) as info:  # parsing, or (import paths) resolving the plan's code
        resolve(load_plan(path))
    err = info.value
    message = str(err)
    assert err.field == field, message
    assert err.path == str(path)
    if line:
        assert err.line == line, message
        assert message.startswith(f"{path}:{line}: {field}: expected ")
    assert words in message


def test_missing_file_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="a readable plan file"):
        load_plan(tmp_path / "nope.yaml")


def test_validate_command_reports_without_traceback(tmp_path):
    bad = write(tmp_path, BASE.replace("dtype: [fp32, bf16]", "dtype: [fp32, bf61]"))
    proc = subprocess.run([sys.executable, "-m", "harness", "validate", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"{bad}:15: matrix.dtype[1]: expected one of fp32" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    ok = subprocess.run([sys.executable, "-m", "harness", "validate", "plan.yaml"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "plan.yaml: ok (rms_norm, 720 cells, and 720 of vllm)" in ok.stdout


# ---------------------------------------------------------------- plans that could not run a single cell

DEAD = [
    # (what, replace this, with this, the field named, words in the message)
    ("a repeated key", "  intent: drop-in\n", "  intent: drop-in\n  intent: fusion\n", "(yaml)", "given twice"),
    ("an import that is not a function", "kernels.rms_norm:rms_norm\n", "kernels.rms_norm:MAX_FUSED_BYTES\n",
     "op.kernel", "a function (callable)"),
    ("a kernel whose parameters are not the plan's", "kernels.rms_norm:rms_norm\n",
     "kernels.rms_norm:rms_norm_ref\n", "op.kernel", "taking the plan's arguments by name"),
    ("a reference whose parameters are not the plan's", "kernels.rms_norm:rms_norm_ref",
     "kernels.silu_and_mul:silu_and_mul_ref", "op.reference", "taking the plan's arguments"),
    ("a byte model over unknown names", "numerics:", "benchmark: {decode: [1], bytes: heads * 2}\nnumerics:",
     "benchmark.bytes", "unknown name 'heads'"),
]

IDLE = [
    ("a tolerance for a dtype the matrix has not", "  bf16: {atol: 1.0e-2", "  fp16: {atol: 1.0e-2", "tolerance.fp16"),
    ("capture sizes without cuda_graph cells", "numerics:", "cuda_graph: {capture_sizes: [1, 2]}\nnumerics:",
     "cuda_graph"),
    ("an expectation every cell of which is excluded", '{dtype: bf16, sm: [cpu], why: "not on this machine"}',
     '{graph_mode: torch_compile, dtype: fp32, why: "gone"}', "expect[0]"),
]


@pytest.mark.parametrize("what, old, new, field", IDLE, ids=[d[0] for d in IDLE])
def test_settings_that_never_apply_are_warned_about(tmp_path, what, old, new, field):
    assert old in BASE, what
    plan = load_plan(write(tmp_path, BASE.replace(old, new, 1)))
    assert len(plan.warnings) == 1 and f": {field}: expected " in plan.warnings[0], plan.warnings
    assert not load_plan(write(tmp_path, BASE)).warnings


@pytest.mark.parametrize("what, old, new, field, words", DEAD, ids=[d[0] for d in DEAD])
def test_validation_finds_plans_that_cannot_run(tmp_path, what, old, new, field, words):
    assert old in BASE, what
    with pytest.raises(PlanError) as info:
        resolve(load_plan(write(tmp_path, BASE.replace(old, new, 1))))
    assert info.value.field == field and words in str(info.value), str(info.value)


# ---------------------------------------------------------------- parsing, and resolving the plan's code


def test_loading_imports_none_of_the_plans_code(tmp_path):
    """A plan's import paths are text until harness.runtime.resolve imports them (at their line if they fail)."""
    path = write(tmp_path, BASE.replace("kernel: kernels.rms_norm:rms_norm", "kernel: tests.nowhere:kernel")
                 .replace("reference: kernels.rms_norm:rms_norm_ref", "reference: tests.nowhere_either:ref"))
    plan = load_plan(path)
    assert "tests.nowhere" not in sys.modules and plan.op.kernel == "tests.nowhere:kernel"
    assert (plan.where("op.kernel"), plan.where("op.reference"), plan.where("op.args.x.layout[1]")) == (4, 5, 8)
    assert plan.where("op.args.x.init") == 8  # not written: the line of the nearest field above it
    with pytest.raises(PlanError, match=rf"^{path}:4: op.kernel: expected an importable object \(ModuleNotFound"):
        resolve(plan)


def test_every_cell_dtype_has_a_default_tolerance_and_a_torch_dtype():
    from harness.plan.dtypes import ARG_DTYPES, CELL_DTYPES, DTYPE
    from harness.plan.tolerances import DEFAULT_TOLERANCE

    assert set(DEFAULT_TOLERANCE) == set(CELL_DTYPES)
    assert set(CELL_DTYPES) | set(ARG_DTYPES) == set(DTYPE)
    assert all(DTYPE[name].fp8_max for name in DTYPE if DTYPE[name].kind == "fp8")


# Plans that parse and would then run silently wrong: each is a file:line error before anything runs.
MISLEADING = [
    ("integer range reversed (every int8 weight one value)", "kernels/plans/int8_linear_column.yaml",
     "{integers: [-127, 128]}", "{integers: [128, -127]}", "op.args.weight.init.integers", "low below high"),
    ("uniform range reversed", "kernels/plans/int8_linear_column.yaml", "{integers: [-127, 128]}",
     "{uniform: [2.0, -2.0]}", "op.args.weight.init.uniform", "low below high"),
    ("decode batch larger than max_num_seqs", "plan.yaml", "decode: [1, 8,", "decode: [1, 100000,",
     "benchmark.decode[1]", "at most numerics.max_num_seqs (256)"),
    ("named baseline with a typo in an installed package", "plan.yaml", "  native: {}",
     "  liger: {path: kernels.rms_norm:rms_nrm}\n  native: {}", "implementations.liger.path",
     "has no attribute 'rms_nrm'"),
]


MISLEADING += [
    ("an exclude rule leaving no cell", "plan.yaml", "exclude:\n",
     "exclude:\n  - {phase: [prefill, decode, chunked_prefill], why: all}\n", "exclude", "at least one cell"),
    ("prefill chunks longer than vLLM schedules", "plan.yaml", "max_num_batched_tokens: 8192",
     "max_num_batched_tokens: 8192, prefill_tokens: [9000, 10000]", "numerics.prefill_tokens",
     "within numerics.max_num_batched_tokens (8192)"),
    ("a per-example time limit under a second", "plan.yaml", "examples: 12", "examples: 12, timeout_s: 0.001",
     "numerics.timeout_s", "at least 1"),
    ("no layout to draw", "plan.yaml", "layout: [contiguous, strided]", "layout: []", "op.args.x.layout",
     "at least one value"),
    ("a path condition that is a number", "plan.yaml", '"num_tokens * hidden * act_bytes >= 192 * 2**20"',
     '"num_tokens * hidden"', "op.paths.two_pass", "not a comparison"),
]
# Settings that validate and run, but not as they read: a warning at their line says what the run does instead.
WARNED = [
    ("prefill draws capped by max_num_batched_tokens", "max_num_batched_tokens: 8192",
     "max_num_batched_tokens: 8192, prefill_tokens: [128, 100000]", "numerics.prefill_tokens", "drawn up to that"),
    ("decode batches capped by max_num_batched_tokens", "max_num_seqs: 256", "max_num_seqs: 100000",
     "numerics.max_num_seqs", "drawn up to that"),
    ("a tolerance that accepts zeros", "fp16: {atol: 1.0e-2", "fp16: {atol: 1.0e+3", "tolerance.fp16",
     "a kernel writing zeros"),
    ("a capture size no decode batch replays", "tp: {kind: trivial}",
     "tp: {kind: trivial}\ncuda_graph: {capture_sizes: [1, 100000]}", "cuda_graph.capture_sizes", "never replayed"),
    ("CPU sizes over the element budget", "max_num_batched_tokens: 8192",
     "max_num_batched_tokens: 8192, cpu_sizes: {hidden: [1000000]}", "numerics.cpu_sizes", "one token of 1000000"),
    ("a path no cell reaches", '"num_tokens * hidden * act_bytes >= 192 * 2**20"', '"num_tokens > 10**9"',
     "op.paths.two_pass", "no example checks this path"),
    ("a path every example takes", '"num_tokens * hidden * act_bytes >= 192 * 2**20"', '"hidden > 0"',
     "op.paths.two_pass", "selects nothing"),
    ("a mutated input that is not an output", "  outputs: [out]", "  outputs: [out]\n  mutates: [x]",
     "op.mutates[0]", "x is not compared with the reference"),
]


@pytest.mark.parametrize("what, old, new, field, words", WARNED, ids=[m[0] for m in WARNED])
def test_a_setting_the_run_reads_otherwise_is_warned_at_its_line(tmp_path, what, old, new, field, words):
    # vLLM's kernel mutates no input: neither it nor its cells here
    text = re.sub(r"\n  vllm:\n(    .*\n)*", "\n", (ROOT / "plan.yaml").read_text())
    assert old in text, what
    path, changed = tmp_path / "plan.yaml", text.replace(old, new, 1)
    path.write_text(changed)
    line = changed[:changed.index(new)].count("\n") + 1 + new[:new.find(field.split(".")[-1])].count("\n")
    warnings = [x for x in load_plan(path).warnings if f": {field}: expected" in x]
    assert len(warnings) == 1 and words in warnings[0], load_plan(path).warnings
    assert warnings[0].startswith(f"{path}:{line}: "), warnings[0]


@pytest.mark.parametrize("expr", ["num_tokens <= 2", "num_tokens < 64 and hidden * act_bytes >= 8192",
                                  "not num_tokens > 4", "num_tokens == 1 or hidden != 4096", "2 >= num_tokens"])
def test_a_path_condition_of_any_comparison_some_cell_reaches_is_not_warned(tmp_path, expr):
    """A path taken at small sizes (a one-pass kernel for short rows, a decode-only branch) is reached too: the
    condition is tried across the sizes and token ranges, not at the largest only."""
    path = write_plan(tmp_path / "plan.yaml", ROOT / "plan.yaml", op={"paths": {"two_pass": expr}})
    assert not [x for x in load_plan(path).warnings if "op.paths" in x], load_plan(path).warnings


@pytest.mark.parametrize("what, plan, old, new, field, words", MISLEADING, ids=[m[0] for m in MISLEADING])
def test_a_plan_that_would_mislead_is_an_error_at_its_line(tmp_path, what, plan, old, new, field, words):
    text = (ROOT / plan).read_text()
    assert old in text, what
    path, changed = tmp_path / "plan.yaml", text.replace(old, new, 1)
    path.write_text(changed)
    line = changed[:changed.index(new)].count("\n") + 1
    with pytest.raises(PlanError) as err:
        resolve(load_plan(path))
    assert str(err.value).startswith(f"{path}:{line}: {field}: expected"), str(err.value)
    assert words in str(err.value), str(err.value)


def test_a_named_baseline_whose_package_is_not_installed_here_still_validates(tmp_path):
    """Installed on the GPU machine only: timed there, reported "cannot be imported here" elsewhere."""
    implementations = read_plan(ROOT / "plan.yaml")["implementations"]
    path = write_plan(tmp_path / "plan.yaml", ROOT / "plan.yaml",
                      implementations={"other": {"path": "not_installed_pkg.ops:rms"}, **implementations})
    plan = resolve(load_plan(path)).plan
    assert plan.baselines == ("native", "compiled", "vllm", "other")
    assert plan.implementation("other").path == "not_installed_pkg.ops:rms"


def test_a_plan_that_pins_an_optional_argument_gets_a_warning_naming_it(tmp_path):
    path = tmp_path / "plan.yaml"
    text = (ROOT / "kernels/plans/dynamic_per_token_fp8_quant.yaml").read_text()
    old = next(line for line in text.splitlines() if line.strip().startswith("scale_ub:"))
    path.write_text(text.replace(old, "    scale_ub: null", 1))
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.strip() == "scale_ub: null")
    warned = resolve(load_plan(path)).warnings
    assert len(warned) == 1 and warned[0].startswith(f"{path}:{line}: op.args.scale_ub: the kernel's optional "
                                                     "argument is pinned to null"), warned
    assert resolve(load_plan(ROOT / "kernels/plans/dynamic_per_token_fp8_quant.yaml")).warnings == []

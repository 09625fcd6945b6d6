"""Per-record fingerprints (harness.results.fingerprints): a record is stale only when the plan fields it rests on or
the implementation it ran changed; a comment, a docstring, a reformat, a description, a model's name or another
provider's edit leaves it current. Plans and kernels are edited in tmp_path copies; nothing here imports torch."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.fingerprints import UNKNOWN, benchmark_fingerprint, implementation_fingerprint, \
    plan_fingerprint
from harness.plan.load import load_plan
from harness.cells.matrix import every_cell
from harness.plan.vocabulary import PHASES

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = [ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml")),
           *sorted((ROOT / "tests" / "thirdparty").glob("*.yaml"))]


def copy_tree(tmp_path: Path) -> Path:
    """plan.yaml and the kernels package (its plans included) copied into tmp_path, whose copies the plans' imports
    (`kernels.…`) find first."""
    shutil.copy(ROOT / "plan.yaml", tmp_path / "plan.yaml")
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    """Replace `old` (present exactly once) with `new`, and move the file's mtime on, as a later save would."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} in {path.name}"
    path.write_text(text.replace(old, new))
    later = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(later, later))


def every_fingerprint(plan) -> dict:
    """Every record's plan fingerprint (cells per provider, dtype and phase; integration per dtype; benchmarks per
    dtype and phase) and every implementation's."""
    out = {}
    for provider, dtype, phase in itertools.product(("", *dict.fromkeys((*plan.providers, *plan.baselines))),
                                                    plan.matrix["dtype"], PHASES):
        out["cells", provider, dtype, phase] = plan_fingerprint(plan, "cells", provider, dtype, phase=phase)
    for dtype, phase in itertools.product(plan.matrix["dtype"], PHASES):
        out["integration", dtype, phase] = plan_fingerprint(plan, "integration", dtype=dtype, route=plan.vllm.route,
                                                            phase=phase)
        out["benchmarks", dtype, phase] = plan_fingerprint(plan, "benchmarks", dtype=dtype, phase=phase,
                                                           sizes={"hidden": 4096, "num_tokens": 64})
    for provider in ("", *dict.fromkeys(("native", "compiled", "vllm", *plan.baselines))):
        out["implementation", provider] = implementation_fingerprint(plan, provider)
    return out


def changed(before: dict, after: dict) -> set:
    return {key for key in before if before[key] != after[key]}


def test_fingerprints_are_twelve_hex_digits_and_stable(tmp_path):
    """The same plan loaded twice gives the same fingerprints, each 12 hex digits; a section not known is an error."""
    plan = load_plan(copy_tree(tmp_path) / "plan.yaml")
    first = every_fingerprint(plan)
    assert first == every_fingerprint(load_plan(tmp_path / "plan.yaml"))
    assert all(len(v) == 12 and int(v, 16) >= 0 for v in first.values())
    with pytest.raises(ValueError, match="section"):
        plan_fingerprint(plan, "numerics")


def test_comments_docstrings_and_reformatting_of_the_kernel_change_nothing(tmp_path):
    """A comment, a docstring and a reformat of the kernel's module leave every fingerprint as it was."""
    root = copy_tree(tmp_path)
    before = every_fingerprint(load_plan(root / "plan.yaml"))
    module = root / "kernels" / "rms_norm.py"
    edit(module, "# A row whose block would exceed", "# (edited) A row whose block would exceed")
    edit(module, '"""RMSNorm: out = x', '"""RMSNorm, its docstring edited: out = x')
    edit(module, "CHUNK_BYTES = 8192", "CHUNK_BYTES = (\n    8192\n)\n\n")
    edit(module, "TWO_PASS_BYTES = 192 << 20", "TWO_PASS_BYTES = 192<<20  # bytes")
    edit(root / "kernels" / "host.py", "def cdiv(", "# a helper\ndef cdiv(")
    assert every_fingerprint(load_plan(root / "plan.yaml")) == before


def test_editing_the_kernels_code_changes_its_implementation_only(tmp_path):
    """A code edit in the kernel's module changes the kernel's implementation fingerprint (and, the reference being
    in the same module, native's), not vLLM's kernel's nor any plan fingerprint; an edit in a module
    it imports (kernels.host) counts too."""
    root = copy_tree(tmp_path)
    before = every_fingerprint(load_plan(root / "plan.yaml"))
    edit(root / "kernels" / "rms_norm.py", "CHUNK_BYTES = 8192", "CHUNK_BYTES = 16384")
    after = every_fingerprint(load_plan(root / "plan.yaml"))
    assert changed(before, after) == {("implementation", ""), ("implementation", "native"),
                                      ("implementation", "compiled")}
    edit(root / "kernels" / "host.py", "def cdiv(a: int, b: int) -> int:", "def cdiv(a: int, b: int = 1) -> int:")
    again = every_fingerprint(load_plan(root / "plan.yaml"))
    assert again[("implementation", "")] != after[("implementation", "")]
    assert again[("implementation", "vllm")] == before[("implementation", "vllm")]


def test_editing_the_kernel_leaves_a_named_baseline_in_another_module_current(tmp_path):
    """int8_linear_row: editing kernels/int8_linear.py changes the kernel's and cublas's (same module) implementation
    fingerprints, not machete's (kernels/int8_linear_vllm.py); editing machete's module changes machete's alone; each
    changes the benchmark's."""
    root = copy_tree(tmp_path)
    path = root / "kernels" / "plans" / "int8_linear_row.yaml"
    baselines = ("native", "compiled", "cublas", "machete")
    before = every_fingerprint(load_plan(path))
    bench = benchmark_fingerprint(load_plan(path), baselines)
    edit(root / "kernels" / "int8_linear.py", "BLOCK_N = 64", "BLOCK_N = 128")
    after = every_fingerprint(load_plan(path))
    assert changed(before, after) == {("implementation", p) for p in ("", "native", "compiled", "cublas")}
    assert benchmark_fingerprint(load_plan(path), baselines) != bench
    bench = benchmark_fingerprint(load_plan(path), baselines)
    edit(root / "kernels" / "int8_linear_vllm.py", "import os\n", "import os\n\nEXTRA = 1\n")
    again = every_fingerprint(load_plan(path))
    assert changed(after, again) == {("implementation", "machete")}
    assert benchmark_fingerprint(load_plan(path), baselines) != bench


def test_plan_comments_descriptions_models_and_rules_change_nothing(tmp_path):
    """A comment, op.description, benchmark.models, an exclude rule's reason, a reformat of a section and the words
    of vLLM's kernel's switch leave every record's fingerprint as it was."""
    root = copy_tree(tmp_path)
    path = root / "plan.yaml"
    before = every_fingerprint(load_plan(path))
    edit(path, "# The default plan", "# A comment added\n# The default plan")
    edit(path, "Root-mean-square layer norm over", "RMS norm over")
    edit(path, '"hidden=8192": Llama-3-70B', '"hidden=8192": Llama-3.1-70B')
    edit(path, "why: \"memcheck on bf16 cells: the same", "why: \"memcheck on bf16 cells only: the same")
    edit(path, "tp: {kind: trivial}", "tp:\n  kind: trivial\n")
    edit(path, 'runs_for: "RMSNorm without a residual', 'runs_for: "RMSNorm (no residual)')
    edit(path, "role: [baseline, audited]", "role:\n      - baseline\n      - audited")
    assert every_fingerprint(load_plan(path)) == before


def test_a_dtypes_tolerance_changes_that_dtypes_cells_only(tmp_path):
    """A bf16 tolerance (other than vLLM IR's default, which bf16 cells used before) changes the fingerprint of bf16
    cells, of every provider, and of bf16 vLLM items and benchmarks; fp16 and fp32 records stay current."""
    root = copy_tree(tmp_path)
    path = root / "plan.yaml"
    before = every_fingerprint(load_plan(path))
    edit(path, "  fp16: {atol: 1.0e-2, rtol: 2.0e-3}", "  fp16: {atol: 1.0e-2, rtol: 2.0e-3}\n"
                                                       "  bf16: {atol: 2.0e-2, rtol: 2.0e-2}")
    after = every_fingerprint(load_plan(path))
    assert changed(before, after) == {key for key in before if key[0] != "implementation" and "bf16" in key}
    assert ("cells", "vllm", "bf16", "decode") in changed(before, after)


def test_the_same_tolerance_as_vllm_irs_default_changes_nothing(tmp_path):
    """The tolerance a cell used is what counts: stating vLLM IR's bf16 default in the plan changes no record."""
    root = copy_tree(tmp_path)
    path = root / "plan.yaml"
    before = every_fingerprint(load_plan(path))
    edit(path, "  fp16: {atol: 1.0e-2, rtol: 2.0e-3}", "  fp16: {atol: 1.0e-2, rtol: 2.0e-3}\n"
                                                       "  bf16: {atol: 1.0e-3, rtol: 1.6e-2}")
    assert every_fingerprint(load_plan(path)) == before


def test_a_providers_entry_changes_its_own_records_only(tmp_path):
    """A named baseline's contract changes that baseline's cells and the benchmarks (which time it), not the kernel's
    cells or another baseline's; its `setting` and `title` (words for the decision) and which is the `default`
    (decided at render) change nothing. vLLM's kernel's dtypes change
    the vllm provider's cells and the vLLM items, not the kernel's cells."""
    root = copy_tree(tmp_path)
    path = root / "kernels" / "plans" / "int8_linear_row.yaml"
    before = every_fingerprint(load_plan(path))
    edit(path, 'setting: "a W8A16 checkpoint', 'setting: "a W8A16 (int8 weight-only) checkpoint')
    edit(path, "  machete:\n", "  machete:\n    title: \"vLLM's machete\"\n")  # words too
    edit(path, "  cublas:\n", "  cublas:\n    role: [baseline, default]\n")  # what the decisions weigh against
    assert every_fingerprint(load_plan(path)) == before
    edit(path, "    prepare: kernels.int8_linear_vllm:machete_prepack\n",
         "    prepare: kernels.int8_linear_vllm:machete_prepack\n    contract: {dtypes: [fp16, bf16]}\n")
    after = every_fingerprint(load_plan(path))
    assert {key[:2] for key in changed(before, after)} == {("cells", "machete"), ("benchmarks", "fp16"),
                                                           ("benchmarks", "bf16"), ("benchmarks", "fp32")}

    path = root / "plan.yaml"
    before = every_fingerprint(load_plan(path))
    edit(path, "    name: rms_norm            # torch.ops._C.rms_norm",
         "    name: rms_norm            # torch.ops._C.rms_norm\n"
         "    contract: {dtypes: [bf16, fp16], why: 16-bit only}")
    after = every_fingerprint(load_plan(path))
    assert {key[:2] for key in changed(before, after)} == {("cells", "vllm")} | {
        ("integration", dtype) for dtype in ("fp16", "bf16", "fp32")} | {
        ("benchmarks", dtype) for dtype in ("fp16", "bf16", "fp32")}


def test_a_record_of_other_sizes_or_phase_has_its_own_fingerprint(tmp_path):
    """A benchmark shape's sizes and phase are part of its fingerprint; the benchmark's byte model is too (a record
    stores the bytes its run computed from it), and a kernel contract keeps apart the kernel's cells and vLLM's."""
    root = copy_tree(tmp_path)
    path = root / "plan.yaml"
    plan = load_plan(path)
    shape = dict(section="benchmarks", dtype="bf16", phase="decode", sizes={"hidden": 4096, "num_tokens": 8})
    assert plan_fingerprint(plan, **shape) != plan_fingerprint(plan, **{**shape, "sizes": {"hidden": 8192,
                                                                                          "num_tokens": 8}})
    assert plan_fingerprint(plan, **shape) != plan_fingerprint(plan, **{**shape, "phase": "prefill"})
    edit(path, "  prefill: [2048, 8192, 32768]",
         "  prefill: [2048, 8192, 32768]\n  bytes: 2 * num_tokens * hidden * act_bytes + hidden * act_bytes")
    assert plan_fingerprint(load_plan(path), **shape) != plan_fingerprint(plan, **shape)
    kernel_cell, vllm_cell = (plan_fingerprint(plan, "cells", p, "bf16", phase="decode") for p in ("", "vllm"))
    edit(path, "  outputs: [out]", "  outputs: [out]\n  contract: {contiguous: [x]}")
    edited = load_plan(path)
    assert plan_fingerprint(edited, "cells", "", "bf16", phase="decode") != kernel_cell
    assert plan_fingerprint(edited, "cells", "vllm", "bf16", phase="decode") == vllm_cell


def test_code_not_found_here_is_unknown(tmp_path):
    """A kernel or named baseline in a package not installed here fingerprints as "unknown" (cannot tell: not
    stale), and so does a benchmark timing it; the others stay known."""
    root = copy_tree(tmp_path)
    path = root / "plan.yaml"
    edit(path, "  compiled: {}\n", "  compiled: {}\n  theirs: {path: 'not_installed_pkg.ops:rms_norm'}\n")
    plan = load_plan(path)
    assert implementation_fingerprint(plan, "theirs") == UNKNOWN
    assert implementation_fingerprint(plan, "no such provider") == UNKNOWN
    assert implementation_fingerprint(plan, "") != UNKNOWN
    assert UNKNOWN not in benchmark_fingerprint(plan, ("native", "compiled", "vllm"))
    assert f"theirs={UNKNOWN}" in benchmark_fingerprint(plan, ("native", "compiled", "vllm", "theirs"))
    edit(path, "kernel: kernels.rms_norm:rms_norm ", "kernel: not_installed_pkg.ops:rms_norm ")
    assert implementation_fingerprint(load_plan(path), "") == UNKNOWN


def test_relative_imports_are_followed(tmp_path):
    """A kernel package's relative imports (`from . import helper`, `from .sub import f`) are part of the kernel's
    implementation: an edit there changes it; its imports of other packages (torch) are not followed."""
    root = copy_tree(tmp_path)
    pkg = root / "mykernels"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("SCALE = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from ..helper import SCALE\n")
    (pkg / "sub" / "util.py").write_text("def f(x):\n    return x\n")
    (pkg / "op.py").write_text("import torch\n\nfrom . import helper\nfrom .sub.util import f\n\n\n"
                               "def rms_norm(out, x, weight, eps):\n    out.copy_(f(x) * helper.SCALE)\n")
    path = root / "plan.yaml"
    edit(path, "kernel: kernels.rms_norm:rms_norm ", "kernel: mykernels.op:rms_norm ")
    first = implementation_fingerprint(load_plan(path), "")
    edit(pkg / "sub" / "util.py", "return x", "return x + 0")
    second = implementation_fingerprint(load_plan(path), "")
    edit(pkg / "helper.py", "SCALE = 1", "SCALE = 2")
    third = implementation_fingerprint(load_plan(path), "")
    assert UNKNOWN not in (first, second, third) and len({first, second, third}) == 3


def test_bundled_plans_fingerprint_without_importing_their_code():
    """Every bundled plan (plan.yaml, kernels/plans, tests/thirdparty) fingerprints every record; its kernel's and
    its named baselines' implementations are found here (not "unknown"), Liger-Kernel's module among them, in a
    process that imports neither torch nor the plans' code nor Liger-Kernel."""
    script = f"""
import sys
from harness.plan.load import load_plan
from harness.results import fingerprints as fp
paths = {[str(p) for p in BUNDLED]!r}
for path in paths:
    plan = load_plan(path)
    for name in ("", *(n for n in plan.baselines if plan.implementation(n).path)):
        assert fp.implementation_fingerprint(plan, name) != fp.UNKNOWN, (path, name)
liger = load_plan(paths[-1]).model_copy(update={{"op": load_plan(paths[-1]).op.model_copy(
    update={{"kernel": "liger_kernel.ops.rms_norm:rms_norm_forward"}})}})
assert fp.implementation_fingerprint(liger, "") != fp.UNKNOWN
print(sorted(m for m in ("torch", "triton", "numpy", "vllm", "kernels", "liger_kernel", "fla", "tests")
             if m in sys.modules))
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_every_bundled_record_fingerprints():
    """Every record of every bundled plan (each cell of each provider, each benchmark shape, each vLLM item) gets its
    plan and implementation fingerprints."""
    for path in BUNDLED:
        plan = load_plan(path)
        for cell in every_cell(plan):
            assert len(plan_fingerprint(plan, "cells", cell.provider, cell.dtype, phase=cell.phase)) == 12
            assert implementation_fingerprint(plan, cell.provider)
        for phase, counts in plan.benchmark.shapes().items():
            for n, dtype in itertools.product(counts, plan.matrix["dtype"]):
                plan_fingerprint(plan, "benchmarks", dtype=dtype, phase=phase, sizes={"num_tokens": n})
                assert "kernel=" in benchmark_fingerprint(plan, plan.baselines)
        for dtype, phase in itertools.product(plan.matrix["dtype"], PHASES):
            assert len(plan_fingerprint(plan, "integration", dtype=dtype, route=plan.vllm.route, phase=phase)) == 12


def test_a_benchmark_counts_the_baselines_the_plan_times():
    """A benchmark record lists every built-in implementation (vllm too, where the plan times no vllm baseline):
    those the plan does not time count for nothing, so paged_attention's benchmarks are not "unknown" for lacking
    vLLM's kernel, and a baseline the plan does not list changes nothing."""
    plan = load_plan(ROOT / "kernels" / "plans" / "paged_attention.yaml")
    assert implementation_fingerprint(plan, "vllm") == UNKNOWN
    every = benchmark_fingerprint(plan, ("kernel", "native", "compiled", "vllm"))
    assert UNKNOWN not in every and every == benchmark_fingerprint(plan, ("kernel", "native", "compiled"))
    assert every != benchmark_fingerprint(plan, ("kernel",))

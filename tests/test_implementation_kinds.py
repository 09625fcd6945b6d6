"""The op's implementations as one map (`implementations:`): a kind of implementation is one entry in three harness
modules, shown by `torch_ops` (a library's registered torch.ops kernel, FlashInfer's kind) run through the cells and
the benchmark; the keys plans wrote before load into the same map, with a warning that shows the new form."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from harness.plan.load import load_plan
from harness.plan.model import Plan, PlanError
from harness.plan.yaml_lines import parse
from harness.rendering.plan_words import provider_words, timed_words
from harness.runtime.bench.implementations import implementations
from harness.runtime.bench.specs import bench_specs
from tests.plans import cpu_machine_only, rms_norm_plan
from tests.test_plan_mutations import canon

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = {"kind": "torch_ops", "name": "testlib::rms_norm", "library": "tests.torch_ops_library",
           "args": ["out", "x", "weight", "eps"], "role": ["baseline", "audited"]}


def plan_with_testlib(folder: Path, **entry) -> Path:
    """The small RMSNorm plan with testlib's kernel beside it (`entry` changes its fields; None leaves one out)."""
    testlib = {k: v for k, v in {**LIBRARY, **entry}.items() if v is not None}
    return rms_norm_plan(folder, benchmark={"decode": [4]},
                         implementations={"native": {}, "compiled": {}, "testlib": testlib})


def test_a_kind_of_implementation_is_one_entry_in_three_modules():
    """Where a kind is named in the harness: its fields and words (plan), its resolver (runtime), its words on the
    page (rendering). No other module branches on a kind or on vLLM's implementation by name."""
    named = {p.relative_to(ROOT).as_posix() for p in (ROOT / "harness").rglob("*.py") if "torch_ops" in p.read_text()}
    assert named == {"harness/plan/implementations.py", "harness/runtime/implementations.py",
                     "harness/rendering/plan_words.py"}
    outside = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "harness").rglob("*.py")
               if not p.relative_to(ROOT / "harness").as_posix().startswith(("vllm/", "vllm_facts/"))
               and p.name != "implementations.py"
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"""(==|!=|\bin)\s*["']vllm["']|["']vllm["']\s*(==|!=|\bin\b)""", line)]
    assert outside == []


def test_a_torch_ops_kernel_is_called_with_the_arguments_its_entry_picks(tmp_path):
    plan = load_plan(plan_with_testlib(tmp_path))
    assert plan.baselines == ("native", "compiled", "testlib") and plan.providers == ("testlib",)
    assert provider_words(plan, "testlib") == \
        "testlib, `torch.ops.testlib.rms_norm` (registered by `tests.torch_ops_library`)"
    assert timed_words(plan, "testlib") == "`torch.ops.testlib.rms_norm` (registered by `tests.torch_ops_library`)"
    spec = next(s for s in bench_specs(plan, "cpu") if s.graph_mode == "eager")
    impls = implementations(plan, "cpu", spec)
    assert callable(impls["testlib"]) and impls["vllm"] == "not in the plan's implementations as a baseline"


@pytest.mark.parametrize("entry, reason", [
    ({"library": "not_installed_lib"}, "not_installed_lib cannot be imported here: ModuleNotFoundError"),
    ({"name": "testlib::no_such_op"}, "torch.ops.testlib.no_such_op is not registered here (after importing "
                                      "tests.torch_ops_library)"),
])
def test_a_torch_ops_kernel_that_cannot_load_here_is_not_run_with_why(tmp_path, entry, reason):
    plan = load_plan(plan_with_testlib(tmp_path, **entry))
    spec = next(s for s in bench_specs(plan, "cpu") if s.graph_mode == "eager")
    assert implementations(plan, "cpu", spec)["testlib"].startswith(reason)


@pytest.mark.parametrize("entry, field, words", [
    ({"name": "rms_norm"}, "implementations.testlib.name", "'namespace::name', as torch.ops registers it"),
    ({"args": None}, "implementations.testlib", "args for a torch_ops implementation"),
    ({"args": ["out", "x", "w", "eps"]}, "implementations.testlib.args[2]", "an argument of the plan"),
    ({"path": "kernels.rms_norm:rms_norm"}, "implementations.testlib.path", "a field of a torch_ops implementation"),
    ({"kind": "vllm"}, "implementations.testlib.kind", "import or torch_ops (vllm is the entry named vllm)"),
    ({"role": ["audited", "audited"]}, "implementations.testlib.role[1]", "values without repeats"),
])
def test_a_torch_ops_entry_is_checked_at_its_line(tmp_path, entry, field, words):
    path = plan_with_testlib(tmp_path, **entry)
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert err.value.field == field and words in str(err.value), str(err.value)
    assert err.value.line is not None


@cpu_machine_only
def test_a_wrong_torch_ops_kernel_fails_its_own_cells_and_a_right_one_passes(pytester, monkeypatch):
    """Audited: the library's kernel runs through the kernel's cells. 1% off, its cell fails with the value it got
    wrong, on its own page section, and the run's verdict stays the kernel's."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    reports = pytester.path / "reports"
    for name, status in (("testlib::rms_norm", "passed"), ("testlib::rms_norm_scaled", "failed")):
        plan = plan_with_testlib(pytester.path, name=name)
        result = pytester.runpytest_subprocess(
            "-p", "harness.plugin", "--plan", str(plan), "--isolation", "none", "--examples", "4", "--reports-dir",
            str(reports), "-p", "no:cacheprovider", "--plan-profile", "ci")
        assert result.ret == 0, result.stdout.str()
        cells = json.loads((reports / "rms_norm" / "results" / "cpu.json").read_text())["cells"]
        rec = cells["decode-fp32-tp1-eager-cpu-testlib"]
        assert rec["status"] == status and cells["decode-fp32-tp1-eager-cpu"]["status"] == "passed", rec
        page = (reports / "rms_norm" / "PLAN.md").read_text()
        assert "## What testlib accepts" in page and "`torch.ops.testlib" in page
    assert rec["reason"].startswith("output 'out'"), rec


# ---------------------------------------------------------------- the keys plans wrote before


OLD = {"benchmark": {"decode": [4], "baselines": ["native", "compiled", "vllm",
                                                   {"into": {"path": "tests.baselines:rms_norm_into",
                                                             "setting": "a flag"}}]},
       "vllm": {"kernel": {"name": "rms_norm", "args": ["out", "x", "weight", "eps"], "dtypes": ["fp32"],
                           "why": "fp32 here"}},
       "providers": ["vllm"]}


def test_the_old_keys_load_into_implementations_with_a_warning_showing_the_new_form(tmp_path):
    old = rms_norm_plan(tmp_path, name="old.yaml", **OLD)
    plan = load_plan(old)
    assert plan.baselines == ("native", "compiled", "vllm", "into") and plan.providers == ("vllm",)
    assert plan.vllm_kernel.contract.dtypes == ("fp32",) and plan.implementation("into").setting == "a flag"
    (warning,) = [str(w) for w in plan.warnings if "implementations" in str(w)]
    line = next(i for i, text in enumerate(old.read_text().splitlines(), 1) if "baselines:" in text)
    assert warning.startswith(f"{old}:{line}: benchmark.baselines: expected `implementations:` in place of "
                              "benchmark.baselines, vllm.kernel, providers (deprecated: read into it for now); write "
                              "implementations: {native: {}, compiled: {}, vllm: {")
    # the form it shows, written, is the same plan without the warning
    shown = warning.split("; write ", 1)[1].rsplit("; found", 1)[0]
    data = yaml.safe_load(old.read_text())
    for key in ("providers",):
        del data[key]
    del data["benchmark"]["baselines"], data["vllm"]["kernel"]
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump({**data, **yaml.safe_load(shown)}, sort_keys=False))
    rewritten = load_plan(new)
    assert canon(rewritten) == canon(plan) and not [w for w in rewritten.warnings if "implementations" in str(w)]


def test_an_error_in_an_old_key_is_at_its_own_line(tmp_path):
    old = rms_norm_plan(tmp_path, name="old.yaml", **{**OLD, "vllm": {"kernel": {"name": "rms_norm",
                                                                                "args": ["out", "x", "w", "eps"]}}})
    line = next(i for i, text in enumerate(old.read_text().splitlines(), 1) if "args: [out, x, w, eps]" in text)
    with pytest.raises(PlanError) as err:
        load_plan(old)
    assert err.value.line == line and err.value.field == "implementations.vllm.args[2]", str(err.value)


def test_a_plan_validated_from_data_reads_the_old_keys_too(tmp_path):
    old = rms_norm_plan(tmp_path, name="old.yaml", **OLD)
    data, _ = parse(old.read_text())
    assert canon(Plan.model_validate(data)) == canon(load_plan(old))

"""Verdicts per SM and TP size, the cross-op page at a glance, and vLLM's own defaults decided, on synthetic results
(the helpers that write them are test_report's)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from harness.decisions.recommendations import ENABLE, INDUCTOR, VLLM_PROFILES, Recommendation
from harness.decisions.speedups import Interval
from harness.rendering.defaults import regime_summary
from harness.rendering.overview import render_overview
from harness.plan.load import load_plan
from harness.vllm_facts.defaults import DEFAULTS, INDUCTOR_OFF, INDUCTOR_ON, vllm_default
from tests.plans import small_plan
from tests.test_report import bench, cell, machine, render, write_results

FAST = {"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0),
        "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0, 45.0)}


def tp_plan(tmp_path: Path, tp=(1, 2)):
    """rms_norm on decode and prefill, bf16, eager, sm90, at the TP sizes given."""
    return small_plan(tmp_path, name="tp.yaml", op={"replaces": None}, matrix={"tp": list(tp)})


def one_gpu_results(op_dir: Path, tp2: str = "not_run", benchmarks=FAST) -> None:
    """What a one-GPU H200 records: tp1 cells ran; tp2 cells get `tp2` (not run: too few GPUs, by default)."""
    cells = {}
    for phase in ("decode", "prefill"):
        cells[f"{phase}-bf16-tp1-eager-sm90"] = cell(f"{phase}-bf16-tp1-eager-sm90", "passed")
        reason = "needs 2 GPUs; this machine has 1" if tp2 == "not_run" else ""
        cells[f"{phase}-bf16-tp2-eager-sm90"] = cell(f"{phase}-bf16-tp2-eager-sm90", tp2, reason=reason)
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", machine("sm90", "h200"), cells, benchmarks)


def verdict_lines(text: str) -> dict[str, str]:
    """The header's verdict lines: where (e.g. "sm90 tp2") -> the line."""
    head = text.split("\n## ", 1)[0]
    return {line[4:].split(": **", 1)[0]: line for line in head.splitlines() if line.startswith("  - ")}


def verdict_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("- **Verdict:**"))


# ---------------------------------------------------------------- verdicts per SM and TP size


def test_a_one_gpu_machine_decides_tp1_while_tp2_is_not_run_here(tmp_path):
    op_dir = tmp_path / "a" / "rms_norm"
    one_gpu_results(op_dir)
    text = render(tp_plan(tmp_path), op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90 tp1: go · sm90 tp2: not run here"
    lines = verdict_lines(text)
    assert "**go**" in lines["sm90 tp1"]
    assert "**not run here**" in lines["sm90 tp2"] and "needs 2 GPUs; this machine has 1" in lines["sm90 tp2"]
    decided = text.split("\n## Decisions and verdict\n", 1)[1]
    assert "| verdict on sm90 tp2 " in decided and "| verdict on sm90 tp1 " in decided


def test_tp_sizes_that_agree_give_one_verdict_and_a_failure_blocks_its_tp_size_only(tmp_path):
    op_dir = tmp_path / "a" / "rms_norm"
    one_gpu_results(op_dir, tp2="passed")  # an eight-GPU machine ran everything
    assert verdict_line(render(tp_plan(tmp_path), op_dir)) == "- **Verdict:** sm90: go"
    op_dir = tmp_path / "b" / "rms_norm"
    one_gpu_results(op_dir, tp2="failed")
    text = render(tp_plan(tmp_path), op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90 tp2: blocked · sm90 tp1: go"
    assert "2 failed" in verdict_lines(text)["sm90 tp2"]
    op_dir = tmp_path / "c" / "rms_norm"
    one_gpu_results(op_dir, benchmarks={"decode-64": FAST["decode-64"]})  # prefill not benchmarked yet
    text = render(tp_plan(tmp_path), op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90 tp1: incomplete · sm90 tp2: not run here"
    assert "no benchmark decision yet for prefill-sized bf16" in verdict_lines(text)["sm90 tp1"]


def test_several_tp_sizes_not_run_here_are_named_once_per_sm(tmp_path):
    plan = tp_plan(tmp_path, tp=(1, 2, 4))
    op_dir = tmp_path / "a" / "rms_norm"
    cells = {}
    for phase in ("decode", "prefill"):
        cells[f"{phase}-bf16-tp1-eager-sm90"] = cell(f"{phase}-bf16-tp1-eager-sm90", "passed")
        for n in (2, 4):
            cells[f"{phase}-bf16-tp{n}-eager-sm90"] = cell(f"{phase}-bf16-tp{n}-eager-sm90", "not_run",
                                                            reason=f"needs {n} GPUs; this machine has 1")
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", machine("sm90", "h200"), cells, FAST)
    text = render(plan, op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90 tp1: go · sm90 tp2, tp4: not run here"
    lines = verdict_lines(text)  # each TP size keeps its own reason
    assert "needs 2 GPUs" in lines["sm90 tp2"] and "needs 4 GPUs" in lines["sm90 tp4"]


# ---------------------------------------------------------------- vLLM's own defaults, decided

ROOT = Path(__file__).resolve().parents[1]


def silu_bench(phase: str, tokens: int, vllm: float, native: float, compiled: float) -> dict:
    """A benchmark of silu_and_mul's plan; the kernel under test timed as fast as vLLM's (not what is decided here)."""
    rec = bench(phase, tokens, vllm, native, compiled, vllm)
    rec["sizes"] = {"intermediate": 14336}
    return rec


def vllms_silu(tmp_path: Path):
    """silu_and_mul's plan with an H200's benchmarks of vLLM's kernel (its `vllm` baseline): decode faster than
    Inductor's code and native eager, prefill slower than Inductor's code and faster than native eager."""
    plan = load_plan(ROOT / "kernels" / "plans" / "silu_and_mul.yaml")
    reports = tmp_path / "reports"
    write_results(reports / plan.op.name, "sm90-nvidia-h200.json", plan.op.name, "run-h200", machine("sm90", "h200"),
                  {},
                  {"decode-64": silu_bench("decode", 64, 5.0, 9.0, 8.0),
                   "prefill-2048": silu_bench("prefill", 2048, 60.0, 90.0, 30.0)})
    return plan, reports


def defaults_table(text: str) -> dict:
    """The overview's defaults table: (kernel, SM, profile) -> {column: cell}."""
    part = text.split("## vLLM's defaults, as measured here\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in part.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    rows = {}
    for line in lines[2:]:
        if line.startswith(("|--", "| vLLM's kernel")):
            break  # the second table: how to turn each kernel on or off
        cells = dict(zip(head, (c.strip() for c in line.split("|")[1:-1])))
        rows[(cells["vLLM's kernel"], cells["SM"], cells["vLLM profile"])] = cells
    return rows


def test_the_defaults_table_sets_vllms_default_beside_the_measured_decision(tmp_path):
    plan, reports = vllms_silu(tmp_path)
    text, _ = render_overview([plan], reports)
    rows = defaults_table(text)
    kernel = "`torch.ops._C.silu_and_mul`"
    on = rows[(kernel, "sm90", "Inductor on")]  # vLLM leaves SiluAndMul to Inductor; its kernel wins decode
    assert on["vLLM's default"] == "**off** (custom_ops none)"
    assert on["from"] == "`vllm/config/vllm.py VllmConfig.__post_init__ (custom_ops base mode)`"
    assert "decode-sized: **on**: bf16 1.60× (" in on["measured here"]
    assert "prefill-sized: **off**: bf16 0.50× (" in on["measured here"]
    assert on["default vs measured"] == "**disagrees**: measured on for decode-sized bf16"
    off = rows[(kernel, "sm90", "Inductor off")]  # without Inductor vLLM runs its kernel, and it wins everywhere
    assert off["vLLM's default"] == "**on** (custom_ops all)" and off["default vs measured"] == "agrees"
    assert (kernel, "cpu", "Inductor off") not in rows and (kernel, "sm80", "Inductor on") not in rows  # no results
    assert """`--compilation-config '{"custom_ops": ["+silu_and_mul"]}'`""" in text  # how to turn it on, once


def _switches() -> dict:
    """The switch of vLLM's kernel in every bundled plan naming one."""
    plans = (load_plan(p) for p in (ROOT / "plan.yaml", *sorted((ROOT / "kernels" / "plans").glob("*.yaml"))))
    return {plan.vllm_kernel.name: plan.vllm_kernel.switch for plan in plans if plan.vllm_kernel}


def test_every_vllm_kernel_has_a_switch_and_a_default_per_platform_and_profile():
    assert (INDUCTOR_ON, INDUCTOR_OFF) == tuple(profile for profile, _ in VLLM_PROFILES)
    switches = _switches()
    assert len(switches) == 8 and all(switches.values()), switches
    for kernel, switch in switches.items():
        for sm in ("cpu", "sm90", "gfx942"):
            for profile in (INDUCTOR_ON, INDUCTOR_OFF):
                assert vllm_default(switch, sm, profile) is not None, (kernel, sm, profile)


def test_the_defaults_name_files_and_symbols_of_the_installed_vllm():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        pytest.skip("vLLM is not installed here")
    root = Path(spec.origin).parent.parent
    switches = _switches().values()
    sources = {d.source for d in DEFAULTS} | {s.cpu_runs_native for s in switches if s.cpu_runs_native} | \
        {s.note.rpartition("(")[2].rstrip(")").split(",")[0] for s in switches if s.note}
    for source in sorted(sources):
        path, symbol = source.split(" ")[:2]
        text = (root / path).read_text()
        for name in symbol.split("."):  # a class and its method, or a module-level name
            assert re.search(rf"\b{re.escape(name)}\b", text), f"{source}: {name} is not in {path}"


def test_cells_another_sms_machine_could_not_run_are_no_attempt(tmp_path):
    """tp2 cells recorded only by a CPU machine ("needs sm90") leave sm90 tp2 incomplete, not "not run here"."""
    op_dir = tmp_path / "a" / "rms_norm"
    one_gpu_results(op_dir)
    h200 = op_dir / "results" / "sm90-nvidia-h200.json"
    data = json.loads(h200.read_text())
    del data["cells"]["decode-bf16-tp2-eager-sm90"]  # the H200's run did not record it
    h200.write_text(json.dumps(data))
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu"), {
        "decode-bf16-tp2-eager-sm90": cell("decode-bf16-tp2-eager-sm90", "not_run", finished="2026-11-29T11:00:00Z",
                                           reason="needs sm90; this machine is cpu")})
    text = render(tp_plan(tmp_path), op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90 tp1: go · sm90 tp2: incomplete"
    assert "needs sm90; this machine is cpu" in verdict_lines(text)["sm90 tp2"]


def test_a_row_of_the_main_table_names_dtypes_with_the_same_choice_together():
    def rec(dtype, choice, median):
        return Recommendation("sm90", dtype, "decode-sized", "Inductor on", choice, "why", "compiled",
                              Interval(median, median - 0.1, median + 0.1, 1, 1, 0),
                              (("vllm", Interval(1.5, 1.4, 1.6, 1, 1, 0), ""),))
    recs = [rec("fp16", ENABLE, 1.3), rec("bf16", ENABLE, 1.2), rec("fp32", INDUCTOR, 0.9)]
    assert regime_summary(recs, "decode-sized") == (
        "**enable the custom op**: fp16 1.30× (1.20–1.40), bf16 1.20× (1.10–1.30) vs compiled · vllm fp16 1.50× "
        "(1.40–1.60), bf16 1.50× (1.40–1.60); **leave it to Inductor**: fp32 0.90× (0.80–1.00) vs compiled · vllm "
        "1.50× (1.40–1.60)")
    assert regime_summary(recs, "prefill-sized") == "—"

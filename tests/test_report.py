"""The living plan (reports/<op>/PLAN.md): sections, merging, escaping, determinism, verdicts, Mermaid validity."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.rendering import markdown, performance, report
from harness.__main__ import main
from harness.cells.matrix import Cell
from harness.rendering.overview import render_overview, write_overview
from harness.plan.load import load_plan
from harness.rendering.plots import draw_plots
from harness.rendering.report import write_report
from harness.results.stamps import stamp
from harness.results import store
from harness.results.store import FORMAT, VERSION, ResultsError, load, write_atomic
from harness.vllm_facts.names import enable_setting, profile_setting
from tests.plans import read_plan, small_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]
RMS = load_plan(ROOT / "plan.yaml")
FUSED = load_plan(ROOT / "kernels" / "plans" / "fused_add_rms_norm.yaml")
MERMAID_CHECK = ROOT / "tests" / "mermaid_check"
SECTIONS = ["Problem breakdown", "Constraints and assumptions", "High-level design", "Key interfaces",
            "Critical path", "Support matrix", "Performance", "Trade-offs", "Open items", "Decisions and verdict"]
NASTY = "bad | pipe `tick` ``double`` line\nbreak <script>alert(1)</script> # [link](x) *star* _under_ &amp; ; %% \"q\""


# ---------------------------------------------------------------- building results


def machine(sm: str, host: str = "vm", date: str = "2026-11-29T10:00:00Z", commit: str = "abc123def456") -> dict:
    cpu = sm == "cpu"
    return {"sm": sm, "device": "cpu" if cpu else "cuda", "gpu": "x86_64" if cpu else "NVIDIA H200",
            "device_count": 0 if cpu else 1, "cpu_count": 2 if cpu else 16, "host": host, "torch": "2.13.0",
            "triton": "3.9.0", "vllm": None, "cuda": None if cpu else "13.0", "python": "3.11.7",
            "triton_interpreter": cpu, "commit": commit, "date": date}


def cell(cell_id: str, status: str, finished: str = "2026-11-29T10:05:00Z", reason: str = "", **extra) -> dict:
    c = Cell.from_id(cell_id)
    rec = {**c.axes(), "status": status, "reason": reason, "finished": finished, **extra}
    if status in ("passed", "failed", "xfail", "xpass"):
        rec.setdefault("tolerance", {"atol": 1e-3, "rtol": 1.6e-2})
        rec.setdefault("examples", 12)
    return rec


def bench(phase: str, tokens: int, kernel: float, native: float, compiled: float, vllm: float | None = None,
          spread: float = 0.01, sm: str = "sm90", finished: str = "2026-11-29T10:06:00Z") -> dict:
    """A benchmark record as harness/runtime/bench/measure.py writes it: each implementation's median and spread,
    the call's bytes and the copy bandwidth."""
    impls = {}
    for name, us in (("kernel", kernel), ("native", native), ("compiled", compiled), ("vllm", vllm)):
        if us is None:
            impls[name] = {"not_run": "vllm not installed"}
        else:
            impls[name] = {"median_us": us, "q20_us": us * (1 - spread), "q80_us": us * (1 + spread), "launches": 1}
    return {"phase": phase, "dtype": "bf16", "sm": sm, "graph_mode": "cuda_graph", "num_tokens": tokens,
            "sizes": {"hidden": 4096}, "finished": finished, "bytes": tokens * 4096 * 2 * 2, "copy_bw_gbps": 4250.0,
            "impls": impls}


def write_results(op_dir: Path, name: str, op: str, run: str, prov: dict, cells: dict, benchmarks=None) -> Path:
    data = {"format": FORMAT, "version": VERSION, "op": op, "runs": {run: prov},
            "cells": {cid: {**rec, "run": run} for cid, rec in cells.items()},
            "benchmarks": {bid: {**rec, "run": run} for bid, rec in (benchmarks or {}).items()}}
    path = op_dir / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    return path


def passed_sm90(op_dir: Path, benchmarks=None, **overrides) -> None:
    cells = {cid: cell(cid, "passed") for cid in ("decode-bf16-tp1-eager-sm90", "prefill-bf16-tp1-eager-sm90")}
    cells.update(overrides)
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-h200", machine("sm90", "h200"), cells, benchmarks)


def stamp_current(plan, op_dir: Path) -> None:
    """Stamp the records the helpers above wrote without a stamp as a run of today's checks on `plan` would
    (harness.results.stamps): they stand for such runs (tests of stale results stamp their own, or render with
    report.render)."""
    for path in sorted((Path(op_dir) / "results").glob("*.json")):
        try:
            results = load(path)
        except ResultsError:
            continue  # a broken file a test wrote on purpose
        unstamped = [(section, key, rec) for section in store.SECTIONS for key, rec in results.section(section).items()
                     if rec.stamp is None]
        for section, key, rec in unstamped:
            rec.stamp = stamp(plan, rec, Cell.from_id(key).provider if section == "cells" else "")
        if unstamped:
            write_atomic(path, results)


def render(plan, op_dir: Path) -> str:
    """The page of `plan` from the results in `op_dir`, written by the helpers above (so stamped as current)."""
    stamp_current(plan, op_dir)
    path, _ = write_report(plan, op_dir)
    return path.read_text()


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def tables(text: str) -> list[list[str]]:
    """Every Markdown table as its list of lines."""
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found + ([current] if current else [])


def unescaped_pipes(line: str) -> int:
    count, escaped = 0, False
    for ch in line:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "|":
            count += 1
    return count


def marks(text: str, sm: str, tp: int = 1) -> dict:
    """The support matrix of one SM and TP size: (phase, dtype) -> marks per graph mode."""
    part = section(text, "Support matrix").split(f"### {sm}\n", 1)[1].split(f"tp{tp}:\n", 1)[1]
    rows = tables(part)[0][2:]
    return {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
            for line in rows}


def verdict_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("- **Verdict:**"))


def sm_line(text: str, sm: str) -> str:
    """The header's verdict line for one SM (SMs with the same verdict share a line)."""
    head = text.split("\n## ", 1)[0]
    return next(line for line in head.splitlines()
                if line.startswith("  - ") and sm in line[4:].split(": **", 1)[0].split(", "))


# ---------------------------------------------------------------- structure and content


def test_sections_header_and_provenance(tmp_path):
    op_dir = tmp_path / "reports" / "rms_norm"
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu", "laptop", "2026-11-28T09:00:00Z"), {
        "decode-bf16-tp1-eager-cpu": cell("decode-bf16-tp1-eager-cpu", "passed", facts={"token_cap": 8}),
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "not_run",
                                           reason="needs sm90; this machine is cpu"),
    })
    text = render(RMS, op_dir)
    assert text.startswith("# Integration plan: rms_norm\n")
    positions = [text.index(f"\n## {title}\n") for title in SECTIONS]
    assert positions == sorted(positions)
    head = text.split("\n## ", 1)[0]
    for field in ("**Op:**", "**Intent:** drop-in", "**Verdict:** cpu: numerics only · sm80, sm89, sm90, sm100: "
                  "no results", "**Provenance:**"):
        assert field in head
    assert "**numerics only**" in sm_line(text, "cpu") and "1 of 144 cells passed" in sm_line(text, "cpu")
    assert "**no results**" in sm_line(text, "sm90")  # a CPU machine's "needs sm90" does not cover sm90
    prov = next(line for line in head.splitlines() if line.startswith("- **Provenance:**"))
    assert "cpu: laptop (x86_64), commit abc123def456, 2026-11-28T09:00:00Z" in prov
    assert "sm80, sm89, sm90, sm100: no results yet" in prov
    # Dates appear in the provenance line only.
    dated = [line for line in text.splitlines() if re.search(r"\d{4}-\d\d-\d\dT\d\d", line)]
    assert dated == [prov]
    # Problem breakdown and constraints come from the plan.
    assert "Root-mean-square layer norm" in section(text, "Problem breakdown")
    assert "`vllm.model_executor.layers.layernorm:RMSNorm`" in section(text, "Problem breakdown")
    constraints = section(text, "Constraints and assumptions")
    for answer in ("accumulation in fp32", "TP-trivial", "sizes 1, 2, 4, 8", "vLLM IR provider", "cpu, sm80, sm89",
                   "`kernels.rms_norm:rms_norm_ref`", "fp16 atol 0.01 rtol 0.002 (plan)", "laptop",
                   "at most 8 tokens per call"):
        assert answer in constraints, answer


def test_design_interfaces_and_critical_path_come_from_the_plan():
    text, _ = report.render(FUSED, Path("/nonexistent/reports/fused_add_rms_norm"))
    design = section(text, "High-level design")
    assert "```mermaid\nflowchart TD" in design
    assert "vllm.ir.ops.fused_add_rms_norm" in design and "torch.ops.kernels.fused_add_rms_norm" in design
    assert "kernels.fused_add_rms_norm:fused_add_rms_norm" in design and "RMSNorm layer" in design
    interfaces = section(text, "Key interfaces")
    blocks = re.findall(r"```python\n(.*?)```", interfaces, re.S)
    assert len(blocks) == 2
    for block in blocks:
        ast.parse(block)  # every generated code block is valid Python
    assert '"(Tensor(a0!) x, Tensor(a1!) residual, Tensor weight, float eps) -> ()"' in blocks[0]
    assert 'mutates_args=("x", "residual")' in blocks[0]
    # the vLLM plugin module the integration items load through vLLM's plugin loader
    assert "ir_op = ir.ops.fused_add_rms_norm" in blocks[1] and "ir_op.register_impl(PROVIDER" in blocks[1]
    assert '[project.entry-points."vllm.general_plugins"]' in interfaces
    path = section(text, "Critical path")
    assert "```mermaid\nsequenceDiagram" in path
    assert "all-reduce of the row-parallel linear output, before the op" in path  # trivial TP: all-reduce first
    assert "full CUDA graph replay" in path and "piecewise torch.compile" in path


def silu_op(d: int) -> dict:
    """The op section of the bundled silu_and_mul at one size d."""
    return {"name": "silu_and_mul", "intent": "drop-in", "kernel": "kernels.silu_and_mul:silu_and_mul",
            "reference": "kernels.silu_and_mul:silu_and_mul_ref",
            "replaces": "vllm.model_executor.layers.activation:SiluAndMul",
            "args": {"out": {"shape": ["num_tokens", "d"], "dtype": "act", "role": "output"},
                     "x": {"shape": ["num_tokens", "2*d"], "dtype": "act"}},
            "outputs": ["out"], "sizes": {"d": [d]}}


SILU_CUSTOM_OP = {"target": "v1", "route": "custom_op", "layer": "vllm.model_executor.layers.activation:SiluAndMul",
                  "custom_op": "silu_and_mul"}


def test_custom_op_route_and_sharded_tp(tmp_path):
    path = write_plan(tmp_path / "silu.yaml", op=silu_op(8192),
                      matrix={"phase": ["decode"], "dtype": ["bf16"], "tp": [1, 2], "graph_mode": ["eager"],
                              "sm": ["sm90"]},
                      tp={"kind": "sharded", "inputs": {"x": {"shard": 1, "merged": 2}},
                          "outputs": {"out": {"gather": 1}}},
                      vllm=SILU_CUSTOM_OP)
    text, _ = report.render(load_plan(path), tmp_path / "reports" / "silu_and_mul")
    interfaces = section(text, "Key interfaces")
    assert 'CustomOp.register_oot(PluginSiluAndMul, name="SiluAndMul")' in interfaces
    assert "out = torch.empty((x.shape[-2], (x.shape[-1] // 2)), dtype=x.dtype, device=x.device)" in interfaces
    for block in re.findall(r"```python\n(.*?)```", interfaces, re.S):
        ast.parse(block)
    assert "all-gather out on dim 1" in section(text, "Critical path")
    assert "custom_ops +SiluAndMul" in section(text, "High-level design")


def test_generated_custom_op_registers_and_runs(tmp_path):
    """The custom-op blocks of the report are real code: they register, pass opcheck and match the reference,
    for an op that writes an output argument and for one that returns its output (fake from the reference)."""
    args = read_plan(ROOT / "plan.yaml")["op"]["args"]
    del args["out"]  # the reference as the kernel: it returns y
    functional = write_plan(tmp_path / "functional.yaml", ROOT / "plan.yaml",
                            op={"name": "rms_norm_functional", "kernel": "kernels.rms_norm:rms_norm_ref", "args": args,
                                "outputs": ["y"]}, implementations={"vllm": None})  # vLLM's writes `out`
    blocks = []
    for plan in (RMS, load_plan(functional)):
        text, _ = report.render(plan, tmp_path / "reports" / plan.op.name)
        blocks.append(re.findall(r"```python\n(.*?)```", section(text, "Key interfaces"), re.S)[0])
    assert "-> Tensor" in blocks[1] and "register_fake" in blocks[1]
    script = "\n".join(blocks) + """
import torch
from kernels.rms_norm import rms_norm_ref
x = torch.randn(3, 64, dtype=torch.float32)
w = torch.randn(64, dtype=torch.float32)
out = torch.empty_like(x)
torch.library.opcheck(torch.ops.kernels.rms_norm.default, (out, x, w, 1e-6))
torch.ops.kernels.rms_norm(out, x, w, 1e-6)
torch.testing.assert_close(out, rms_norm_ref(x, w, 1e-6))
torch.library.opcheck(torch.ops.kernels.rms_norm_functional.default, (x, w, 1e-6))
torch.testing.assert_close(torch.ops.kernels.rms_norm_functional(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_support_matrix_marks_legend_and_details(tmp_path):
    op_dir = tmp_path / "reports" / "rms_norm"
    cells = {
        "decode-bf16-tp1-eager-cpu": cell("decode-bf16-tp1-eager-cpu", "passed"),
        "decode-fp16-tp1-eager-cpu": cell(
            "decode-fp16-tp1-eager-cpu", "failed", reason="output 'out': max abs error 0.5",
            error={"max_abs": 0.5, "max_rel": 0.1, "max_ulp": 3, "output": "out"},
            minimal_example="num_tokens=1 hidden=2048 scale=normal seed=0",
            repro="pytest --plan plan.yaml --plan-profile dev -k 'decode-fp16-tp1-eager-cpu'"),
        "decode-fp32-tp1-eager-cpu": cell("decode-fp32-tp1-eager-cpu", "xfail", reason="boom",
                                          expectation="expected to fail by the plan (line 3): tracked upstream"),
        "prefill-fp32-tp1-eager-cpu": cell("prefill-fp32-tp1-eager-cpu", "xpass",
                                           expectation="expected to fail by the plan (line 3): tracked upstream"),
        # Excluded by an earlier version of the plan: the plan no longer excludes it, so it has no result yet.
        "prefill-bf16-tp1-eager-cpu": cell("prefill-bf16-tp1-eager-cpu", "excluded",
                                           reason="excluded by the plan (line 9): no reason"),
        # Excluded by the plan, stored with the line its rule stood on when it ran: the page names today's line.
        "prefill-fp16-tp1-memcheck-cpu": cell("prefill-fp16-tp1-memcheck-cpu", "excluded",
                                              reason="excluded by the plan (line 9): no reason"),
        "decode-bf16-tp1-cuda_graph-cpu": cell("decode-bf16-tp1-cuda_graph-cpu", "not_run",
                                               reason="cuda_graph needs a CUDA device; this machine has none"),
        "decode-fp16-tp1-cuda_graph-cpu": cell("decode-fp16-tp1-cuda_graph-cpu", "not_run",
                                               reason="cuda_graph needs a CUDA device; this machine has none"),
        "decode-bf16-tp1-eager-sm75": cell("decode-bf16-tp1-eager-cpu", "passed"),  # not a plan cell
    }
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu"), cells)
    text = render(RMS, op_dir)
    matrix = section(text, "Support matrix")
    assert "✅ passed" in matrix and "⏭ not run here" in matrix and "❗ unexpected pass" in matrix  # legend
    assert "sm75" not in text and "Not shown: 2 stored records for cells" in matrix
    i, rule = next((i, r) for i, r in enumerate(RMS.exclude) if r.matches({"graph_mode": "memcheck", "dtype": "fp16"}))
    assert "(line 9)" not in text and f"excluded by the plan (line {RMS.where(f'exclude[{i}]')}): {rule.why}" in text
    overview = tables(matrix)[0]
    assert [c.strip() for c in overview[0].split("|")[2:-1]] == list(RMS.matrix["sm"])
    assert overview[2].count("no results from this SM yet") == 4
    assert matrix.count("No results from this SM yet.") == 4
    row = marks(text, "cpu")
    assert row[("decode", "bf16")] == ["✅", "⏭", "—", "—"]  # eager, cuda_graph, torch_compile, memcheck
    assert row[("decode", "fp16")] == ["❌", "⏭", "—", "—"]
    assert row[("decode", "fp32")][0] == "⚠️" and row[("prefill", "fp32")][0] == "❗"
    assert row[("prefill", "bf16")][0] == "—" and row[("prefill", "fp16")][3] == "🚫"
    failed = next(t for t in tables(matrix) if "minimal input" in t[0])
    assert len(failed) == 3
    for expected in ("`decode-fp16-tp1-eager-cpu`", "0.5", " 3 ", "num_tokens=1 hidden=2048",
                     "`pytest --plan plan.yaml --plan-profile dev -k 'decode-fp16-tp1-eager-cpu'`"):
        assert expected in failed[2], expected
    not_run = next(t for t in tables(matrix) if t[0].startswith("| reason"))
    line = next(line for line in not_run if "cuda_graph needs a CUDA device" in line)
    assert "| 2 " in line and "decode · fp16, bf16 · tp1 · cuda_graph · cpu" in line
    # 4 SMs x 120 cells: memcheck cells run bf16 only
    assert any("no results from this SM yet" in line and "| 480 " in line for line in not_run)
    items = section(text, "Open items")
    assert "Fix decode · fp16 · tp1 · eager · cpu: output 'out': max abs error 0.5" in items
    assert "Run on sm100:" in items and "`prefill-fp32-tp1-eager-cpu` passes although the plan expects" in items
    assert "State as unsupported, or support, prefill · bf16 · tp1 · eager · cpu" not in items


# ---------------------------------------------------------------- merging


def test_merge_two_machines_latest_wins_and_provenance_per_sm(tmp_path):
    plan = small_plan(tmp_path, matrix={"sm": ["sm90"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-a",
                  machine("sm90", "gpu-a", "2026-11-28T01:00:00Z"), {
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "passed", "2026-11-28T01:05:00Z"),
        "prefill-bf16-tp1-eager-sm90": cell("prefill-bf16-tp1-eager-sm90", "passed", "2026-11-28T01:06:00Z"),
    })
    write_results(op_dir, "sm90-nvidia-h200-b.json", "rms_norm", "run-b",
                  machine("sm90", "gpu-b", "2026-11-29T01:00:00Z", commit="fedcba987654"), {
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "failed", "2026-11-29T01:05:00Z",
                                           reason="newer failure"),
    })
    text = render(plan, op_dir)
    assert marks(text, "sm90")[("decode", "bf16")] == ["❌"] and "newer failure" in text
    prov = next(line for line in text.splitlines() if line.startswith("- **Provenance:**"))
    assert "gpu-a (NVIDIA H200), commit abc123def456, 2026-11-28T01:00:00Z" in prov  # prefill cell came from gpu-a
    assert "gpu-b (NVIDIA H200), commit fedcba987654, 2026-11-29T01:00:00Z" in prov  # decode cell from gpu-b
    assert "**blocked**" in sm_line(text, "sm90")
    # The older result, written later to disk, still loses to the newer one: order is by finish time.
    write_results(op_dir, "sm90-nvidia-h200.json", "rms_norm", "run-a", machine("sm90", "gpu-a"), {
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "passed", "2026-11-30T01:05:00Z"),
        "prefill-bf16-tp1-eager-sm90": cell("prefill-bf16-tp1-eager-sm90", "passed", "2026-11-30T01:06:00Z"),
    })
    text = render(plan, op_dir)
    assert marks(text, "sm90")[("decode", "bf16")] == ["✅"] and "gpu-b" not in text


def test_a_machine_of_another_sm_does_not_replace_a_real_result(tmp_path):
    plan = small_plan(tmp_path, matrix={"sm": ["cpu", "sm90"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir)
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu", date="2026-11-30T00:00:00Z"), {
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "not_run", "2026-11-30T00:01:00Z",
                                           reason="needs sm90; this machine is cpu"),
    })
    matrix = section(render(plan, op_dir), "Support matrix")
    assert "needs sm90; this machine is cpu" not in matrix


def test_corrupt_and_foreign_files_are_problems_and_the_rest_is_merged(tmp_path):
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir)
    stamp_current(plan, op_dir)
    (op_dir / "results" / "broken.json").write_text('{"format": "harness-results", "version": 1, "op": "rms_')
    (op_dir / "results" / "foreign.json").write_text(json.dumps({"format": "junit", "tests": []}))
    write_results(op_dir, "other-op.json", "silu_and_mul", "run-x", machine("sm90"), {})
    (op_dir / "results" / "cpu.unreadable").write_text("garbage")
    path, problems = write_report(plan, op_dir)
    text = path.read_text()
    assert len(problems) == 4
    for name, words in (("broken.json", "not valid JSON"), ("foreign.json", "not a harness results file"),
                        ("other-op.json", "results for op 'silu_and_mul'"), ("cpu.unreadable", "set aside")):
        assert any(name in p and words in p for p in problems), (name, problems)
        shown = f"results/{name}"
        assert any(shown in line and line.startswith("> - ") for line in text.splitlines()), name
        assert any(shown in line for line in section(text, "Open items").splitlines())
    assert marks(text, "sm90") == {("decode", "bf16"): ["✅"], ("prefill", "bf16"): ["✅"]}  # the good file counts
    assert str(tmp_path) not in text


# ---------------------------------------------------------------- escaping and determinism


def test_user_and_exception_text_is_escaped(tmp_path):
    plan = small_plan(tmp_path, matrix={"sm": ["sm90"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, **{
        "decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "failed", reason=NASTY,
                                           minimal_example=NASTY, repro="pytest -k 'a|b' `x`",
                                           error={"max_abs": "nan", "max_ulp": None}),
        "prefill-bf16-tp1-eager-sm90": cell("prefill-bf16-tp1-eager-sm90", "not_run", reason=NASTY),
    })
    text = render(plan, op_dir)
    assert "<script>" not in text.replace("`<script>`", "")
    assert "line\nbreak" not in text
    for t in tables(text):
        widths = {unescaped_pipes(line) for line in t}
        assert len(widths) == 1, t  # no row has more or fewer cells than its header
    failed = next(t for t in tables(text) if "minimal input" in t[0])
    assert "bad \\| pipe \\`tick\\` \\`\\`double\\`\\` line break &lt;script&gt;" in failed[2]
    assert "`` pytest -k 'a\\|b' `x` ``" in failed[2]
    assert markdown.md("a_b _c_") == "a_b \\_c\\_"
    assert markdown.code("a`b") == "``a`b``" and markdown.code("`a") == "`` `a ``"


def test_same_results_give_byte_identical_report_and_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 5.0, 9.0, 6.0),
                                    "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 29.0)})
    without_plot = render(plan, op_dir)
    draw_plots(plan, op_dir)
    first = render(plan, op_dir)
    png = (op_dir / "perf-sm90.png").read_bytes()
    monkeypatch.chdir(tmp_path)  # a relative op_dir and another working directory give the same text
    draw_plots(plan, Path("reports/rms_norm"))
    second = render(plan, Path("reports/rms_norm"))
    assert first == second and first[0].replace("![GB/s against token count on sm90](perf-sm90.png)\n\n", "") \
        == without_plot[0]  # the page only links the plot
    assert (op_dir / "perf-sm90.png").read_bytes() == png
    assert b"Software" not in png and png.startswith(b"\x89PNG")


# ---------------------------------------------------------------- verdict rules


def test_verdict_blocked_by_a_failed_or_unexpectedly_passing_cell(tmp_path):
    plan = small_plan(tmp_path, matrix={"sm": ["sm90", "sm100"]})  # blocked wins over incomplete (sm100 has no results)
    fast = {"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0)}
    for status in ("failed", "xpass"):
        op_dir = tmp_path / status / "rms_norm"
        passed_sm90(op_dir, benchmarks=fast,
                    **{"decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", status)})
        text = render(plan, op_dir)
        assert verdict_line(text) == "- **Verdict:** sm90: blocked · sm100: no results"
        assert "**blocked**" in sm_line(text, "sm90") and "blocks the integration" in sm_line(text, "sm90")


def decision_rows(text: str) -> dict:
    """The Performance section's decision table: (sm, dtype, regime, profile) -> {column: cell}."""
    found = next(t for t in tables(section(text, "Performance")) if "vLLM profile" in t[0])
    head = [c.strip() for c in found[0].split("|")[1:-1]]
    rows = {}
    for line in found[2:]:
        cells = dict(zip(head, (c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1])))
        rows[(cells["SM"], cells["dtype"], cells["regime"], cells["vLLM profile"])] = cells
    return rows


def test_verdict_incomplete_while_cells_or_benchmarks_are_missing(tmp_path):
    fast = {"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0),
            "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0, 45.0)}
    op_dir = tmp_path / "a" / "rms_norm"
    passed_sm90(op_dir, benchmarks=fast)
    text = render(small_plan(tmp_path, matrix={"sm": ["sm90", "sm100"]}), op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90: go · sm100: no results"  # sm100 does not hold sm90 back
    assert "no results from a machine of this SM yet (2 cells)" in sm_line(text, "sm100")
    op_dir = tmp_path / "b" / "rms_norm"
    passed_sm90(op_dir, benchmarks=fast,
                **{"prefill-bf16-tp1-eager-sm90": cell("prefill-bf16-tp1-eager-sm90", "not_run", reason="x")})
    text = render(small_plan(tmp_path), op_dir)
    assert "**incomplete**" in sm_line(text, "sm90") and "1 cell not run (1: x)" in sm_line(text, "sm90")
    assert "benchmarks so far: go" in sm_line(text, "sm90")
    op_dir = tmp_path / "c" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": fast["decode-64"]})  # prefill not benchmarked
    text = render(small_plan(tmp_path), op_dir)
    assert "**incomplete**" in sm_line(text, "sm90")
    assert "no benchmark decision yet for prefill-sized bf16" in sm_line(text, "sm90")
    assert "Benchmark on sm90 (prefill-sized bf16): `pytest --plan small.yaml --bench`" in section(text, "Open items")
    op_dir = tmp_path / "d" / "rms_norm"
    passed_sm90(op_dir)
    text = render(small_plan(tmp_path), op_dir)
    assert "**incomplete**" in sm_line(text, "sm90")
    assert "no benchmark decision yet for decode-sized bf16; prefill-sized bf16" in sm_line(text, "sm90")
    assert "No benchmarks were run" in section(text, "Performance")
    assert "`pytest --plan small.yaml --bench`" in section(text, "Performance")


def test_cells_the_plan_excludes_are_not_required(tmp_path):
    fast = {"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0),
            "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0, 45.0)}
    op_dir = tmp_path / "a" / "rms_norm"
    passed_sm90(op_dir, benchmarks=fast)
    plan = small_plan(tmp_path, matrix={"sm": ["sm90", "sm100"]},
                      exclude=[{"sm": ["sm100"], "phase": ["prefill"], "why": "no | prefill <here>"}])
    text = render(plan, op_dir)
    assert "no results from a machine of this SM yet (1 cell)" in sm_line(text, "sm100")
    not_run = next(t for t in tables(section(text, "Support matrix")) if t[0].startswith("| reason"))
    rule = Path(plan.path).read_text().splitlines().index("exclude:") + 2  # the rule's own line, after the key's
    assert any(f"excluded by the plan (line {rule}): no \\| prefill &lt;here&gt;" in line and "| 1 " in line
               and "prefill · bf16 · tp1 · eager · sm100" in line for line in not_run), not_run
    assert "Benchmark on sm100 (every dtype and regime)" in section(text, "Open items")
    op_dir = tmp_path / "b" / "rms_norm"
    passed_sm90(op_dir, benchmarks=fast)
    text = render(small_plan(tmp_path, matrix={"sm": ["sm90", "sm100"]},
                             exclude=[{"sm": ["sm100"], "why": "not a target"}]), op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90: go · sm100: excluded"
    assert "Run on sm100" not in text and "Benchmark on sm100" not in text


def test_verdict_per_sm_go_while_other_sms_have_no_results(tmp_path):
    plan = small_plan(tmp_path, matrix={"sm": ["cpu", "sm90", "sm100"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 5.0, 9.0, 8.0),
                                    "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0)})
    cpu_bench = {**bench("decode", 64, 5.0, 9.0, 8.0, sm="cpu")}
    cpu_bench["impls"]["kernel"] = {"not_run": "not timed on a CPU machine: the kernel runs in Triton's interpreter"}
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu"), {
        cid: cell(cid, "passed") for cid in ("decode-bf16-tp1-eager-cpu", "prefill-bf16-tp1-eager-cpu")},
        {"decode-64-cpu": cpu_bench})
    text = render(plan, op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90: go · cpu: numerics only · sm100: no results"
    assert "2 of 2 cells passed" in sm_line(text, "cpu") and "never give a speed verdict" in sm_line(text, "cpu")
    rows = decision_rows(text)
    assert rows[("cpu", "bf16", "decode-sized", "Inductor off")]["recommendation"] == "none"
    assert "Triton's interpreter" in rows[("cpu", "bf16", "decode-sized", "Inductor off")]["why"]
    assert rows[("sm90", "bf16", "decode-sized", "Inductor on")]["recommendation"] == "**enable the custom op**"
    decided = section(text, "Decisions and verdict")
    assert re.search(r"\| verdict on sm90 +\| \*\*go\*\* ", decided)
    assert re.search(r"\| verdict on sm100 +\| \*\*no results\*\* ", decided)
    # One failed cell on one SM blocks that SM only.
    write_results(op_dir, "cpu.json", "rms_norm", "run-cpu", machine("cpu"), {
        "decode-bf16-tp1-eager-cpu": cell("decode-bf16-tp1-eager-cpu", "failed", reason="boom"),
        "prefill-bf16-tp1-eager-cpu": cell("prefill-bf16-tp1-eager-cpu", "passed")})
    assert verdict_line(render(plan, op_dir)) == "- **Verdict:** cpu: blocked · sm90: go · sm100: no results"


def test_verdict_go_no_go_per_regime_from_benchmarks(tmp_path):
    pytest.importorskip("matplotlib")
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "go" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0),
                                    "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0, 45.0)})
    draw_plots(plan, op_dir)
    text = render(plan, op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90: go"
    assert "![GB/s against token count on sm90](perf-sm90.png)" in text and (op_dir / "perf-sm90.png").exists()

    op_dir = tmp_path / "mixed" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0),
                                    "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 20.0, 45.0)})
    text = render(plan, op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90: go for decode-sized; go for prefill-sized (Inductor off)"
    rows = decision_rows(text)
    assert rows[("sm90", "bf16", "decode-sized", "Inductor on")]["recommendation"] == "**enable the custom op**"
    prefill_on = rows[("sm90", "bf16", "prefill-sized", "Inductor on")]
    assert prefill_on["recommendation"] == "**leave it to Inductor**"
    assert prefill_on["kernel speedup"] == "0.67× (0.65–0.68) vs compiled"  # compiled 20 µs, kernel 30 µs, ±1%
    assert "not faster than compiled at 1 of 1 shapes" in prefill_on["why"]
    prefill_off = rows[("sm90", "bf16", "prefill-sized", "Inductor off")]
    assert prefill_off["recommendation"] == "**enable the custom op**" and "not slower than vllm" in prefill_off["why"]
    assert prefill_off["vs vLLM's kernel and named baselines"].startswith("vllm 1.50× (")

    op_dir = tmp_path / "no-go" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 5.0, 4.0, 4.5),
                                    "prefill-2048": bench("prefill", 2048, 30.0, 29.9, 30.1)})
    text = render(plan, op_dir)
    assert verdict_line(text) == "- **Verdict:** sm90: no-go"
    assert "no difference: 1.00× (" in section(text, "Performance")  # compiled 30.1, kernel 30.0: spans 1
    rows = decision_rows(text)
    assert rows[("sm90", "bf16", "prefill-sized", "Inductor off")]["recommendation"] == "**keep native**"
    assert "vllm: not timed (vllm not installed)" in rows[("sm90", "bf16", "decode-sized", "Inductor on")][
        "vs vLLM's kernel and named baselines"]


def test_the_profiles_split_a_kernel_faster_than_native_but_slower_than_compiled(tmp_path):
    """5× faster than eager native, slower than Inductor's code: enable it only where Inductor is off."""
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 10.0, 50.0, 8.0),
                                    "decode-8": bench("decode", 8, 4.0, 20.0, 3.0),
                                    "prefill-2048": bench("prefill", 2048, 100.0, 500.0, 80.0)})
    text = render(plan, op_dir)
    rows = decision_rows(text)
    on = rows[("sm90", "bf16", "decode-sized", "Inductor on")]
    off = rows[("sm90", "bf16", "decode-sized", "Inductor off")]
    assert on["recommendation"] == "**leave it to Inductor**"
    assert on["vLLM setting"] == "`--ir-op-priority '{\"rms_norm\": [\"native\"]}'` (vLLM's default)"
    assert on["kernel speedup"].startswith("0.78× (") and on["kernel speedup"].endswith(" vs compiled")
    assert off["recommendation"] == "**enable the custom op**"
    assert off["kernel speedup"].startswith("5.00× (4.") and off["kernel speedup"].endswith(" vs native")
    assert off["vLLM setting"] == "`--ir-op-priority '{\"rms_norm\": [\"rms_norm_kernel\", \"vllm_c\", \"native\"]}'`"
    assert "faster than native at all 2 shapes" in off["why"] and "not timed: vllm" in off["why"]
    assert verdict_line(text) == "- **Verdict:** sm90: go (Inductor off)"
    decided = section(text, "Decisions and verdict")
    assert "decode-sized bf16 on sm90, Inductor off" in decided and "decode-sized bf16 on sm90, Inductor on" in decided


def test_keep_vllms_kernel_where_it_beats_the_kernel_and_the_baseline(tmp_path):
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    passed_sm90(op_dir, benchmarks={"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 4.0),
                                    # vLLM's kernel beats the kernel but not Inductor: leave it to Inductor
                                    "prefill-2048": bench("prefill", 2048, 30.0, 60.0, 20.0, 25.0)})
    text = render(plan, op_dir)
    rows = decision_rows(text)
    for profile in ("Inductor on", "Inductor off"):
        row = rows[("sm90", "bf16", "decode-sized", profile)]
        assert row["recommendation"] == "**keep vLLM's kernel**"
        assert "slower than vllm at 1 of 1 shapes" in row["why"] and "vLLM's kernel is faster than" in row["why"]
        assert row["vs vLLM's kernel and named baselines"].startswith("vllm 0.80× (")
    assert rows[("sm90", "bf16", "decode-sized", "Inductor on")]["vLLM setting"] == \
        "`--ir-op-priority '{\"rms_norm\": [\"vllm_c\", \"native\"]}'`"
    assert rows[("sm90", "bf16", "decode-sized", "Inductor off")]["vLLM setting"].endswith("(vLLM's default)")
    assert rows[("sm90", "bf16", "prefill-sized", "Inductor on")]["recommendation"] == "**leave it to Inductor**"
    assert rows[("sm90", "bf16", "prefill-sized", "Inductor off")]["recommendation"] == "**keep vLLM's kernel**"
    assert verdict_line(text) == "- **Verdict:** sm90: no-go"


def test_named_baselines_join_the_decision(tmp_path):
    """A named baseline faster than the kernel stops enabling it; the setting then keeps what vLLM has."""
    plan = small_plan(tmp_path, matrix={"phase": ["decode"]})
    op_dir = tmp_path / "reports" / "rms_norm"
    rec = bench("decode", 64, 5.0, 9.0, 8.0)
    rec["impls"]["liger"] = {"median_us": 4.0, "q20_us": 3.96, "q80_us": 4.04}
    rec["impls"]["flashinfer"] = {"not_run": "flashinfer.norm:rmsnorm cannot be imported here"}
    passed_sm90(op_dir, benchmarks={"decode-64": rec})
    text = render(plan, op_dir)
    row = decision_rows(text)[("sm90", "bf16", "decode-sized", "Inductor on")]
    assert row["recommendation"] == "**leave it to Inductor**" and "slower than liger at 1 of 1 shapes" in row["why"]
    others = row["vs vLLM's kernel and named baselines"]
    assert "liger 0.80× (0.78–0.82)" in others and "flashinfer: not timed (flashinfer.norm:rmsnorm cannot" in others
    assert "vs flashinfer" in tables(section(text, "Performance"))[0][0]  # every baseline gets a speedup column


def test_a_named_baseline_a_deployment_can_run_takes_the_decision(tmp_path):
    """A named baseline with a `setting` (how vLLM runs it) that beats the profile's baseline everywhere is the
    decision where the kernel loses, the fastest of those that qualify; one without a setting never is."""
    implementations = {"native": {}, "compiled": {},
                       "cublas": {"path": "kernels.int8_linear:dequantized_linear",
                                  "setting": "serve the unquantized checkpoint"},
                       "machete": {"path": "kernels.rms_norm:rms_norm", "setting": "a W8A16 checkpoint"},
                       "liger": {"path": "kernels.rms_norm:rms_norm"}}
    plan = small_plan(tmp_path, matrix={"phase": ["decode"]}, benchmark={"decode": [64]},
                      implementations=implementations)
    op_dir = tmp_path / "reports" / "rms_norm"
    rec = bench("decode", 64, 10.0, 20.0, 8.0)  # kernel 2x faster than native, slower than Inductor
    for name, us in (("cublas", 4.0), ("machete", 6.0), ("liger", 2.0)):
        rec["impls"][name] = {"median_us": us, "q20_us": us * 0.99, "q80_us": us * 1.01}
    passed_sm90(op_dir, benchmarks={"decode-64": rec})
    rows = decision_rows(render(plan, op_dir))
    for profile in ("Inductor on", "Inductor off"):
        row = rows[("sm90", "bf16", "decode-sized", profile)]
        assert row["recommendation"] == "**leave it to cublas**", profile  # liger is faster, but names no setting
        assert row["vLLM setting"] == "serve the unquantized checkpoint"
        assert "slower than cublas at 1 of 1 shapes" in row["why"] and "cublas is faster than" in row["why"]
    assert plan.implementation("machete").setting == "a W8A16 checkpoint"
    assert plan.implementation("liger").setting is None


def test_vllm_settings_per_profile_for_the_custom_op_route():
    silu = load_plan(ROOT / "kernels" / "plans" / "silu_and_mul.yaml")
    assert profile_setting(silu, True, "kernel") == """--compilation-config '{"custom_ops": ["none", "+SiluAndMul"]}'"""
    assert profile_setting(silu, False, "kernel") == """--compilation-config '{"custom_ops": ["all", "+SiluAndMul"]}'"""
    assert profile_setting(silu, True, "vllm") == """--compilation-config '{"custom_ops": ["none", "+silu_and_mul"]}'"""
    assert profile_setting(silu, True, "native") == """--compilation-config '{"custom_ops": ["none"]}'"""
    assert profile_setting(silu, False, "native") == \
        """--compilation-config '{"custom_ops": ["all", "-silu_and_mul"]}'"""
    assert profile_setting(RMS, True, "kernel") == enable_setting(RMS)


def test_performance_tables_and_missing_fields(tmp_path, monkeypatch):
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    partial = bench("decode", 8, 4.0, 8.0, 6.0)
    del partial["bytes"], partial["copy_bw_gbps"]
    skipped = {"phase": "prefill", "dtype": "bf16", "sm": "sm90", "graph_mode": "eager", "num_tokens": 2048,
               "impls": {"kernel": {"not_run": "needs 2 GPUs"}}}
    passed_sm90(op_dir, benchmarks={"decode-8": partial, "decode-64": bench("decode", 64, 5.0, 9.0, 6.0),
                                    "prefill-x": skipped})
    perf = section(render(plan, op_dir), "Performance")
    assert "### decode-sized on sm90 (NVIDIA H200)" in perf
    table_lines = tables(perf)[0]
    assert [h.strip() for h in table_lines[0].split("|")[1:-1]] == [
        "tokens", "hidden", "kernel", "native", "compiled", "vllm", "vs native", "vs compiled", "vs vllm"]
    first = table_lines[2]
    assert "| 8 " in first and "4.00 µs" in first and "— GB/s" in first and "not run: vllm not installed" in first
    assert "1.80× (" in table_lines[3]  # native 9.0 / kernel 5.0
    assert "![GB/s" not in perf  # no plot drawn: none linked
    assert "Benchmark shapes not timed" in perf and "needs 2 GPUs" in perf
    assert not (op_dir / "perf-sm90.png").exists()


# ---------------------------------------------------------------- the page across ops


def overview_inputs(tmp_path: Path):
    rms = small_plan(tmp_path, benchmark={"decode": [64], "prefill": [2048], "models": {"hidden=4096": "Llama-3-8B"}})
    silu = load_plan(write_plan(
        tmp_path / "silu.yaml", op=silu_op(14336),
        matrix={"phase": ["decode"], "dtype": ["bf16"], "tp": [1], "graph_mode": ["eager"], "sm": ["sm90", "sm100"]},
        vllm=SILU_CUSTOM_OP, benchmark={"decode": [64], "models": {"d=14336": "Llama-3-8B"}},
        implementations={"native": {}, "compiled": {}, "vllm": {"name": "silu_and_mul", "args": ["out", "x"]}}))
    reports = tmp_path / "reports"
    passed_sm90(reports / "rms_norm", benchmarks={"decode-64": bench("decode", 64, 10.0, 50.0, 8.0),
                                                  "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0)})
    silu_rec = bench("decode", 64, 5.0, 9.0, 8.0, 4.0)
    silu_rec["sizes"] = {"d": 14336}
    write_results(reports / "silu_and_mul", "sm90-nvidia-h200.json", "silu_and_mul", "run-h200",
                  machine("sm90", "h200"), {"decode-bf16-tp1-eager-sm90": cell("decode-bf16-tp1-eager-sm90", "passed")},
                  {"decode-64": silu_rec})
    stamp_current(rms, reports / "rms_norm")
    stamp_current(silu, reports / "silu_and_mul")
    return rms, silu, reports


def test_overview_page_across_ops(tmp_path, monkeypatch):
    rms, silu, reports = overview_inputs(tmp_path)
    path, problems = write_overview([silu, rms], reports)
    assert path == reports / "README.md" and problems == []
    text = path.read_text()
    verdicts = tables(section(text, "Verdicts"))[0]
    assert [line.split("|")[1].strip() for line in verdicts[2:]] == ["`rms_norm`", "`silu_and_mul`"]  # by op name
    assert "sm90: go for decode-sized (Inductor off); go for prefill-sized" in verdicts[2]
    assert "[rms_norm/PLAN.md](rms_norm/PLAN.md)" in verdicts[2]
    assert "sm90: no-go · sm100: no results" in verdicts[3]
    rows = tables(section(text, "Decisions"))[0]
    assert [h.strip() for h in rows[0].split("|")[1:-1]] == [
        "op", "SM", "GPU", "vLLM profile", "decode-sized", "prefill-sized", "vLLM setting"]
    assert len(rows) == 2 + 2 + 2  # one row per op, SM and profile: the regimes (and dtypes) side by side
    silu_on = next(r for r in rows if "`silu_and_mul`" in r and "Inductor on" in r)
    assert "**keep vLLM's kernel**" in silu_on and "NVIDIA H200" in silu_on
    assert """`--compilation-config '{"custom_ops": ["none", "+silu_and_mul"]}'`""" in silu_on
    rms_off = next(r for r in rows if "`rms_norm`" in r and "Inductor off" in r)
    decode, prefill = (c.strip() for c in rms_off.split("|")[5:7])
    assert "**enable the custom op**: bf16 5.00× (" in decode and "**enable the custom op**: bf16 3.00× (" in prefill
    # The models are stated once per op, not in every row.
    models = tables(text.split("### The models the benchmarked sizes come from", 1)[1])[0]
    assert [line.split("|")[1].strip() for line in models[2:]] == ["`rms_norm`", "`silu_and_mul`"]
    assert text.count("Llama-3-8B (d=14336)") == 1 and text.count("Llama-3-8B (hidden=4096)") == 1
    assert "`python -m harness overview small.yaml silu.yaml`" in text  # as typed at the project root, by op
    assert not re.search(r"\d{4}-\d\d-\d\dT", text)  # no dates: the same results give the same page
    # Byte-identical for the same inputs: plan order, the working directory and a relative folder do not matter.
    write_overview([rms, silu], reports)
    assert path.read_text() == text
    monkeypatch.chdir(tmp_path)
    assert main(["overview", "small.yaml", "silu.yaml", "--reports-dir", "reports"]) == 0
    assert path.read_text() == text


def test_overview_names_each_gpu_of_a_row_once(tmp_path):
    """One op's decode timings from an H200, its prefill timings from an H100 and an H200: the row's GPU column names
    each GPU once (it listed the H200 twice when each regime's GPUs were joined before the row's)."""
    rms, silu, reports = overview_inputs(tmp_path)
    h100 = {**machine("sm90", "h100"), "gpu": "NVIDIA H100 80GB HBM3"}
    write_results(reports / "rms_norm", "sm90-nvidia-h100-80gb-hbm3.json", "rms_norm", "run-h100", h100, {},
                  {"prefill-8192": bench("prefill", 8192, 100.0, 300.0, 200.0)})
    stamp_current(rms, reports / "rms_norm")
    text, _ = render_overview([rms, silu], reports)
    rows = [r for r in tables(section(text, "Decisions"))[0] if "`rms_norm`" in r]
    assert rows and all(r.split("|")[3].strip() == "NVIDIA H100 80GB HBM3, NVIDIA H200" for r in rows), rows


def test_overview_names_results_problems_with_their_op(tmp_path):
    rms, silu, reports = overview_inputs(tmp_path)
    (reports / "silu_and_mul" / "results" / "broken.json").write_text("{")
    text, problems = render_overview([rms, silu], reports)
    assert len(problems) == 1 and problems[0].startswith("silu_and_mul: results/broken.json: not valid JSON")
    assert "> - silu_and_mul: results/broken.json: not valid JSON" in text


# ---------------------------------------------------------------- the pytest run writes the report


def test_a_plan_run_and_the_report_command_write_the_same_report(tmp_path):
    reports = tmp_path / "reports"
    done = subprocess.run([sys.executable, "-m", "pytest", "--plan", "plan.yaml", "--reports-dir", str(reports),
                           "-k", "decode-bf16-tp1-eager-sm90", "-p", "no:cacheprovider", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "living plan written:" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    path = reports / "rms_norm" / "PLAN.md"
    from_pytest = path.read_text()
    assert "## Support matrix" in from_pytest and "no results yet" in from_pytest
    path.unlink()

    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        assert main(["report", "plan.yaml", "--reports-dir", str(reports)]) == 0
    finally:
        os.chdir(cwd)
    assert path.read_text() == from_pytest


# ---------------------------------------------------------------- Mermaid, with Mermaid's own parser


@pytest.fixture(scope="session")
def mermaid_checker():
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node and npm are needed to parse Mermaid diagrams with Mermaid itself")
    # One install at a time: under xdist each worker has this session fixture, and a second npm install into the
    # same folder while the first runs leaves packages half written (a fresh clone's check failed so).
    with open(MERMAID_CHECK / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (MERMAID_CHECK / "node_modules" / ".installed").exists():
            done = subprocess.run([npm, "install", "--prefix", str(MERMAID_CHECK), "--no-package-lock", "--no-audit",
                                   "--no-fund"], capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"npm install failed:\n{done.stderr[-3000:]}"
            (MERMAID_CHECK / "node_modules" / ".installed").touch()

    def check(*files: Path) -> tuple[int, list[dict]]:
        done = subprocess.run([node, str(MERMAID_CHECK / "check.mjs"), *map(str, files)], capture_output=True,
                              text=True, timeout=300)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines or done.returncode == 0, done.stderr[-3000:]
        return done.returncode, lines

    return check


def test_every_generated_diagram_parses(tmp_path, mermaid_checker):
    files = []
    for i, plan in enumerate((RMS, FUSED, small_plan(tmp_path, tp={"kind": "trivial"}))):
        text, _ = report.render(plan, tmp_path / str(i) / "reports" / plan.op.name)
        files.append(tmp_path / f"{i}.md")
        files[-1].write_text(text)
    sharded = write_plan(tmp_path / "sharded.yaml", ROOT / "plan.yaml",
                         tp={"kind": "sharded", "inputs": {"x": {"shard": 1}, "weight": {"shard": 0}},
                             "outputs": {"out": {"gather": 1}}},
                         vllm={"route": "custom_op"})
    text, _ = report.render(load_plan(sharded), tmp_path / "s" / "reports" / "rms_norm")
    files.append(tmp_path / "sharded.md")
    files[-1].write_text(text)
    rc, results = mermaid_checker(*files)
    assert rc == 0, [r for r in results if not r["ok"]]
    assert [r["type"] for r in results] == ["flowchart-v2", "sequence"] * 4


def hostile_diagrams(escape) -> str:
    """Hostile text in flowchart labels and edge labels, sequence participants, messages and notes."""
    blocks = []
    for text in (NASTY, 'a;b', 'x"y"z', "p|q", "end", "%%c", "#35;x"):
        t = escape(text)
        blocks.append(f'```mermaid\nflowchart TD\n    a["{t}"] -->|"{t}"| b{{"{t}"}}\n```')
        blocks.append(f"```mermaid\nsequenceDiagram\n    participant A as {t}\n"
                      f"    A->>A: {t}\n    Note over A: {t}\n```")
    return "\n\n".join(blocks) + "\n"


def test_hostile_text_is_escaped_for_mermaid(tmp_path, mermaid_checker):
    assert re.fullmatch(r"[A-Za-z0-9 _.,:/()=+*'#;-]*", markdown.mm(NASTY))
    escaped, raw = tmp_path / "escaped.md", tmp_path / "raw.md"
    escaped.write_text(hostile_diagrams(markdown.mm))
    raw.write_text(hostile_diagrams(lambda t: " ".join(t.split())))
    rc, results = mermaid_checker(escaped)
    assert rc == 0 and len(results) == 14, [r for r in results if not r["ok"]]
    rc, results = mermaid_checker(raw)  # the same text unescaped breaks the parser: the check has teeth
    assert rc == 1 and sum(not r["ok"] for r in results) >= 2


def test_the_checker_rejects_a_broken_diagram(tmp_path, mermaid_checker):
    bad = tmp_path / "bad.md"
    bad.write_text('```mermaid\nflowchart TD\n    graph["a"] --> b\n```\n\n'
                   '```mermaid\nsequenceDiagram\n    A->>B: x; y\n```\n')
    rc, results = mermaid_checker(bad)
    assert rc == 1 and [r["ok"] for r in results] == [False, False]


def test_benchmark_tables_say_where_l2_was_cold():
    """Decode-sized calls, whose rotated input sets the harness caps, are marked as finding data in L2."""
    from harness.results.store import BenchRecord

    def rec(num_tokens: int, working_set: int, sets: int) -> BenchRecord:
        return BenchRecord("decode", "bf16", "sm90", "eager", num_tokens, {"hidden": 4096}, l2_bytes=60 << 20,
                           working_set_bytes=working_set, rotated_sets=sets)

    cold = rec(256, 6 << 20, 21)  # 126 MiB rotated: past twice the 60 MiB L2
    warm = rec(1, 24 << 10, 1024)  # 24 MiB rotated: fits
    l2_note = performance.l2_note
    assert l2_note([cold]) == "; L2 cold"
    assert "except at 1 of 2 items" in l2_note([cold, warm]) and "up to 1 tokens" in l2_note([cold, warm])
    assert l2_note([BenchRecord("decode", "bf16", "cpu", "eager", 1, {})]) == ""  # a CPU machine: no L2 figure


def test_every_kind_of_open_item_and_trade_off_has_words():
    """Decisions name a kind; the page has words for each (a kind without them would stop the report)."""
    from typing import get_args

    from harness.decisions.open_items import OpenItem, OpenItemKind
    from harness.decisions.tradeoffs import TradeOff, TradeOffKind
    from harness.rendering.conclusions import open_item_text, tradeoff_text
    from harness.cells.matrix import expand

    plan = RMS
    cells = tuple(expand(plan)[:2])
    for kind in get_args(OpenItemKind):
        item = OpenItem(kind, where="sm90", what="x", why="y", command="pytest", cells=cells, benchmarks=("decode-64",))
        assert open_item_text(plan, item).strip(), kind
    for kind in get_args(TradeOffKind):
        assert tradeoff_text(plan, TradeOff(kind, padded_rows=7, largest_capture=512)).strip(), kind


def test_a_baseline_differing_alike_at_many_shapes_is_one_open_item(tmp_path):
    """A baseline rounding differently at every shape (Inductor's fused code, vLLM's kernel) is one open item naming
    the first shape and how many more, not one per shape; a different fault stays an item of its own."""
    plan = small_plan(tmp_path)
    op_dir = tmp_path / "reports" / "rms_norm"
    benchmarks = {}
    for tokens, share in ((1, "1.22"), (64, "1.93"), (256, "1.50")):
        rec = bench("decode", tokens, 5.0, 9.0, 8.0, 7.0)
        rec["impls"]["vllm"]["differs"] = (f"wrong result after timing: output 'out': {share}% of quantized elements "
                                           "are one step from the reference (at most 1.00% allowed)")
        benchmarks[f"decode-{tokens}"] = rec
    benchmarks["decode-256"]["impls"]["compiled"]["differs"] = "wrong result after timing: output 'out' is NaN"
    passed_sm90(op_dir, benchmarks=benchmarks)
    items = [line for line in section(render(plan, op_dir), "Open items").splitlines() if "outputs are acceptable" in
             line]
    assert len(items) == 2, items
    assert items[0].startswith("- [ ] Check that vllm's outputs are acceptable (benchmark `decode-1` and 2 more alike")
    assert "1.22% of quantized elements" in items[0]
    assert "compiled's outputs are acceptable (benchmark `decode-256`; timings used): wrong result after timing: " \
           "output 'out' is NaN" in items[1]

"""Verdicts per SM and TP size, the cross-op page at a glance, and vLLM's own defaults decided, on synthetic results
(the helpers that write them are test_report's)."""

from __future__ import annotations

from pathlib import Path

from harness.spec.load import load_plan
from tests.test_report import bench, cell, machine, render, write_results

FAST = {"decode-64": bench("decode", 64, 5.0, 9.0, 8.0, 7.0), "prefill-2048": bench("prefill", 2048, 30.0, 90.0, 60.0, 45.0)}


def tp_plan(tmp_path: Path, tp="[1, 2]"):
    """rms_norm on decode and prefill, bf16, eager, sm90, at the TP sizes given."""
    path = tmp_path / "tp.yaml"
    path.write_text(f"""\
op:
  name: rms_norm
  intent: drop-in
  kernel: kernels.rms_norm:rms_norm
  reference: kernels.rms_norm:rms_norm_ref
  args:
    out: {{shape: [num_tokens, hidden], dtype: act, role: output}}
    x: {{shape: [num_tokens, hidden], dtype: act}}
    weight: {{shape: [hidden], dtype: act, init: around_one}}
    eps: 1.0e-6
  outputs: [out]
  sizes: {{hidden: [4096]}}
matrix:
  phase: [decode, prefill]
  dtype: [bf16]
  tp: {tp}
  graph_mode: [eager]
  sm: [sm90]
vllm: {{route: ir, ir_op: rms_norm}}
benchmark: {{decode: [64], prefill: [2048], baselines: [native, compiled, vllm]}}
""")
    return load_plan(path)


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
    plan = tp_plan(tmp_path, tp="[1, 2, 4]")
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

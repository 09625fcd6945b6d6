"""Small plans for the harness's own tests: the bundled RMSNorm's plan with one thing changed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

OUT_PARAM_ARGS = """\
    out: {shape: [num_tokens, hidden], dtype: act, role: output}
    x: {shape: [num_tokens, hidden], dtype: act, layout: [contiguous, strided]}
    weight: {shape: [hidden], dtype: act, init: around_one}
    eps: 1.0e-6
  outputs: [out]"""

FUNCTIONAL_ARGS = """\
    x: {shape: [num_tokens, hidden], dtype: act, layout: [contiguous, strided]}
    weight: {shape: [hidden], dtype: act, init: around_one}
    eps: 1.0e-6
  outputs: [y]"""


# The plans here name the `cpu` SM: on a GPU machine their cells are not run (needs cpu; the machine is sm90), so a
# test asserting what such a run did, or what a CPU machine reports, is a CPU machine's test. A GPU machine's own
# answers are checked by tests/test_gpu_checks.py and by the nightly matrix on the bundled plans.
cpu_machine_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="runs `sm: [cpu]` cells, which a GPU machine does not run")


def hide_vllm(monkeypatch) -> None:
    """As if vLLM were not installed: `import vllm` fails, and no vLLM ops library is named on its own."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delenv("HARNESS_VLLM_OPS_LIBRARY", raising=False)


# Batches of at most 256 tokens, prefills of 16 to 64: for tests whose prefill cells check the harness, not the
# kernel's numbers (the default 8192 drew thousands of rows, seconds each in Triton's interpreter).
SMALL_BATCHES = "max_num_batched_tokens: 256, prefill_tokens: [16, 64]"


def rms_norm_plan(tmp_path: Path, kernel: str = "kernels.rms_norm:rms_norm", *, functional: bool = False,
                  phase="[decode]", dtype="[fp32]", tp="[1]", graph_mode="[eager]", sm="[cpu]",
                  hidden="[64, 128]", extra: str = "", numerics: str = "{examples: 20}",
                  name: str = "plan.yaml") -> Path:
    reference = "kernels.rms_norm:rms_norm_ref"
    text = f"""\
op:
  name: rms_norm
  intent: drop-in
  kernel: {kernel}
  reference: {reference}
  args:
{FUNCTIONAL_ARGS if functional else OUT_PARAM_ARGS}
  sizes: {{hidden: {hidden}}}
matrix:
  phase: {phase}
  dtype: {dtype}
  tp: {tp}
  graph_mode: {graph_mode}
  sm: {sm}
numerics: {numerics}
{extra}"""
    path = tmp_path / name
    path.write_text(text)
    return path


def read_results(path: Path) -> dict:
    """A results file as the JSON a run wrote (tests assert on the file, as a user or CI job reads it)."""
    return json.loads(Path(path).read_text())


def any_call(**values):
    """A kernel and reference for plans that only test how inputs are built: it takes any arguments."""
    return None


def ones_for_x(values, *, plan, cell, example, sizes, generator, device):
    """A plan's own input generator (op.generate): x becomes ones, drawn nothing else."""
    return {"x": values["x"].new_ones(values["x"].shape) * (1 + torch.rand((), generator=generator, device=device))}

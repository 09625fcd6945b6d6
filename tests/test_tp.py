"""Tensor parallelism: sharding and recombination, the plan's `tp` section, and TP cells run end to end.

The end-to-end tests run `pytest --plan` in this process (pytester) on CPU: each TP cell runs in a
group of gloo ranks started once per TP size, so each test pays one group start per TP size.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch

import kernels.silu_and_mul  # noqa: F401  triton first imported here, not inside an in-process pytester run:
# pytester unloads the modules a run imported, and importing triton a second time aborts the process
from harness.runtime import tp
from harness.runtime.inputs import Example, build_args
from harness.cells.matrix import Cell
from harness.runtime.numerics import Mismatch
from harness.plan.load import load_plan
from harness.plan.model import PlanError
from tests.plans import cpu_machine_only, rms_norm_args, rms_norm_plan, write_plan

ROOT = Path(__file__).resolve().parents[1]
SILU_PLAN = ROOT / "kernels" / "plans" / "silu_and_mul.yaml"

def silu_plan(tmp_path: Path, kernel="kernels.silu_and_mul:silu_and_mul", tp_sizes=(1, 2, 4),
              x_width="2*intermediate") -> Path:
    """silu_and_mul on one CPU cell per TP size, its gate_up input sharded as vLLM's merged column-parallel layout."""
    return write_plan(
        tmp_path / "silu.yaml",
        op={"name": "silu_and_mul", "intent": "drop-in", "kernel": kernel,
            "reference": "kernels.silu_and_mul:silu_and_mul_ref",
            "args": {"out": {"shape": ["num_tokens", "intermediate"], "dtype": "act", "role": "output"},
                     "x": {"shape": ["num_tokens", x_width], "dtype": "act", "layout": ["contiguous", "strided"]}},
            "outputs": ["out"], "sizes": {"intermediate": [512]}},
        matrix={"phase": ["decode"], "dtype": ["fp32"], "tp": list(tp_sizes), "graph_mode": ["eager"], "sm": ["cpu"]},
        tp={"kind": "sharded", "inputs": {"x": {"shard": 1, "merged": 2}}, "outputs": {"out": {"gather": 1}}},
        numerics={"examples": 4, "max_num_seqs": 8, "awkward_sizes": False})


# ---------------------------------------------------------------- sharding and recombination


@pytest.mark.parametrize("size", [2, 4])
def test_merged_layout_round_trip(size):
    gate = torch.arange(3 * 8).reshape(3, 8).float()
    up = -torch.arange(3 * 8).reshape(3, 8).float()
    gate_up = torch.cat([gate, up], 1)
    pieces = [tp.shard(gate_up, 1, 2, r, size) for r in range(size)]
    step = 8 // size
    for r, piece in enumerate(pieces):  # vLLM's merged column-parallel layout: [gate_r | up_r] on rank r
        want = torch.cat([gate[:, r * step:(r + 1) * step], up[:, r * step:(r + 1) * step]], 1)
        assert torch.equal(piece, want)
    assert torch.equal(tp.unshard(pieces, 1, 2), gate_up)
    # a plain (unmerged) split is the same with one part
    plain = [tp.shard(gate_up, 1, 1, r, size) for r in range(size)]
    assert torch.equal(plain[0], gate_up[:, : 16 // size])
    assert torch.equal(tp.unshard(plain, 1, 1), gate_up)


def test_shard_refuses_an_uneven_split():
    with pytest.raises(ValueError, match="does not split into 2 part"):
        tp.shard(torch.zeros(2, 6), 1, 2, 0, 2)


def test_split_tokens_pads_to_a_multiple_of_tp():
    x = torch.arange(5 * 3).reshape(5, 3).float()
    pieces = [tp.split_tokens(x, 0, r, 4) for r in range(4)]
    assert [p.shape[0] for p in pieces] == [2, 2, 2, 2]
    assert torch.equal(pieces[3], torch.zeros(2, 3))  # padding only
    assert torch.equal(torch.cat(pieces).narrow(0, 0, 5), x)


def _plan(tmp_path, tp_section: dict):
    return load_plan(rms_norm_plan(tmp_path, matrix={"tp": [1, 2]}, tp=tp_section))


def test_recombine_gather_sum_and_replicated(tmp_path):
    plan = _plan(tmp_path, {"kind": "sharded", "inputs": {"x": {"shard": 1}}, "outputs": {"out": {"gather": 1}}})
    a, b = torch.ones(2, 3), torch.full((2, 3), 2.0)
    assert torch.equal(tp.recombine(plan, "out", [a, b], 2), torch.cat([a, b], 1))
    plan = _plan(tmp_path, {"kind": "sharded", "inputs": {"x": {"shard": 1}}, "outputs": {"out": "sum"}})
    assert torch.equal(tp.recombine(plan, "out", [a, b], 2), torch.full((2, 3), 3.0))
    halves = [torch.full((1,), 0.5, dtype=torch.bfloat16)] * 4  # accumulated in fp32, rounded once
    assert float(tp.recombine(plan, "out", halves, 1)) == 2.0
    plan = _plan(tmp_path, {"kind": "trivial"})
    nan = torch.tensor([[1.0, float("nan")]])
    assert tp.recombine(plan, "out", [nan, nan.clone()], 1) is not None  # NaN where both have NaN agrees
    with pytest.raises(Mismatch, match=r"replicated across ranks, but rank 1's differs from its replica's in 1 of 2"):
        tp.recombine(plan, "out", [torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.5]])], 1)


def test_sequence_parallel_outputs_come_back_in_token_order(tmp_path):
    plan = _plan(tmp_path, {"kind": "trivial", "sequence_parallel": True})
    x = torch.arange(5 * 4).reshape(5, 4).float()
    pieces = [tp.split_tokens(x, 0, r, 2) for r in range(2)]
    assert torch.equal(tp.recombine(plan, "out", pieces, 5), x)


def test_local_values_shard_inputs_and_size_outputs(tmp_path):
    plan = load_plan(silu_plan(tmp_path))
    cell = Cell("decode", "fp32", 2, "eager", "cpu")
    ex = Example(num_tokens=3, sizes={"intermediate": 8}, layouts={"x": ("strided", 5)}, seed=7)
    full = build_args(plan, cell, ex, "cpu")
    local = tp.local_values(plan, ex, full, 1, 2)
    assert tuple(local["out"].shape) == (3, 4) and local["out"].isnan().all()  # poisoned shard of out
    assert tuple(local["x"].shape) == (3, 8) and local["x"].stride(0) == 8 + 5  # the example's strided layout
    assert torch.equal(local["x"], torch.cat([full["x"][:, 4:8], full["x"][:, 12:16]], 1))
    local["x"].add_(1)  # a rank's shard is its own copy
    assert not torch.equal(local["x"], torch.cat([full["x"][:, 4:8], full["x"][:, 12:16]], 1))


def test_sharded_sizes_are_drawn_divisible(tmp_path):
    plan = load_plan(silu_plan(tmp_path))
    assert tp.tp_multiples(plan, 2) == {"intermediate": 2}
    assert tp.tp_multiples(plan, 4) == {"intermediate": 4}
    plan = load_plan(silu_plan(tmp_path, x_width="intermediate"))
    assert tp.tp_multiples(plan, 4) == {"intermediate": 8}  # 2 merged parts x 4 ranks
    assert tp.output_combine(plan, "out") == ("gather", 1, 1)


def test_merged_output_gather(tmp_path):
    plan = _plan(tmp_path, {"kind": "sharded", "inputs": {"x": {"shard": 1}},
                           "outputs": {"out": {"gather": 1, "merged": 2}}})
    full = torch.arange(2 * 8).reshape(2, 8).float()
    pieces = [tp.shard(full, 1, 2, r, 2) for r in range(2)]
    assert torch.equal(tp.recombine(plan, "out", pieces, 2), full)


# ---------------------------------------------------------------- the plan's tp section

SHARDED = {"kind": "sharded", "inputs": {"x": {"shard": 1, "merged": 2}}, "outputs": {"out": {"gather": 1}}}
BAD_TP = [
    # (what, the keys of SHARDED changed, the field named (on the line the error gives), words in the message)
    ("shards the token dimension", {"inputs": {"x": {"shard": 0}}}, "tp.inputs.x.shard", "other than num_tokens"),
    ("merged below one", {"inputs": {"x": {"shard": 1, "merged": 0}}}, "tp.inputs.x.merged", "merged parts (>= 1)"),
    ("shards an unknown input", {"inputs": {"y": {"shard": 1}}}, "tp.inputs.y", "one of the keys"),
    ("an unknown combine", {"outputs": {"out": "concat"}}, "tp.outputs.out", "a mapping"),
    ("gathers a missing dimension", {"outputs": {"out": {"gather": 2}}}, "tp.outputs.out.gather",
     "a dimension of a 2-d tensor"),
    ("gathers the token dimension", {"outputs": {"out": {"gather": 0}}}, "tp.outputs.out.gather",
     "other than num_tokens"),
    ("sharded without saying how out combines", {"outputs": {}}, "tp.outputs.out", "how ranks' outputs combine"),
    ("trivial yet sharded", {"kind": "trivial"}, "tp.kind", "'sharded' when inputs are sharded"),
    ("a constant dimension that does not split", {"inputs": {"scale": {"shard": 0}}}, "tp.inputs.scale.shard",
     "divisible by tp x merged (2 x 1)"),
    ("sequence parallel with a token-sharded input", {"sequence_parallel": True}, "tp.inputs.x",
     "'replicated' (tp.sequence_parallel"),
    ("sequence parallel with a summed token output",
     {"inputs": {"weight": {"shard": 0}}, "sequence_parallel": True, "outputs": {"out": "sum"}}, "tp.outputs.out",
     "'replicated' (tp.sequence_parallel puts it back"),
]


@pytest.mark.parametrize("what, changes, field, words", BAD_TP, ids=[b[0] for b in BAD_TP])
def test_bad_tp_section_is_located(tmp_path, what, changes, field, words):
    args = rms_norm_args()
    eps = args.pop("eps")
    path = rms_norm_plan(tmp_path, matrix={"tp": [1, 2]}, tp={**SHARDED, **changes},
                         op={"args": {**args, "scale": {"shape": [3], "dtype": "float32"}, "eps": eps}})
    with pytest.raises(PlanError) as info:
        load_plan(path)
    err = info.value
    assert err.field == field, str(err)
    assert words in str(err), str(err)
    line = path.read_text().splitlines()[err.line - 1]
    assert field.split(".")[-1] in line, (str(err), line)


def test_bad_awkward_sizes_flag_is_located(tmp_path):
    path = rms_norm_plan(tmp_path, numerics={"examples": 4, "awkward_sizes": "maybe"})
    with pytest.raises(PlanError, match="numerics.awkward_sizes: expected true or false; found 'maybe'"):
        load_plan(path)


def test_the_bundled_silu_and_mul_plan_shards_a_merged_gate_up():
    plan = load_plan(SILU_PLAN)
    assert plan.tp.kind == "sharded"
    assert plan.tp.shard == (("x", 1, 2),) and plan.tp.combine == (("out", "gather", 1),)
    assert set(plan.matrix["tp"]) >= {1, 2, 4}


# ---------------------------------------------------------------- end to end (pytest --plan, gloo ranks)


def _spawned_descendants() -> list[str]:
    """Workers and ranks of this process still running, found through /proc: spawned ones, and those forked from
    multiprocessing's fork server (which shares their command line and stays up for the session)."""
    parents, cmdlines = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdlines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    me, found = os.getpid(), []
    for pid, cmd in cmdlines.items():
        p = parents.get(pid)
        while p and p != me and p != 1:
            p = parents.get(p)
        forked = "multiprocessing.forkserver" in cmd and parents[pid] != me
        if p == me and ("spawn_main" in cmd or forked) and stat_state(pid) != "Z":
            found.append(f"{pid}: {cmd}")
    return found


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _run(pytester, plan: Path, *args) -> tuple:
    if plan.parent != pytester.path:  # a bundled plan: run from a copy, so the run's rootdir is pytester's
        plan = Path(pytester.copy_example(str(plan)))
    reports = pytester.path / "reports"
    result = pytester.runpytest("-p", "harness.plugin", "--plan", str(plan), "--plan-profile", "ci",
                                "--reports-dir", str(reports), "--no-report", "-p", "no:cacheprovider", *args)
    name = load_plan(plan).op.name
    cells = json.loads((reports / name / "results" / "cpu.json").read_text())["cells"]
    assert multiprocessing.active_children() == []
    assert _spawned_descendants() == []
    return result, cells


@cpu_machine_only
def test_rms_norm_tp2_eager_passes(pytester):
    result, cells = _run(pytester, ROOT / "plan.yaml", "-k", "decode-bf16-tp2-eager-cpu and not vllm", "--examples",
                         "2")
    result.assert_outcomes(passed=1)
    cell = cells["decode-bf16-tp2-eager-cpu"]
    assert cell["status"] == "passed" and cell["examples"] == 2
    assert cell["facts"]["ranks"] == 2 and cell["facts"]["backend"] == "gloo"
    assert cell["facts"]["worker_starts"] == 1


@cpu_machine_only
def test_silu_and_mul_tp2_and_tp4_pass_in_one_group_each(pytester):
    result, cells = _run(pytester, SILU_PLAN, "-k", "(decode-fp16-tp2-eager-cpu or decode-bf16-tp2-eager-cpu or "
                         "decode-fp16-tp4-eager-cpu or decode-bf16-tp4-eager-cpu) and not vllm", "--examples", "3")
    result.assert_outcomes(passed=4)
    for cell_id in ("decode-fp16-tp2-eager-cpu", "decode-bf16-tp2-eager-cpu", "decode-fp16-tp4-eager-cpu",
                    "decode-bf16-tp4-eager-cpu"):
        facts = cells[cell_id]["facts"]
        assert facts["ranks"] == int(cell_id.split("-tp")[1][0]) and facts["worker_starts"] == 1, (cell_id, facts)


@cpu_machine_only
def test_split_point_from_a_constant_fails_only_under_tp(pytester):
    plan = silu_plan(pytester.path, kernel="tests.broken.silu_and_mul_bugs:d_from_plan_constant")
    result, cells = _run(pytester, plan)
    result.assert_outcomes(passed=1, failed=2)
    assert cells["decode-fp32-tp1-eager-cpu"]["status"] == "passed"
    for size in (2, 4):
        cell = cells[f"decode-fp32-tp{size}-eager-cpu"]
        assert cell["status"] == "failed" and "output 'out'" in cell["reason"], cell
        assert cell["minimal_example"].startswith("num_tokens="), cell


FAULTS = '''
import os
import signal
import time

import torch
import torch.distributed as dist

from kernels.rms_norm import rms_norm


def faulty_on_rank1(out, x, weight, eps):
    """Right on rank 0; on rank 1 it hangs for fp32 and raises for fp16."""
    if dist.is_initialized() and dist.get_rank() == 1:
        if x.dtype == torch.float32:
            time.sleep(600)
        if x.dtype == torch.float16:
            raise RuntimeError("planted failure on rank 1")
    rms_norm(out, x, weight, eps)


def crashes_on_rank1(out, x, weight, eps):
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    rms_norm(out, x, weight, eps)
'''


@cpu_machine_only
def test_a_rank_that_hangs_or_raises_fails_its_cell_and_the_next_cell_runs(pytester):
    (pytester.path / "tp_faults.py").write_text(FAULTS)
    pytester.syspathinsert()
    # sequence parallel: the cell that passes also shows tokens split across ranks and put back in order
    plan = rms_norm_plan(pytester.path, "tp_faults:faulty_on_rank1",
                         matrix={"dtype": ["fp32", "fp16", "bf16"], "tp": [2]},
                         numerics={"examples": 4, "max_num_seqs": 8, "timeout_s": 6},
                         tp={"kind": "trivial", "sequence_parallel": True})
    result, cells = _run(pytester, plan)
    result.assert_outcomes(passed=1, failed=2)
    hung = cells["decode-fp32-tp2-eager-cpu"]
    assert hung["reason"].startswith("no example finished within 6 s (numerics.timeout_s); 0 examples had finished: "
                                     "rank 1 of 2 did not return"), hung
    assert "tp_faults.py" in hung["reason"] and "in faulty_on_rank1" in hung["reason"], hung
    raised = cells["decode-fp16-tp2-eager-cpu"]
    assert "rank 1 of 2: the kernel raised RuntimeError: planted failure on rank 1" in raised["reason"], raised
    result.stdout.fnmatch_lines(["*rank 1 of 2:*", "*Traceback (most recent call last):*",
                                 '*tp_faults.py", line *, in faulty_on_rank1*'])
    fine = cells["decode-bf16-tp2-eager-cpu"]
    assert fine["status"] == "passed", fine
    assert fine["facts"]["worker_starts"] == 3  # a fresh group after the hang and after the raise


@cpu_machine_only
def test_a_rank_that_crashes_fails_the_cell_and_leaves_no_process(tmp_path, monkeypatch):
    from harness.runtime.runner import RunSettings
    from harness.runtime.tasks import CellTask
    from harness.runtime.tp import run_cell_on_rank
    from harness.runtime.workers import Fault, WorkerGroup

    (tmp_path / "tp_faults.py").write_text(FAULTS)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned ranks inherit sys.path
    plan = rms_norm_plan(tmp_path, "tp_faults:crashes_on_rank1", matrix={"tp": [2]},
                         numerics={"examples": 2, "max_num_seqs": 8}, tp={"kind": "trivial"})
    group = WorkerGroup(2)
    try:
        task = CellTask.load(plan, "decode-fp32-tp2-eager-cpu", RunSettings(2, "ci", None))
        outcome = group.call(run_cell_on_rank, task, timeout_s=120)
    finally:
        group.stop()
    assert isinstance(outcome, Fault), outcome
    assert outcome.reason.startswith("rank 1 of 2 was killed by SIGSEGV (segmentation fault"), outcome
    assert outcome.facts == {"ranks": 2, "backend": "gloo", "worker_starts": 1}
    assert multiprocessing.active_children() == []
    assert _spawned_descendants() == []


def test_fewer_kv_heads_than_ranks_are_replicated_as_vllm_does():
    """RoPE at tp4 with 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 head 1; each rank its own query heads."""
    from pathlib import Path

    plan = load_plan(Path(__file__).resolve().parents[1] / "kernels" / "plans" / "rotary_embedding.yaml")
    ex = Example(num_tokens=3, sizes={"num_heads": 8, "num_kv_heads": 2, "head_size": 64, "rotary_dim": 64,
                                      "max_position": 4096}, seed=1)
    full = build_args(plan, Cell("decode", "fp32", 4, "eager", "cpu"), ex, "cpu")
    local = [tp.local_values(plan, ex, full, r, 4) for r in range(4)]
    assert [v["key"].shape[1] for v in local] == [64] * 4 and [v["query"].shape[1] for v in local] == [128] * 4
    assert torch.equal(local[0]["key"], local[1]["key"]) and torch.equal(local[2]["key"], local[3]["key"])
    assert not torch.equal(local[1]["key"], local[2]["key"])
    assert torch.equal(tp.recombine(plan, "key", [v["key"] for v in local], 3, ex.sizes), full["key"])
    local[3]["key"][0, 0] += 1  # a replica that disagrees
    with pytest.raises(Mismatch, match="replicated across ranks"):
        tp.recombine(plan, "key", [v["key"] for v in local], 3, ex.sizes)

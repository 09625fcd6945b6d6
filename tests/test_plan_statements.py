"""What a plan and a run state in words and numbers: a value scale's magnitudes and an attention example's sequence
lengths in its minimal example, `name: null` on an argument only the kernel takes, the two commits a run names (the
harness's and the plan's), and an attention native that computes in the activation dtype raising no upcast
warning. On a CPU machine."""

from __future__ import annotations

import pickle
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from harness.vllm.op_source import custom_op_source
from harness.results.store import Provenance, Status, load
from harness.runtime import device
from harness.runtime.check_code import plan_code_warnings
from harness.runtime.inputs import Example, build_args, examples, scale_words
from harness.runtime.modes import as_custom_op
from harness.runtime.resolve import resolve
from harness.runtime.runner import RunSettings, run_cell
from harness.runtime.tasks import CellTask
from harness.runtime.upcast import upcast_warnings
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from harness.plan.vocabulary import VALUE_SCALES
from tests.plans import cpu_machine_only, rms_norm_plan, write_plan
from tests.test_report import cell as cell_record, machine, render, write_results

ROOT = Path(__file__).resolve().parents[1]
PAGED = ROOT / "kernels" / "plans" / "paged_attention.yaml"
CPU_DECODE = Cell("decode", "fp32", 1, "eager", "cpu")


# ---------------------------------------------------------------- value scales in numbers


def _numbers(words: str) -> dict[str, float]:
    """The magnitudes a scale's words give: its multiplier, and for outliers 1 in N elements times F, for zero rows the
    probability."""
    found = {"times": float(m.group(1)) if (m := re.match(r"([\d.e-]+)\*N\(0,1\)", words)) else 1.0}
    if m := re.search(r"~1 in (\d+) elements times ([\d.]+)", words):
        found["every"], found["factor"] = float(m.group(1)), float(m.group(2))
    if m := re.search(r"each row zero with probability ([\d.]+)", words):
        found["zero_rows"] = float(m.group(1))
    return found


@pytest.mark.parametrize("scale", VALUE_SCALES)
def test_a_value_scales_words_give_the_magnitudes_it_draws(tmp_path, scale):
    """The minimal example names its scale in numbers (`scale=large (100*N(0,1))`), and the numbers are the draw's:
    the spread of the values, how many are outliers and by how much, how many rows are zero."""
    plan = load_plan(rms_norm_plan(tmp_path, hidden=(512,)))
    ex = Example(num_tokens=256, sizes={"hidden": 512}, scale=scale, seed=3)
    words = scale_words(scale)
    assert f"scale={scale} ({words})" in ex.describe(), ex.describe()
    x = build_args(plan, CPU_DECODE, ex, "cpu")["x"]
    said = _numbers(words)
    rows = x.abs().amax(dim=1) > 0
    zero = 1 - rows.float().mean().item()
    assert abs(zero - said.get("zero_rows", 0.0)) < 0.1, (words, zero)
    values = x[rows] / said["times"]
    big = values.abs() > 8  # beyond any standard normal draw of this many: only outliers get there
    assert abs(big.float().mean().item() - 1 / said.get("every", float("inf"))) < 0.004, (words, big.float().mean())
    plain = values[~big]
    assert 0.9 < plain.std().item() < 1.1, (words, plain.std())
    if "factor" in said:
        assert 0.5 * said["factor"] < values[big].abs().median().item() < 2 * said["factor"], words


def test_the_readme_gives_each_value_scale_in_the_numbers_the_draw_uses():
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    missing = [s for s in VALUE_SCALES if f"{s} ({scale_words(s)})" not in readme]
    assert not missing, f"the README's value scales differ from harness.runtime.inputs.scale_words: {missing}"


# ---------------------------------------------------------------- an attention example's sequence lengths


def _said_lengths(words: str) -> list[int]:
    return [int(n) for n in re.search(r"seq_lens=\[([\d, ]+)", words).group(1).split(",") if n.strip()]


@pytest.mark.parametrize("phase", ["decode", "prefill", "chunked_prefill"])
def test_an_attention_example_says_the_sequence_lengths_its_inputs_are_built_from(phase):
    """Drawn, shrunk (a field replaced) and sent to another process (pickled), an example's words give the lengths of
    the seq_lens tensor the kernel is passed."""
    plan = load_plan(PAGED)
    cell = Cell(phase, "fp32", 1, "eager", "cpu")
    seen = []

    @settings(max_examples=6, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(examples(plan, cell, "cpu"))
    def check(ex):
        for candidate in (ex, replace(ex, seed=ex.seed + 1), pickle.loads(pickle.dumps(ex)),
                          replace(ex, num_tokens=max(ex.decode_tokens + 1, ex.num_tokens // 2))):
            built = build_args(plan, cell, candidate, "cpu")["seq_lens"].tolist()
            words = candidate.describe()
            shown = _said_lengths(words)
            assert shown == built[:len(shown)], (words, built)
            assert len(shown) == len(built) or f"({len(built)} sequences)" in words, (words, built)
            seen.append(words)

    check()
    assert seen


def test_an_example_of_an_op_without_sequence_inputs_says_no_lengths(tmp_path):
    plan = load_plan(rms_norm_plan(tmp_path))

    @settings(max_examples=3, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(examples(plan, CPU_DECODE, "cpu"))
    def check(ex):
        assert "seq_lens" not in ex.describe()

    check()


def attends_whole_blocks(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale):
    """Paged attention with one bug: each sequence attends over whole blocks (its length rounded up to the block
    size), so only a length that is not a multiple of the block size shows it."""
    from kernels.paged_attention import paged_attention_ref

    block = key_cache.shape[1]
    # rounding the length up moves every query's position as well: keep the query tokens' positions as drawn
    padded = (seq_lens + block - 1) // block * block
    out.copy_(paged_attention_ref(query, key_cache, value_cache, block_tables, padded, query_start_loc, scale))


@cpu_machine_only
def test_an_attention_failures_minimal_example_says_its_sequence_lengths(tmp_path):
    path = write_plan(tmp_path / "paged.yaml", PAGED,
                      op={"kernel": "tests.test_plan_statements:attends_whole_blocks"},
                      matrix={"phase": ["decode"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"],
                              "sm": ["cpu"]}, exclude=None, tp=None, vllm=None, benchmark=None)
    rec = run_cell(CellTask.load(path, "decode-fp32-tp1-eager-cpu", RunSettings(10, "ci", None))).record
    assert rec.status == Status.FAILED, rec.reason
    lengths = _said_lengths(rec.minimal_example)
    assert any(n % 16 for n in lengths), rec.minimal_example  # where whole blocks differ from the sequence
    assert re.search(r"scale=\w+ \([\d.*]*N\(0,1\)", rec.minimal_example), rec.minimal_example


# ---------------------------------------------------------------- `name: null`: an argument only the kernel takes


def doubled_into(out, x, k_scale=None):
    """A kernel with an argument only it takes (a quantized cache's scale, say): a plan stating `k_scale: null`
    passes it None."""
    if k_scale is not None:
        raise AssertionError("the plan states k_scale: null, so the kernel is passed None")
    out.copy_(x * 2)


def doubled(x, k_scale=None):
    if k_scale is not None:
        raise AssertionError("the plan states k_scale: null, so the kernel is passed None")
    return x * 2


def doubled_ref(x):
    """The reference: its signature has no k_scale, so it is not given one."""
    return x * 2


def doubled_ref_taking_k_scale(x, k_scale=None):
    return x * 2


def kernel_only_plan(tmp_path: Path, k_scale: bool = True, name: str = "kernel_only", functional: bool = False,
                     reference: str = "tests.test_plan_statements:doubled_ref") -> Path:
    args = {} if functional else {"out": {"shape": ["num_tokens", "hidden"], "dtype": "act", "role": "output"}}
    args["x"] = {"shape": ["num_tokens", "hidden"], "dtype": "act"}
    if k_scale:
        args["k_scale"] = None
    op = {"name": name, "intent": "drop-in",
          "kernel": f"tests.test_plan_statements:{'doubled' if functional else 'doubled_into'}",
          "reference": reference, "args": args, "outputs": ["y" if functional else "out"], "sizes": {"hidden": [32]}}
    matrix = {"phase": ["decode"], "dtype": ["fp32"], "tp": [1], "graph_mode": ["eager"], "sm": ["cpu"]}
    return write_plan(tmp_path / f"{name}.yaml", {"op": op, "matrix": matrix}, numerics={"examples": 6})


def test_an_argument_the_plan_states_null_goes_to_the_kernel_as_none_and_not_to_the_reference(tmp_path):
    plan = load_plan(kernel_only_plan(tmp_path))
    assert resolve(plan).warnings == []  # a statement: nothing to warn of
    assert "Tensor? k_scale" in plan.schema()


@cpu_machine_only
def test_a_cell_of_a_plan_stating_a_kernel_only_argument_passes(tmp_path):
    rec = run_cell(CellTask.load(kernel_only_plan(tmp_path), "decode-fp32-tp1-eager-cpu",
                                 RunSettings(6, "ci", None))).record
    assert rec.status == Status.PASSED, rec.reason


def test_the_warning_that_suggests_null_says_it_silences_itself_and_is_silenced(tmp_path):
    without = load_plan(kernel_only_plan(tmp_path, k_scale=False))
    warned = resolve(without).warnings
    assert len(warned) == 1 and "the kernel's optional argument k_scale (default None)" in warned[0], warned
    assert "`k_scale: null` if only the kernel takes it" in warned[0] and "this warning is silenced" in warned[0]
    assert resolve(load_plan(kernel_only_plan(tmp_path, name="stated"))).warnings == []


def test_null_on_an_argument_the_reference_takes_too_is_still_warned(tmp_path):
    """The op takes the argument: pinning it leaves the kernel's path with a value untested."""
    plan = load_plan(kernel_only_plan(tmp_path, reference="tests.test_plan_statements:doubled_ref_taking_k_scale"))
    warned = resolve(plan).warnings
    assert len(warned) == 1 and "op.args.k_scale: the kernel's optional argument is pinned to null and the " \
                                "reference takes it too" in warned[0], warned


def test_the_torch_library_fakes_call_the_reference_without_a_kernel_only_argument(tmp_path):
    """The harness's own custom op (torch_compile cells) and the generated one (the page, the vLLM plugin) both
    compute their fake from the reference, which is not given k_scale."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    plan = load_plan(kernel_only_plan(tmp_path, name="kernel_only_functional", functional=True))
    op = as_custom_op(plan, doubled)
    x = torch.randn(3, 32)
    with FakeTensorMode() as mode:
        assert op(mode.from_tensor(x), None).shape == (3, 32)
    generated = load_plan(kernel_only_plan(tmp_path, name="kernel_only_generated", functional=True))
    namespace: dict = {}
    exec("\n".join(custom_op_source(generated)), namespace)  # registers tests::kernel_only_generated
    with FakeTensorMode() as mode:
        assert torch.ops.tests.kernel_only_generated(mode.from_tensor(x), None).shape == (3, 32)
    assert torch.equal(torch.ops.tests.kernel_only_generated(x, None), x * 2)


# ---------------------------------------------------------------- an attention native in the activation dtype


def _heads_first(*ts):
    return [t.transpose(0, 1) for t in ts]  # [num_tokens, heads, head_size] -> [heads, num_tokens, head_size]


def attention_ref(q, k, v):
    """The accuracy oracle, in fp32 (upcasting is its right)."""
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) / q.shape[-1] ** 0.5
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v.float()).to(q.dtype)


def attention_4d(q, k, v):
    """SDPA on 4-D inputs in the activation dtype: what a model runs."""
    q, k, v = (t[None] for t in _heads_first(q, k, v))
    return F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1)


def attention_3d(q, k, v):
    """SDPA on 3-D inputs: PyTorch's CPU takes its math path here, which computes in fp32 inside."""
    return F.scaled_dot_product_attention(*_heads_first(q, k, v)).transpose(0, 1)


def attention_upcast(q, k, v):
    """A real upcast in the user's code: SDPA on fp32 copies."""
    q, k, v = (t[None].float() for t in _heads_first(q, k, v))
    return F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1).to(v.dtype)


def attention_plan(tmp_path: Path, native: str) -> Path:
    qkv = {"shape": ["num_tokens", "num_heads", "head_size"], "dtype": "act"}
    op = {"name": "attention", "intent": "drop-in", "kernel": f"tests.test_plan_statements:{native}",
          "reference": "tests.test_plan_statements:attention_ref", "native": f"tests.test_plan_statements:{native}",
          "args": {"q": qkv, "k": qkv, "v": qkv}, "outputs": ["out"],
          "sizes": {"num_heads": [2], "head_size": [16]}}
    matrix = {"phase": ["decode"], "dtype": ["bf16", "fp32"], "tp": [1], "graph_mode": ["eager"], "sm": ["cpu"]}
    return write_plan(tmp_path / f"{native}.yaml", {"op": op, "matrix": matrix})


@pytest.mark.parametrize("native", ["attention_4d", "attention_3d"])
def test_an_attention_native_in_the_activation_dtype_is_not_warned_whatever_path_pytorch_takes(tmp_path, native):
    """PyTorch's CPU attention computes in fp32 inside its math path (3-D inputs; a 4-D call on a torch whose CPU
    flash kernel does not take it, forced here), a GPU's kernels do not: only the user's own upcast counts."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    plan = load_plan(attention_plan(tmp_path, native))
    assert plan_code_warnings(plan) == []
    with sdpa_kernel(SDPBackend.MATH):
        assert upcast_warnings(plan) == []


def test_an_attention_native_that_upcasts_its_inputs_is_warned(tmp_path):
    plan = load_plan(attention_plan(tmp_path, "attention_upcast"))
    warned = upcast_warnings(plan)
    said = "op.native computes in float32 on bf16 activations (aten.scaled_dot_product_attention in float32)"
    assert len(warned) == 1 and said in warned[0], warned


def test_the_bundled_paged_attentions_native_is_not_warned_on_the_math_path():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        assert upcast_warnings(load_plan(PAGED)) == []


# ---------------------------------------------------------------- the harness's commit and the plan's


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=folder,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_a_run_names_the_harness_commit_and_the_plan_repository_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_COMMIT", raising=False)
    tool = device._git_commit(device.TOOL_ROOT)
    own = tmp_path / "own"
    own.mkdir()
    rms_norm_plan(own)
    _git(own, "init", "-q")
    _git(own, "add", "plan.yaml")
    _git(own, "commit", "-q", "-m", "a plan")
    prov = device.provenance(own, "plan.yaml")
    assert prov.commit == _git(own, "rev-parse", "--short=12", "HEAD") and prov.tool_commit == tool, prov
    assert prov.commit_words() == f"harness commit {tool}, plan commit {prov.commit}"
    loose = tmp_path / "loose"  # a plan in no repository (tmp_path is in none)
    loose.mkdir()
    rms_norm_plan(loose)
    if device._toplevel(loose) is None:
        prov = device.provenance(loose, "plan.yaml")
        assert prov.commit is None and prov.tool_commit == tool
        assert prov.commit_words() == f"harness commit {tool}, plan commit none (not in a git repository)"
    bundled = device.provenance(device.TOOL_ROOT, "plan.yaml")  # the harness's own repository holds it
    assert bundled.commit == bundled.tool_commit == tool and bundled.commit_words() == f"commit {tool}"


def test_harness_commit_names_the_tool_and_not_a_plan_of_its_own_repository(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_COMMIT", "feedc0ffee12")
    own = tmp_path / "own"
    own.mkdir()
    rms_norm_plan(own)
    _git(own, "init", "-q")
    _git(own, "add", "plan.yaml")
    _git(own, "commit", "-q", "-m", "a plan")
    prov = device.provenance(own, "plan.yaml")
    assert prov.tool_commit == "feedc0ffee12" and prov.commit == _git(own, "rev-parse", "--short=12", "HEAD")
    bundled = device.provenance(device.TOOL_ROOT, "plan.yaml")
    assert bundled.commit == bundled.tool_commit == "feedc0ffee12"


def test_the_page_names_both_commits_where_they_differ_and_reads_old_records_as_before(tmp_path):
    plan = load_plan(ROOT / "plan.yaml")
    op_dir = tmp_path / "reports" / "rms_norm"
    cells = {"decode-bf16-tp1-eager-cpu": cell_record("decode-bf16-tp1-eager-cpu", "passed")}
    write_results(op_dir, "cpu.json", "rms_norm", "old", machine("cpu", "laptop"), cells)
    results = load(op_dir / "results" / "cpu.json")
    assert results.runs["old"].tool_commit is None  # a record from before the field: read, with its default
    text = render(plan, op_dir)
    assert "laptop (x86_64), commit abc123def456, " in text and "harness commit" not in text
    write_results(op_dir, "cpu.json", "rms_norm", "new", {**machine("cpu", "laptop"), "tool_commit": "0123456789ab"},
                  cells)
    assert load(op_dir / "results" / "cpu.json").runs["new"].tool_commit == "0123456789ab"
    text = render(plan, op_dir)
    assert "laptop (x86_64), harness commit 0123456789ab, plan commit abc123def456, " in text  # provenance line
    assert re.search(r"\| yes +\| harness commit 0123456789ab, plan commit abc123def456 \|", text)  # machines table
    assert "laptop (x86_64, harness commit 0123456789ab, plan commit abc123def456)" in text  # the support matrix
    assert load(op_dir / "results" / "cpu.json").runs["new"].tool_commit == "0123456789ab"  # kept when re-stamped
    prov = Provenance("cpu", "cpu", "x86_64", 0, 2, commit="abc", tool_commit="abc")
    assert prov.commit_words() == "commit abc"  # one repository: one commit, as before

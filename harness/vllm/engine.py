"""A running vLLM engine: the generated plugins loaded by vLLM's plugin mechanism, called inside a real forward.

An engine item starts vLLM's engine on a tiny Llama whose config.json and seeded dummy weights are
written here (no tokenizer: nothing is downloaded), serves several concurrent requests of different lengths, so
that the scheduler runs prefill-only, mixed (decode tokens with a prefill chunk) and decode-only
steps, and compares the greedy tokens with a run of the same engine without the plugins.

The plugins reach the engine's processes as vLLM expects of an installed package: each generated
plugin module, with a `vllm.general_plugins` entry point in a `.dist-info` beside it, lies in a
folder on the engine's PYTHONPATH, and VLLM_PLUGINS names the plugins to load. A second plugin,
harness.vllm.engine_probe, counts the kernel's calls in those processes, by forward step.

Each engine runs in a Python process of its own (`python -m harness.vllm.engine SPEC`): vLLM
starts its engine core by spawn, which needs a main module of its own, and a fresh process keeps
this one's imports and plugins out of it. One start serves every op whose plugin it loads.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.vllm.engine_probe import PROBE_ENV
from harness.vllm.plugin_source import render_plugin
from harness.results.store import EngineOutcome, IntegrationRecord, Status
from harness.runtime.device import detect, package_version
from harness.runtime.vllm_compiled import vllm_missing
from harness.plan.model import Plan
from harness.vllm_facts.attention_layout import ROUTE as ATTENTION_ROUTE
from harness.vllm_facts.defaults import INDUCTOR_OFF, INDUCTOR_ON
from harness.vllm_facts.names import layer_class, oot_flag, plugin_module_name, plugin_route, provider_name, unsupported

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"engine": 1}

# A Llama small enough to start in about 40 s on a 2-core CPU machine (the heads and sizes of a real one, scaled
# down). Its weights are drawn from a seed and written beside the config (write_model): vLLM's own dummy weights
# (uniform in +-1e-3) make every logit nearly equal, so no kernel, however wrong, would change a greedy token.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
}
# Prompts of different lengths and different numbers of new tokens. With at most 4 sequences and 48 tokens per
# step, the first step is prefill only, later ones decode some requests while prefilling (chunks of) others, and
# the last ones decode only.
PROMPT_LENGTHS = (5, 23, 41, 9, 64, 17)
NEW_TOKENS = (12, 6, 9, 16, 5, 10)
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, MAX_MODEL_LEN = 4, 48, 256
TOP_LOGPROBS = 5  # how many candidates per position a run returns, for the comparison of two runs
STEP_KINDS = ("prefill", "mixed", "decode")
ENGINE_TIMEOUT_S = 600
GPU_MEMORY_UTILIZATION, KV_CACHE_BYTES = 0.05, 256 * 2**20  # on a GPU: 7 GiB of an H200's 141 at most
# vLLM's profiles, as an engine item runs them on a GPU: Inductor on (vLLM's default) and off.
PROFILES = {INDUCTOR_ON: True, INDUCTOR_OFF: False}


@dataclass(frozen=True)
class EngineSpec:
    """One engine run, as its process reads it: the model folder, the plugin folders, what to select."""

    model_dir: str
    out: str
    probe_dir: str = ""
    plugin_paths: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()  # entry-point names for VLLM_PLUGINS
    probe_ops: dict = field(default_factory=dict)  # generated plugin module -> op name
    ir_op_priority: dict = field(default_factory=dict)
    custom_ops: tuple[str, ...] = ()
    dtype: str = "bfloat16"
    cuda_graphs: bool = False  # True on a GPU: vLLM captures its CUDA graphs (enforce_eager=False)
    inductor: bool = True  # False: vLLM's "Inductor off" profile (Dynamo's graph, run without Inductor)
    # vLLM's TRITON_ATTN where its FlashAttention extensions are not installed, CUSTOM for a plugin's attention
    # backend on a GPU (attention_selection; "" lets vLLM choose)
    attention_backend: str = ""
    profile_dir: str = ""  # on a GPU: torch profiler traces of the served steps, to count the kernel's launches
    # vLLM's engine core and its worker in the LLM's own process, not one process each as vLLM starts them: for an
    # engine whose tokens alone are read (vLLM without the plugins), the same computation, two imports of vLLM fewer.
    one_process: bool = False


@dataclass
class EngineRun:
    """What one engine run returned: per request its greedy tokens and top log-probabilities, and the calls the
    probe counted while the requests were served (op -> step kind -> calls)."""

    tokens: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[dict[int, float]]] = field(default_factory=list)
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    calls_outside_forward: dict[str, int] = field(default_factory=dict)
    startup_calls: dict[str, int] = field(default_factory=dict)
    steps_seen: dict[str, int] = field(default_factory=dict)  # step kind -> kernel calls of any op (workload check)
    counted_by: str = "probe"  # "probe": Python calls of the kernel; "profiler": its GPU launches, replays included
    start_s: float = 0.0
    serve_s: float = 0.0
    attention_backend: str = ""  # the backend asked of vLLM ("": its own choice)
    error: str = ""


def write_model(model_dir: Path, seed: int = 0) -> None:
    """The tiny Llama's config.json and seeded weights (model.safetensors, Hugging Face's Llama names): linear
    layers scaled by their fan-in so activations stay near 1, norm weights between 0.5 and 1.5 (so a kernel that
    drops the weight is seen), and an output head whose logits spread over several units (so a greedy token is
    decided by a margin, not by rounding)."""
    import torch
    from safetensors.torch import save_file

    cfg = TINY_LLAMA
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head = hidden // cfg["num_attention_heads"]
    gen = torch.Generator().manual_seed(seed)

    def linear(rows, cols, gain=1.0):
        return (torch.randn(rows, cols, generator=gen) * gain / cols ** 0.5).to(torch.bfloat16)

    def norm():
        return (0.5 + torch.rand(hidden, generator=gen)).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16),
               "model.norm.weight": norm(), "lm_head.weight": linear(vocab, hidden, gain=4.0)}
    for i in range(cfg["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        weights |= {
            f"{layer}.input_layernorm.weight": norm(), f"{layer}.post_attention_layernorm.weight": norm(),
            f"{layer}.self_attn.q_proj.weight": linear(hidden, hidden),
            f"{layer}.self_attn.k_proj.weight": linear(cfg["num_key_value_heads"] * head, hidden),
            f"{layer}.self_attn.v_proj.weight": linear(cfg["num_key_value_heads"] * head, hidden),
            f"{layer}.self_attn.o_proj.weight": linear(hidden, hidden),
            f"{layer}.mlp.gate_proj.weight": linear(inter, hidden),
            f"{layer}.mlp.up_proj.weight": linear(inter, hidden),
            f"{layer}.mlp.down_proj.weight": linear(hidden, inter)}
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights, str(model_dir / "model.safetensors"))


def workload(seed: int = 0) -> list[list[int]]:
    """The requests' prompt token ids (drawn once from a seed, above the special tokens)."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, TINY_LLAMA["vocab_size"]) for _ in range(n - 1)] for n in PROMPT_LENGTHS]


# ---------------------------------------------------------------- the engine's process


def _serve(spec: EngineSpec) -> EngineRun:
    """Start the engine, serve the workload, read the probe's counts. Runs in the engine's own process."""
    from vllm import LLM, SamplingParams

    run = EngineRun()
    start = time.monotonic()
    compilation = {"custom_ops": list(spec.custom_ops)} if spec.custom_ops else {}
    if not spec.inductor:
        compilation["backend"] = "eager"
    kwargs = {"compilation_config": compilation} if compilation else {}
    if spec.ir_op_priority:
        kwargs["ir_op_priority"] = spec.ir_op_priority
    if spec.one_process:
        kwargs["distributed_executor_backend"] = "uni"
    if spec.attention_backend:
        kwargs["attention_backend"] = spec.attention_backend
    if spec.cuda_graphs:
        # A small, fixed KV cache: two engines start side by side, and other plans' runs may share the GPU; vLLM
        # refuses to start where less than gpu_memory_utilization x total is free.
        kwargs |= {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION, "kv_cache_memory_bytes": KV_CACHE_BYTES}
    if spec.profile_dir:
        kwargs["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": spec.profile_dir,
                                     "torch_profiler_use_gzip": False, "torch_profiler_with_stack": False}
    llm = LLM(model=spec.model_dir, load_format="safetensors", skip_tokenizer_init=True, dtype=spec.dtype, seed=0,
              max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
              enforce_eager=not spec.cuda_graphs, **kwargs)
    run.start_s = round(time.monotonic() - start, 1)
    before = _probe_lines(spec.probe_dir)  # start-up: profiling and warm-up forwards
    params = [SamplingParams(max_tokens=n, temperature=0.0, logprobs=TOP_LOGPROBS, detokenize=False, ignore_eos=True)
              for n in NEW_TOKENS]
    start = time.monotonic()
    if spec.profile_dir:
        llm.start_profile()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in workload()], params, use_tqdm=False)
    if spec.profile_dir:
        llm.stop_profile()
    run.serve_s = round(time.monotonic() - start, 1)
    for out in outputs:
        completion = out.outputs[0]
        run.tokens.append(list(completion.token_ids))
        run.top_logprobs.append([{int(t): float(lp.logprob) for t, lp in pos.items()}
                                 for pos in completion.logprobs or []])
    after = _probe_lines(spec.probe_dir)
    for line in [line for path, lines in after.items() for line in lines[len(before.get(path, [])):]]:
        if not line["in_forward"] or line["step"] in ("outside forward", "dummy", "capture"):
            run.calls_outside_forward[line["op"]] = run.calls_outside_forward.get(line["op"], 0) + 1
            continue
        per_op = run.calls.setdefault(line["op"], {})
        per_op[line["step"]] = per_op.get(line["step"], 0) + 1
        run.steps_seen[line["step"]] = run.steps_seen.get(line["step"], 0) + 1
    for line in [line for lines in before.values() for line in lines]:
        run.startup_calls[line["op"]] = run.startup_calls.get(line["op"], 0) + 1
    if spec.profile_dir:  # the launches a replayed CUDA graph makes never reach Python: count them on the GPU
        run.calls, run.steps_seen = launches_by_step(spec.profile_dir, _triton_kernel_names(spec.probe_ops))
        run.counted_by = "profiler"
    return run


def _triton_kernel_names(probe_ops: dict) -> dict[str, str]:
    """The GPU kernel names of each plugin's kernel (the @triton.jit functions of its module) -> op name."""
    import inspect

    from triton.runtime.jit import JITFunction, KernelInterface

    names = {}
    for module_name, op in probe_ops.items():
        kernel = inspect.unwrap(getattr(importlib.import_module(module_name).kernel, "fn", None) or (lambda: None))
        for obj in vars(inspect.getmodule(kernel) or object).values():  # the module the launcher was written in
            while isinstance(obj, KernelInterface) and not isinstance(obj, JITFunction):
                obj = getattr(obj, "fn", None)  # autotune / heuristics wrap a JITFunction
            if isinstance(obj, JITFunction):
                names[obj.fn.__name__] = op
    return names


# vLLM's worker names each profiled step "execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>)"
# (vllm/v1/worker/gpu_worker.py, annotate_profile).
STEP_ANNOTATION = re.compile(r"execute_context_(\d+)\(\d+\)_generation_(\d+)\(")


def launches_by_step(profile_dir: str, kernel_names: dict[str, str]) -> tuple[dict, dict]:
    """From the torch profiler traces vLLM's worker wrote: per op, the GPU launches of its kernels by step kind, and
    per step kind the steps served. A kernel belongs to the step whose annotation encloses its launch on the host
    (a CUDA graph's kernels share the launch of their graph)."""
    calls, steps = {}, {}
    for path in sorted(Path(profile_dir).glob("*.pt.trace.json")):
        events = json.loads(path.read_text()).get("traceEvents", [])
        spans = []
        for e in events:
            m = STEP_ANNOTATION.match(str(e.get("name", ""))) if e.get("cat") == "user_annotation" else None
            if m:
                prefills, decodes = int(m.group(1)), int(m.group(2))
                kind = "mixed" if prefills and decodes else "prefill" if prefills else "decode" if decodes else ""
                if kind:
                    spans.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), kind))
                    steps[kind] = steps.get(kind, 0) + 1
        # Launches through the runtime (cudaLaunchKernel, cudaGraphLaunch) or the driver (Triton's cuLaunchKernel).
        launched = {e["args"]["correlation"]: float(e["ts"]) for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        for e in events:
            op = kernel_names.get(str(e.get("name", ""))) if e.get("cat") == "kernel" else None
            ts = launched.get(e.get("args", {}).get("correlation")) if op else None
            kind = next((k for lo, hi, k in spans if ts is not None and lo <= ts <= hi), None)
            if kind:
                per_op = calls.setdefault(op, {})
                per_op[kind] = per_op.get(kind, 0) + 1
    return calls, steps


def _probe_lines(probe_dir: str) -> dict[str, list[dict]]:
    """Every call the probe wrote so far, per file: one per engine process that called a kernel."""
    if not probe_dir:
        return {}
    return {str(path): [json.loads(t) for t in path.read_text().splitlines() if t.strip()]
            for path in sorted(Path(probe_dir).glob("calls-*.jsonl"))}


def main(spec_path: str) -> int:
    spec = EngineSpec(**json.loads(Path(spec_path).read_text()))
    try:
        run = _serve(spec)
    except Exception as exc:  # the engine did not start or failed serving: said in words, not as a traceback
        run = EngineRun(error=f"{type(exc).__name__}: {str(exc).strip()[:1000]}")
    run.attention_backend = spec.attention_backend
    Path(spec.out).write_text(json.dumps(asdict(run)))
    return 0


# ---------------------------------------------------------------- the harness's side


# The CustomOp layers an unquantized Llama calls in its forward (QuantFP8 and the fused quant ops are not among them).
TINY_LLAMA_LAYERS = ("RMSNorm", "SiluAndMul", "RotaryEmbedding")


def engine_unsupported(plan: Plan) -> str:
    """Why the harness cannot put this plan's kernel into an engine ("" when it can)."""
    if not vllm_missing() and not unsupported(plan) and plugin_route(plan) == "custom_op" \
            and layer_class(plan) not in TINY_LLAMA_LAYERS:
        return (f"the tiny Llama the engine item serves has no {layer_class(plan)} (an unquantized model runs "
                f"{', '.join(TINY_LLAMA_LAYERS)}): the route items prove this op's route")
    if not vllm_missing() and not unsupported(plan) and plugin_route(plan) not in ("ir", "custom_op",
                                                                                     ATTENTION_ROUTE):
        return (f"the engine item drives the ir, custom_op and attention_backend routes; a {plugin_route(plan)} route "
                "needs a model whose checkpoint selects it")
    return vllm_missing() or unsupported(plan)


def selection(plans: list[Plan]) -> tuple[dict, tuple[str, ...]]:
    """The engine arguments that select every plan's kernel once its plugin is loaded: IR priorities for plugins
    on the IR route, `+<Layer>` in custom_ops for out-of-tree CustomOps (added to vLLM's default, not replacing it,
    so that every other layer runs as it does without the plugins)."""
    priority, custom_ops, layers = {}, [], {}
    for plan in plans:
        ir_op, layer = plan.vllm.ir_op, layer_class(plan)
        if plugin_route(plan) == ATTENTION_ROUTE:  # an attention backend: attention_selection
            continue
        if plugin_route(plan) == "ir":
            if ir_op in priority:
                raise ValueError(f"two plans provide vllm.ir.ops.{ir_op}: {layers[ir_op]} and {plan.op.name}")
            priority[ir_op], layers[ir_op] = [provider_name(plan), "native"], plan.op.name
        else:
            if layer in layers:
                raise ValueError(f"two plans replace vLLM's {layer}: {layers[layer]} and {plan.op.name}")
            custom_ops.append(oot_flag(plan))
            layers[layer] = plan.op.name
    return priority, tuple(custom_ops)


def attention_selection(plans: list[Plan], cuda_graphs: bool) -> str:
    """The attention backend to ask of vLLM for the plans' plugins: CUSTOM for a plugin's backend on a GPU; none on a
    CPU machine, where vLLM's CPU platform loads CPU_ATTN whatever is selected and the plugin registers over it ("":
    vLLM's choice). vLLM's block size stays its default: where the backend takes smaller blocks (the plan's), vLLM
    splits each of its blocks into the backend's kernel blocks (vllm/v1/worker/utils.py, select_common_block_size)."""
    attention = [p for p in plans if plugin_route(p) == ATTENTION_ROUTE]
    if len(attention) > 1:
        raise ValueError(f"two plans provide vLLM's attention backend: {attention[0].name} and {attention[1].name}")
    return "CUSTOM" if attention and cuda_graphs else ""


def attention_words(plan: Plan, cuda_graphs: bool) -> str:
    """How the engine selected a plan's attention backend, as its record says it ("" for other routes)."""
    if plugin_route(plan) != ATTENTION_ROUTE:
        return ""
    return "CUSTOM (the plugin's)" if cuda_graphs else \
        "the plugin's, registered over CPU_ATTN (vLLM's CPU platform loads CPU_ATTN whatever is selected)"


def _write_distribution(root: Path, module: str, entry_name: str, target: str, text: str | None) -> None:
    """A module (written from `text`, or an existing one when None) and a .dist-info naming its entry point."""
    if text is not None:
        (root / f"{module}.py").write_text(text)
    dist = root / f"{entry_name}-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {entry_name}\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{entry_name} = {target}\n")


PROBE_PLUGIN = "harness_engine_probe"


def engine_env(spec: EngineSpec) -> dict[str, str]:
    """The engine process's environment: its plugins on the path and named, nothing downloaded, a small KV cache,
    Triton's interpreter where there is no GPU (set before anything imports Triton)."""
    harness_root = str(Path(__file__).resolve().parents[2])
    path = [*spec.plugin_paths, harness_root, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_PLUGINS": ",".join(spec.plugins)}
    if not spec.cuda_graphs:
        env.setdefault("TRITON_INTERPRET", "1")
    if spec.probe_ops:
        env[PROBE_ENV] = json.dumps({"dir": spec.probe_dir, "ops": spec.probe_ops})
    if spec.one_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if spec.cuda_graphs and not _installed("flashinfer"):  # vLLM's GPU sampler imports FlashInfer unless told not to
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return env


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def attention_backend_here(cuda_graphs: bool) -> str:
    """TRITON_ATTN on a GPU where vLLM's FlashAttention extensions are not installed (vLLM would pick FLASH_ATTN on
    sm80+ and fail to load it), else "" (vLLM's own choice). Read from the files, without importing vLLM."""
    spec = importlib.util.find_spec("vllm") if cuda_graphs and _installed("vllm") else None
    if spec is None:
        return ""
    folders = [Path(p) / "vllm_flash_attn" for p in spec.submodule_search_locations or ()]
    extensions = [x for f in folders if f.is_dir() for x in f.glob("_vllm_fa*_C*")]
    return "" if extensions else "TRITON_ATTN"


def run_engine(plans: list[Plan], workdir: Path, cuda_graphs: bool, timeout_s: float = ENGINE_TIMEOUT_S,
               one_process: bool = False, inductor: bool = True) -> EngineRun:
    """One engine run in a process of its own, with the plans' plugins loaded and selected (none: vLLM as it is);
    `one_process`: vLLM's engine core and worker in that process too (EngineSpec.one_process); `inductor`: the
    profile."""
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = workdir / "model"
    write_model(model_dir)
    plugin_dir, probe_dir = workdir / "plugins", workdir / "calls"
    plugins, probe_ops = [], {}
    if plans:
        plugin_dir.mkdir()
        probe_dir.mkdir()
        for plan in plans:
            module = plugin_module_name(plan)
            _write_distribution(plugin_dir, module, plan.op.name, f"{module}:register", render_plugin(plan))
            plugins.append(plan.op.name)
            probe_ops[module] = plan.op.name
        _write_distribution(plugin_dir, "", PROBE_PLUGIN, "harness.vllm.engine_probe:register", None)
        plugins.append(PROBE_PLUGIN)
    priority, custom_ops = selection(plans)
    # Each plan's own folder, where its kernel module lies (the harness puts it on the import path the same way).
    kernel_dirs = sorted({str(Path(p.path).resolve().parent) for p in plans})
    spec = EngineSpec(str(model_dir), str(workdir / "run.json"), str(probe_dir) if plans else "",
                      (str(plugin_dir), *kernel_dirs) if plans else (), tuple(plugins), probe_ops, priority,
                      custom_ops, cuda_graphs=cuda_graphs, one_process=one_process, inductor=inductor,
                      attention_backend=attention_selection(plans, cuda_graphs) or attention_backend_here(cuda_graphs),
                      profile_dir=str(workdir / "profile") if plans and cuda_graphs else "")
    (workdir / "spec.json").write_text(json.dumps(asdict(spec)))
    with open(workdir / "engine.log", "w") as log:
        try:
            proc = subprocess.run([sys.executable, "-m", "harness.vllm.engine", str(workdir / "spec.json")],
                                  env=engine_env(spec), stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return EngineRun(error=f"the engine did not finish within {timeout_s:.0f} s (its log: "
                                   f"{workdir / 'engine.log'})")
    out = Path(spec.out)
    if not out.exists():
        return EngineRun(error=f"the engine's process exited with status {proc.returncode} before writing its "
                               f"results; the end of its log: {_log_tail(workdir / 'engine.log')}")
    data = json.loads(out.read_text())
    data["top_logprobs"] = [[{int(t): lp for t, lp in pos.items()} for pos in req] for req in data["top_logprobs"]]
    return EngineRun(**data)


def _log_tail(path: Path, lines: int = 8) -> str:
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


@contextlib.contextmanager
def engine_workdir(keep: Path | None = None):
    """A folder for one engine run's files: `keep` when given (kept for inspection), else a temporary one."""
    if keep is not None:
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="vllm-engine-") as tmp:
        yield Path(tmp)


# ---------------------------------------------------------------- comparing two runs


def compare_greedy(baseline: EngineRun, plugged: EngineRun) -> list[str]:
    """Where the run with the plugins departs from the run without them, as vLLM's own model tests compare two
    runs (tests/models/utils.py, check_logprobs_close): per request the greedy tokens match up to the first
    position where they differ; there each run's token must be among the other run's top candidates (a near tie
    that a 1-ulp difference flips), and the rest of the request is not compared. [] when the runs agree."""
    problems = []
    if len(baseline.tokens) != len(plugged.tokens):
        return [f"{len(plugged.tokens)} requests came back with the plugins, {len(baseline.tokens)} without"]
    for i, (want, got) in enumerate(zip(baseline.tokens, plugged.tokens)):
        if len(want) != len(got):
            problems.append(f"request {i}: {len(got)} tokens with the plugins, {len(want)} without")
            continue
        for pos, (a, b) in enumerate(zip(want, got)):
            if a == b:
                continue
            theirs, ours = baseline.top_logprobs[i][pos], plugged.top_logprobs[i][pos]
            if b not in theirs or a not in ours:
                problems.append(f"request {i} (prompt of {PROMPT_LENGTHS[i]} tokens), token {pos}: {b} with the "
                                f"plugins, {a} without, and {'neither' if b not in theirs and a not in ours else 'one'}"
                                f" is among the other run's top {TOP_LOGPROBS}")
            break
    return problems


def missing_calls(plugged: EngineRun, plans: list[Plan], anywhere: bool = False) -> list[str]:
    """The plans whose kernel the engine did not call in each step kind while serving. [] when all were called.

    `anywhere`: the calls were counted in Python under CUDA graphs (no profiler traces), where a replayed step runs
    the captured kernel without calling Python: there any call at all (capture included) counts."""
    problems = []
    for plan in plans:
        if anywhere:
            total = (sum(plugged.calls.get(plan.op.name, {}).values()) + plugged.startup_calls.get(plan.op.name, 0)
                     + plugged.calls_outside_forward.get(plan.op.name, 0))
            if not total:
                problems.append(f"{plan.op.name}: the engine never called the kernel, not even while capturing its "
                                "CUDA graphs")
            continue
        calls = plugged.calls.get(plan.op.name, {})
        absent = [k for k in STEP_KINDS if k in plugged.steps_seen and not calls.get(k)]
        if not calls:
            problems.append(f"{plan.op.name}: the engine served the requests without calling the kernel inside the "
                            f"model's forward ({plugged.calls_outside_forward.get(plan.op.name, 0)} calls elsewhere)")
        elif absent:
            problems.append(f"{plan.op.name}: the kernel was not called in {' or '.join(absent)} steps")
    return problems


def workload_problems(plugged: EngineRun) -> list[str]:
    """Step kinds the workload meant to exercise and the engine did not run."""
    absent = [k for k in STEP_KINDS if not plugged.steps_seen.get(k)]
    return [f"the engine ran no {' or '.join(absent)} step while serving the requests"] if absent else []


# ---------------------------------------------------------------- the engine item


ROUTE = "engine"
MODEL_WORDS = (f"a tiny Llama ({TINY_LLAMA['num_hidden_layers']} layers, hidden {TINY_LLAMA['hidden_size']}, "
               f"vocabulary {TINY_LLAMA['vocab_size']}), seeded random weights")


def item_name(sm: str, profile: str = "") -> str:
    slug = profile.lower().replace(" ", "_") + "-" if profile else ""  # "Inductor on" -> inductor_on
    return f"{ROUTE}[tiny_llama-{slug}{sm}]"


def engine_profiles(sm: str) -> tuple[str, ...]:
    """The profiles an engine item runs under: both of vLLM's on a GPU, where it compiles and captures CUDA graphs;
    on a CPU machine one eager engine ("")."""
    return tuple(PROFILES) if sm != "cpu" else ("",)


def serve_with_and_without(plans: list[Plan], workdir: Path, cuda_graphs: bool,
                           inductor: bool = True) -> tuple[EngineRun, EngineRun]:
    """The engine without the plugins and with them, side by side (each start waits mostly on its own processes).
    The one with the plugins runs as vLLM runs by default, its plugins loaded in the processes a deployment loads
    them in; the one without, whose tokens alone are read, in one process (27 s against 60 s on a 2-core CPU
    machine, the same tokens)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        baseline = pool.submit(run_engine, [], workdir / "without-plugins", cuda_graphs, one_process=True,
                               inductor=inductor)
        plugged = pool.submit(run_engine, plans, workdir / "with-plugins", cuda_graphs, inductor=inductor)
        return baseline.result(), plugged.result()


def engine_problems(plans: list[Plan], baseline: EngineRun, plugged: EngineRun, cuda_graphs: bool = False) -> list[str]:
    """Everything that makes the engine check fail, in words: an engine that did not serve, steps the workload
    missed, a kernel not called, greedy tokens that depart from the run without the plugins."""
    errors = [f"the engine {which} the plugins failed: {run.error}"
              for which, run in (("without", baseline), ("with", plugged)) if run.error]
    if errors:
        return errors
    # Replayed steps write no Python calls to classify; the profiler's counts see them.
    by_step = not cuda_graphs or plugged.counted_by == "profiler"
    workload = workload_problems(plugged) if by_step else []
    return [*workload, *missing_calls(plugged, plans, not by_step), *compare_greedy(baseline, plugged)]


def first_difference(baseline: EngineRun, plugged: EngineRun) -> str | None:
    """The first position where the greedy tokens differ though each is among the other's top candidates."""
    for i, (want, got) in enumerate(zip(baseline.tokens, plugged.tokens)):
        pos = next((p for p, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if pos is not None:
            return f"request {i}, token {pos}: {got[pos]} with the plugins, {want[pos]} without (a near tie)"
    return None


def engine_outcome(plans: list[Plan], plan: Plan, baseline: EngineRun, plugged: EngineRun,
                   cuda_graphs: bool, profile: str = "") -> EngineOutcome:
    return EngineOutcome(model=MODEL_WORDS, requests=len(PROMPT_LENGTHS), ops=[p.op.name for p in plans],
                         calls=dict(plugged.calls.get(plan.op.name, {})),
                         calls_outside_forward=plugged.calls_outside_forward.get(plan.op.name, 0),
                         cuda_graphs=cuda_graphs, tokens_compared=sum(len(t) for t in baseline.tokens),
                         first_difference=first_difference(baseline, plugged), start_s=plugged.start_s or None,
                         serve_s=plugged.serve_s or None, profile=profile or None,
                         counted_by="profiler" if plugged.counted_by == "profiler" else None,
                         attention_backend=attention_words(plan, cuda_graphs) or plugged.attention_backend or None)


def run_engine_item(plan: Plan, sm: str, keep: Path | None = None, profile: str = "") -> IntegrationRecord:
    """The plan's engine item: its plugin in a running engine, against the engine without it. On a GPU the engine
    captures CUDA graphs under the `profile` (PROFILES); on a CPU machine it runs eagerly, the kernel in Triton's
    interpreter."""
    start = time.monotonic()
    cuda_graphs = detect().device == "cuda"
    rec = IntegrationRecord(route=ROUTE, phase="all", dtype="bf16", tp=1, sm=sm, status=Status.PASSED,
                            graph_mode="cuda_graph" if cuda_graphs else "eager", vllm=package_version("vllm"))
    why = engine_unsupported(plan)
    if why:
        rec.status, rec.reason = Status.NOT_RUN, why
        return rec
    with engine_workdir(keep) as workdir:
        baseline, plugged = serve_with_and_without([plan], workdir, cuda_graphs, PROFILES.get(profile, True))
    if baseline.error:  # vLLM cannot serve here at all: the machine's or vLLM's build's, never the kernel's
        rec.status = Status.NOT_RUN
        rec.reason = f"vLLM's engine cannot serve on this machine even without the plugins: {baseline.error}"
        rec.duration_s = round(time.monotonic() - start, 3)
        return rec
    problems = engine_problems([plan], baseline, plugged, cuda_graphs)
    rec.engine = engine_outcome([plan], plan, baseline, plugged, cuda_graphs, profile)
    rec.kernel_calls = sum(rec.engine.calls.values())
    if problems:
        rec.status, rec.reason = Status.FAILED, "; ".join(problems)
    rec.duration_s = round(time.monotonic() - start, 3)
    return rec


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

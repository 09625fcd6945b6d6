"""The attention_backend route's items: the plan's kernel as a vLLM attention backend, on vLLM's own KV cache and
batch metadata, against vLLM's own backend for this platform on the same batch.

An item (`vllm-attention_backend[decode-bf16-cpu]`, one per phase and dtype: decode-only, prefill-only and mixed
(chunked_prefill) batches) loads the plan's generated plugin through vLLM's general-plugin loader, as a deployment does,
and builds two of vLLM's `Attention` layers for each drawn example: one whose backend vLLM selects with
`attention_config.backend = CUSTOM` (the plugin's, registered as CUSTOM and, on a CPU machine, over CPU_ATTN: vLLM's CPU
platform returns CPU_ATTN's class path whatever is selected, vllm/platforms/cpu.py get_attn_backend_cls), and one on
vLLM's own backend for the platform (CPU_ATTN on a CPU, TRITON_ATTN on a GPU). Each gets a KV cache allocated as vLLM's
model runner allocates it, in the physical layout vLLM gives that backend (slots no write reaches hold random values):
on vLLM 0.32 the layout it resolves for the backend and vllm/v1/kv_cache_interface.py's create_kv_cache_views, on vLLM
0.26 the backend's own get_kv_cache_shape and get_kv_cache_stride_order viewed as its GPU model runner views them
(vllm/v1/worker/gpu/attn_utils.py, `_reshape_attention_kv_cache`). Its sequences' earlier keys and values are written
by its own do_kv_cache_update, its metadata is built by its own builder from one CommonAttentionMetadata, and then one
forward runs through vLLM's layer inside vLLM's forward context (which writes the step's new keys and values first).
The example's sequences, lengths and block tables are the plan's (its phase's batches); its keys and values are the
plan's caches read through its block tables.

The backend's output must match vLLM's backend's within the plan's tolerance, and the plan's reference on the plan's
own inputs; a mismatch names the sequences whose rows differ. The kernel's calls are counted: a backend that ran
without calling it fails.

The cuda_graph items (`vllm-attention_backend[decode-bf16-cuda_graph-sm90]`, decode and mixed batches, on a GPU) run the
step as vLLM replays a full CUDA graph: decode batches under FULL_AND_PIECEWISE (vLLM's default), mixed ones under FULL
(FULL_AND_PIECEWISE runs them piecewise, attention outside the graph). The backend's builder must declare the CUDA-graph
support that mode needs (vLLM's resolve_cudagraph_mode_and_sizes: not NEVER for decode graphs, ALWAYS for mixed ones),
else vLLM never puts its forward in a graph. Each layer's forward (its cache write and attention) is captured at vLLM's
capture size for the batch on a dummy batch in persistent buffers, with metadata its builder built for capture; the
step's batch is then copied into those buffers, padded as vLLM's model runner pads it (padding requests with no tokens
and no context, padding tokens owned by no request, writing no slot), and the graph replayed. Both backends run so.

vLLM is optional: imported only when an item runs.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from harness.results.store import IntegrationRecord, Status
from harness.runtime.calls import first_line, reference_outputs
from harness.runtime.device import detect
from harness.runtime.inputs import build_args
from harness.runtime.numerics import Mismatch, Stats, compare
from harness.runtime.resolve import import_object, resolve
from harness.runtime.runner import RunSettings, compare_judged
from harness.runtime.tasks import IntegrationTask
from harness.plan.dtypes import DTYPE
from harness.cells.matrix import Cell
from harness.plan.model import Plan, Tolerance
from harness.plan.tolerances import output_tolerance, tolerance_for
from harness.vllm_facts.attention_layout import ROUTE, AttentionArgs, attention_args, cache_words
from harness.runtime.vllm_compiled import vllm_missing
from harness.vllm_facts.names import unsupported
from harness.vllm.routes import MAX_EXAMPLES, Failure, IntegrationOutcome, Watched, _origin, _unregister, run_drawn, \
    load_with_vllm_loader, plugin_on_path, vllm_version

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"attention backend": 2, "attention backend cuda graph": 1}
# v2: a backend that matches the plan's reference where vLLM's own is off it passes (it failed): failed records only
FAILURES_ONLY = {"attention backend": [2]}

PLUGIN_CLASS = "PluginAttentionBackend"  # the backend class the route's template writes
# vLLM's CUDA-graph mode whose full graphs replay a phase's batches: decode batches under vLLM's default mode, mixed
# ones only under FULL (FULL_AND_PIECEWISE runs them piecewise, attention outside the graph).
GRAPH_MODES = {"decode": "FULL_AND_PIECEWISE", "chunked_prefill": "FULL"}


def graph_phases(plan: Plan) -> list[str]:
    """The phases whose route items also run in a full CUDA graph: the plan's, where its matrix has cuda_graph."""
    return [p for p in plan.matrix["phase"] if p in GRAPH_MODES] if "cuda_graph" in plan.matrix["graph_mode"] else []


def vllm_backend_name(device: str) -> str:
    """vLLM's own attention backend the plugin's is compared with: the CPU platform's only one, or on a GPU vLLM's
    Triton unified attention (it runs wherever Triton does; FlashAttention may not be installed)."""
    return "CPU_ATTN" if device == "cpu" else "TRITON_ATTN"


CACHE_VIEWS, CACHE_SHAPES = "views", "shapes"  # cache_layout_api: vLLM 0.32's way, vLLM 0.26's


def cache_layout_api() -> str:
    """How the installed vLLM's model runner lays out a layer's KV cache, which `attend` repeats: CACHE_VIEWS (vLLM
    0.32: the layouts its backends support, resolved by get_supported_kv_cache_layouts, and create_kv_cache_views),
    CACHE_SHAPES (vLLM 0.26: each backend's get_kv_cache_shape and get_kv_cache_stride_order, viewed by the GPU model
    runner's _reshape_attention_kv_cache), or "" (neither)."""
    from vllm.v1 import kv_cache_interface
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.attention.backends import utils

    if hasattr(kv_cache_interface, "create_kv_cache_views") and hasattr(utils, "get_supported_kv_cache_layouts"):
        return CACHE_VIEWS
    if hasattr(AttentionBackend, "get_kv_cache_shape"):
        try:
            runner = importlib.import_module("vllm.v1.worker.gpu.attn_utils")
        except ImportError:
            return ""
        return CACHE_SHAPES if hasattr(runner, "_reshape_attention_kv_cache") else ""
    return ""


def missing_in_vllm(plan: Plan) -> str:
    """What the route needs that the installed vLLM lacks ("" when it has it all): the backend registry with its
    CUSTOM slot, the backend base classes, a KV cache layout the route can repeat, the layer."""
    here = f"vLLM {vllm_version()}"
    try:
        from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadataBuilder  # noqa: F401
        from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: F401
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend  # noqa: F401
    except ImportError as exc:
        return f"{here} lacks the vllm.v1.attention attention-backend API the route needs: {first_line(exc)}"
    if "CUSTOM" not in AttentionBackendEnum.__members__:
        return f"{here} lacks AttentionBackendEnum.CUSTOM: no slot for an out-of-tree attention backend"
    try:
        api = cache_layout_api()
    except Exception as exc:  # vLLM's model-runner module raising on import here: the machine's, not the kernel's
        return f"{here}'s KV cache layout code could not be imported: {first_line(exc)}"
    if not api:
        return (f"{here} lacks a KV cache layout API the route knows: neither create_kv_cache_views with "
                "get_supported_kv_cache_layouts (vLLM 0.32) nor AttentionBackend.get_kv_cache_shape with the model "
                "runner's _reshape_attention_kv_cache (vLLM 0.26)")
    try:
        import_object(plan.vllm.layer)
    except Exception as exc:
        return f"{here} has no {plan.vllm.layer} (vllm.layer): {first_line(exc)}"
    return ""


@contextlib.contextmanager
def plugin_backend(plan: Plan, plugin_text: str | None = None):
    """The plan's plugin (or `plugin_text`) loaded by vLLM's plugin loader (it registers its backend), its kernel
    counted; vLLM's backend registry and selection cache as they were once the block ends. Yields (plugin module, call
    counter)."""
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES

    before = dict(_ATTN_OVERRIDES)
    with contextlib.ExitStack() as stack:
        stack.enter_context(plugin_on_path(plan, plugin_text))
        stack.callback(_unregister, plan)
        stack.callback(selector._cached_get_attn_backend.cache_clear)  # selections made with the plugin registered
        stack.callback(lambda: (_ATTN_OVERRIDES.clear(), _ATTN_OVERRIDES.update(before)))
        selector._cached_get_attn_backend.cache_clear()
        module = load_with_vllm_loader(plan)
        counter = Watched(module.kernel, f"the kernel {plan.op.kernel}")
        module.kernel = counter  # the plugin's run_attention looks `kernel` up when called
        yield module, counter


# ---------------------------------------------------------------- vLLM's side of one example


def model_dir(root: Path, num_heads: int, num_kv_heads: int, head_size: int, max_len: int) -> str:
    """A Llama config.json with these attention sizes (vLLM's ModelConfig reads one; no weights are loaded)."""
    path = root / f"h{num_heads}-kv{num_kv_heads}-d{head_size}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": num_heads * head_size,
        "head_dim": head_size, "intermediate_size": 4 * num_heads * head_size, "num_hidden_layers": 1,
        "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "vocab_size": 256,
        "max_position_embeddings": max_len}))
    return str(path)


@dataclass
class Step:
    """One example as vLLM sees a step: the new tokens' query, keys and values, the earlier tokens' keys and values
    with their cache slots, and the batch tensors."""

    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_size]: the step's new tokens
    value: torch.Tensor
    slots: torch.Tensor  # int64 [num_tokens]
    context_key: torch.Tensor  # [context tokens, num_kv_heads, head_size]: written before the step
    context_value: torch.Tensor
    context_slots: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float
    num_blocks: int
    block_size: int
    q_lens: list[int]
    lens: list[int]


def step_of(values: dict, args: AttentionArgs) -> Step:
    """The plan's drawn call as one vLLM step: each position's key and value read from the plan's caches through the
    sequence's block table; the last query-length positions of a sequence are the step's new tokens."""
    to_flash = [args.cache_dims.index(d) for d in ("num_blocks", "block_size", "num_kv_heads", "head_size")]
    keys, vals = values[args.key_cache].permute(to_flash), values[args.value_cache].permute(to_flash)
    num_blocks, block_size = keys.shape[0], keys.shape[1]
    table, lens = values[args.block_table], values[args.seq_lens].tolist()
    starts = values[args.query_start_loc].tolist()
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    old, new = [], []
    for s, (n, q) in enumerate(zip(lens, q_lens)):
        positions = torch.arange(n, device=table.device)
        slots = table[s].long()[positions // block_size] * block_size + positions % block_size
        old.append(slots[:n - q])
        new.append(slots[n - q:])
    old_slots, new_slots = torch.cat(old), torch.cat(new)

    def at(cache, slots):
        return cache[slots // block_size, slots % block_size]

    return Step(query=values[args.query], key=at(keys, new_slots), value=at(vals, new_slots), slots=new_slots,
                context_key=at(keys, old_slots), context_value=at(vals, old_slots), context_slots=old_slots,
                block_table=table, seq_lens=values[args.seq_lens], query_start_loc=values[args.query_start_loc],
                scale=float(values[args.scale]), num_blocks=num_blocks, block_size=block_size, q_lens=q_lens,
                lens=lens)


class Configs:
    """vLLM's configs per attention sizes for one item (a ModelConfig reads its config.json once), and a counter
    for layer names (each Attention registers itself under a name of its own in the config)."""

    def __init__(self, root: Path, dtype: torch.dtype, max_len: int):
        self.root, self.dtype, self.max_len, self.configs, self.layers = root, dtype, max_len, {}, 0

    def config(self, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
               cudagraph_mode: str | None = None):
        """The config for these sizes; with `cudagraph_mode` (a CUDAGraphMode name), vLLM's compilation config asking
        for it (else vLLM's own choice)."""
        from vllm.config import AttentionConfig, CacheConfig, CompilationConfig, CUDAGraphMode, ModelConfig, VllmConfig
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        key = (num_heads, num_kv_heads, head_size, block_size, cudagraph_mode)
        if key not in self.configs:
            model = ModelConfig(model=model_dir(self.root, *key[:3], self.max_len), dtype=self.dtype,
                                skip_tokenizer_init=True, max_model_len=self.max_len)
            graphs = {} if cudagraph_mode is None else {
                "compilation_config": CompilationConfig(cudagraph_mode=CUDAGraphMode[cudagraph_mode])}
            # the deployment's selection: --attention-backend CUSTOM, the plan's block size
            self.configs[key] = VllmConfig(model_config=model, cache_config=CacheConfig(block_size=block_size),
                                           attention_config=AttentionConfig(backend=AttentionBackendEnum.CUSTOM),
                                           **graphs)
        return self.configs[key]

    def name(self) -> str:
        self.layers += 1
        return f"model.layers.{self.layers}.self_attn.attn"


def layer_for(configs: Configs, config, batch: Step, backend=None):
    """vLLM's Attention layer for the batch's sizes, its backend selected by vLLM (None) or `backend`; built as the
    model loader builds layers (the config current, the model's dtype the default)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.utils.torch_utils import set_default_torch_dtype

    num_heads, head_size = batch.query.shape[1:]
    # on the batch's device, as vLLM's loader builds a model (the layer's k/v scale buffers are read by the cache
    # writer's kernel there)
    with set_current_vllm_config(config), set_default_torch_dtype(configs.dtype), torch.device(batch.query.device):
        layer = Attention(num_heads, head_size, batch.scale, batch.key.shape[1], cache_config=config.cache_config,
                          prefix=configs.name(), attn_backend=backend)
        layer.process_weights_after_loading(configs.dtype)  # the default k/v scales vLLM's cache writers read
    return layer


def kv_cache(layer, spec, blocks: int, device) -> torch.Tensor:
    """The layer's KV cache of `blocks` pages as vLLM's model runner makes it: one int8 allocation viewed
    [num_blocks, num_kv_heads, block_size, 2 * head_size] in the physical layout vLLM gives the layer's backend."""
    page = spec.page_size_bytes
    raw = torch.empty(page * blocks, dtype=torch.int8, device=device)
    if cache_layout_api() == CACHE_VIEWS:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
        from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views

        layout = get_supported_kv_cache_layouts([layer.attn_backend])[0]  # what vLLM resolves for this backend alone
        placement = KVCacheTensor(size=page * blocks, layers=[layer.layer_name], layer_stride=page * blocks,
                                  block_stride=page)
        return create_kv_cache_views(raw, spec, blocks, layout, placement)[0]
    from vllm.v1.worker.gpu.attn_utils import _reshape_attention_kv_cache

    backend = layer.attn_backend
    # The cache dtype string vLLM's runner passes for an unquantized cache (the only kind either backend is given here).
    shape = backend.get_kv_cache_shape(blocks, spec.block_size, spec.num_kv_heads, spec.head_size,
                                       cache_dtype_str="auto")
    try:
        order = backend.get_kv_cache_stride_order()
    except (AttributeError, NotImplementedError):  # the runner's fallback: the logical shape is the physical one
        order = tuple(range(len(shape)))
    return _reshape_attention_kv_cache(raw, spec, shape, order, blocks, None)


def bind(layer, cache: torch.Tensor) -> None:
    """The cache bound to the layer as vLLM's model runner binds it: the layer's bind_kv_cache (vLLM 0.32), or its
    kv_cache attribute set (vLLM 0.26's vllm/v1/worker/utils.py bind_kv_cache)."""
    if hasattr(layer, "bind_kv_cache"):
        layer.bind_kv_cache(cache)
    else:
        layer.kv_cache = cache


def fresh_cache(layer, config, batch: Step, seed: int):
    """The layer's KV cache spec, and its cache allocated as vLLM's model runner does and bound to it (slots no write
    reaches hold values of a model's scale). Called with the config current."""
    spec = layer.get_kv_cache_spec(config)
    device = batch.query.device
    cache = kv_cache(layer, spec, batch.num_blocks, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cache.copy_(torch.randn(cache.shape, generator=gen, device=device, dtype=torch.float32))
    bind(layer, cache)
    return spec, cache


def write_context(layer, batch: Step, cache: torch.Tensor) -> None:
    """The earlier steps' keys and values, by the layer's own backend's writer."""
    if batch.context_slots.numel():
        layer.impl.do_kv_cache_update(layer, batch.context_key, batch.context_value, cache, batch.context_slots)


def attend(layer, config, batch: Step, seed: int) -> torch.Tensor:
    """One step through vLLM's layer: its KV cache allocated as vLLM's model runner does, the context written by the
    layer's own backend, metadata built by the backend's own builder, the forward in vLLM's forward context. Returns
    the output, [num_tokens, num_heads, head_size]."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = batch.query.device
    # The config current throughout, as in vLLM's model runner: on CUDA, vLLM 0.26 reads it while building the
    # cache's spec and the metadata, and while writing the cache.
    with set_current_vllm_config(config):
        spec, cache = fresh_cache(layer, config, batch, seed)
        common = CommonAttentionMetadata(
            query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc.cpu(),
            seq_lens=batch.seq_lens, num_reqs=len(batch.lens), num_actual_tokens=batch.query.shape[0],
            max_query_len=max(batch.q_lens), max_seq_len=max(batch.lens), block_table_tensor=batch.block_table,
            slot_mapping=batch.slots, seq_lens_cpu_upper_bound=batch.seq_lens.cpu())
        builder = layer.attn_backend.get_builder_cls()(spec, [layer.layer_name], config, device)
        metadata = builder.build(0, common)
        write_context(layer, batch, cache)
        n = batch.query.shape[0]
        with set_forward_context({layer.layer_name: metadata}, config, slot_mapping={layer.layer_name: batch.slots}):
            out = layer(batch.query.reshape(n, -1), batch.key.reshape(n, -1), batch.value.reshape(n, -1))
    return out.view(batch.query.shape)


# ---------------------------------------------------------------- a step in a full CUDA graph


def graph_lacking(cell: Cell, device: str) -> str:
    """Why this machine, or vLLM, replays no full CUDA graph of the cell's batches ("" where it does)."""
    if device != "cuda":
        return "cuda_graph needs a CUDA device; this machine has none"
    if cell.phase not in GRAPH_MODES:
        return f"vLLM replays no full CUDA graph of {cell.phase} batches here (the route's graphs: decode and mixed)"
    return ""


def graph_problem(layer, config, phase: str) -> str:
    """Why vLLM would not run the layer's attention inside a full CUDA graph for the phase's batches ("" where it
    would), by the CUDA-graph support its backend's builder declares (`support_problem`)."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config):
        spec = layer.get_kv_cache_spec(config)
    support = layer.attn_backend.get_builder_cls().get_cudagraph_support(config, spec)
    return support_problem(support, config.compilation_config.cudagraph_mode, phase)


def support_problem(support, mode, phase: str) -> str:
    """Why vLLM runs no full CUDA graph of the phase's batches with a builder declaring `support` (an
    AttentionCGSupport) in the resolved cudagraph `mode` ("" where it does): the mode vLLM's config resolved to has
    none for them, or the builder declares less than the mode needs (the rules of vLLM's
    resolve_cudagraph_mode_and_sizes: a decode graph needs any support, a mixed one ALWAYS)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    asked, decode = GRAPH_MODES[phase], phase == "decode"
    if (mode.decode_mode() if decode else mode.mixed_mode()) != CUDAGraphMode.FULL:
        return f"vLLM's config here turns cudagraph_mode {asked} into {mode.name}: no full graph for {phase} batches"
    needed = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if decode else AttentionCGSupport.ALWAYS
    if support.value < needed.value:
        return (f"the plugin's metadata builder declares {support.name} CUDA-graph support; cudagraph_mode {asked} "
                f"needs {needed.name} for full graphs of {phase} batches, so vLLM runs its forward outside them")
    return ""


def graph_size(config, batch: Step, decode: bool) -> tuple[int, int]:
    """The tokens and requests a full graph replays the batch at: vLLM's smallest capture size that holds its tokens
    (one above the largest: captured at its own size here, where vLLM would run it without a full graph), and one
    request per token for a decode graph, else as many as vLLM's dummy run of that size has (at most max_num_seqs)."""
    n = batch.query.shape[0]
    tokens = next((size for size in sorted(config.compilation_config.cudagraph_capture_sizes or ()) if size >= n), n)
    requests = tokens if decode else min(tokens, config.scheduler_config.max_num_seqs)
    return tokens, max(requests, len(batch.lens))


@dataclass
class StepBuffers:
    """vLLM's persistent inputs of a captured step, for its padded tokens and requests: the model runner's buffers,
    which a CUDA graph reads again on each replay."""

    query: torch.Tensor  # [tokens, num_heads, head_size]
    key: torch.Tensor  # [tokens, num_kv_heads, head_size]
    value: torch.Tensor
    query_start_loc: torch.Tensor  # int32 [requests + 1]
    seq_lens: torch.Tensor  # int32 [requests]
    block_table: torch.Tensor  # int32 [requests, max_blocks_per_seq]
    slots: torch.Tensor  # int64 [tokens]

    @classmethod
    def for_batch(cls, batch: Step, tokens: int, requests: int) -> StepBuffers:
        q, k = batch.query, batch.key
        i32 = {"dtype": torch.int32, "device": q.device}
        return cls(q.new_empty(tokens, *q.shape[1:]), k.new_empty(tokens, *k.shape[1:]),
                   k.new_empty(tokens, *k.shape[1:]), torch.empty(requests + 1, **i32), torch.empty(requests, **i32),
                   torch.empty(requests, batch.block_table.shape[1], **i32),
                   torch.empty(tokens, dtype=torch.int64, device=q.device))

    def dummy(self) -> None:
        """The batch vLLM captures on (its model runner's dummy run): the tokens shared among the requests, one each
        and the rest to the last, each sequence as long as its query, every block the null block 0, no slot written."""
        tokens, requests = self.query.shape[0], self.seq_lens.shape[0]
        q_lens = torch.full((requests,), tokens // requests, dtype=torch.int32)
        q_lens[-1] += tokens % requests
        self.query_start_loc.copy_(torch.cat([q_lens.new_zeros(1), q_lens.cumsum(0, dtype=torch.int32)]))
        self.seq_lens.copy_(q_lens)
        self.block_table.zero_()
        self.slots.fill_(-1)
        for t in (self.query, self.key, self.value):
            t.zero_()

    def fill(self, batch: Step) -> None:
        """The step's batch in the buffers, padded as vLLM's model runner pads a batch for a graph: padding requests
        have no query tokens (query_start_loc repeats its last offset) and no context, and the null block in their
        rows; padding tokens belong to no request and write no slot (-1). They hold NaN here: no kernel may read
        them."""
        n, s = batch.query.shape[0], len(batch.lens)
        for buf, real in ((self.query, batch.query), (self.key, batch.key), (self.value, batch.value)):
            buf[:n] = real
            buf[n:] = float("nan")
        self.query_start_loc[:s + 1] = batch.query_start_loc
        self.query_start_loc[s + 1:] = n
        self.seq_lens[:s] = batch.seq_lens
        self.seq_lens[s:] = 0
        self.block_table.zero_()
        self.block_table[:s] = batch.block_table
        self.slots[:n] = batch.slots
        self.slots[n:] = -1


def capture(forward: Callable[[], torch.Tensor], device: torch.device) -> tuple[Callable[[], None], torch.Tensor]:
    """`forward` captured in a CUDA graph after one warm-up run on a side stream (Triton compiles and autotunes outside
    the capture): the graph's replay, and the output tensor each replay writes."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        forward()
    torch.cuda.current_stream(device).wait_stream(side)
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # not the worker's other threads' calls
        out = forward()
    return graph.replay, out


def attend_graphed(layer, config, batch: Step, seed: int, decode: bool) -> torch.Tensor:
    """One step as vLLM replays a full CUDA graph: the layer's forward (its cache write, then attention) captured on a
    dummy batch in persistent buffers at the batch's padded size, with metadata the backend's own builder built for a
    capture (build_for_cudagraph_capture, as vLLM's model runner asks); then the context written, the step's batch
    copied into the buffers, padded as vLLM pads it, and the graph replayed in the forward context, as vLLM's runner
    replays it. Returns the output rows of the step's tokens, [num_tokens, num_heads, head_size]."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = batch.query.device
    tokens, requests = graph_size(config, batch, decode)
    buf = StepBuffers.for_batch(batch, tokens, requests)
    buf.dummy()
    with set_current_vllm_config(config):
        spec, cache = fresh_cache(layer, config, batch, seed)
        # as vLLM's dummy run builds it: a decode graph's longest query is 1, a mixed one's its tokens; the longest
        # context max_model_len
        common = CommonAttentionMetadata(
            query_start_loc=buf.query_start_loc, query_start_loc_cpu=buf.query_start_loc.cpu(),
            seq_lens=buf.seq_lens, num_reqs=requests, num_actual_tokens=tokens,
            max_query_len=1 if decode else tokens, max_seq_len=config.model_config.max_model_len,
            block_table_tensor=buf.block_table, slot_mapping=buf.slots, seq_lens_cpu_upper_bound=buf.seq_lens.cpu())
        builder = layer.attn_backend.get_builder_cls()(spec, [layer.layer_name], config, device)
        metadata = builder.build_for_cudagraph_capture(common)

        def forward():
            return layer(buf.query.view(tokens, -1), buf.key.view(tokens, -1), buf.value.view(tokens, -1))

        with set_forward_context({layer.layer_name: metadata}, config, slot_mapping={layer.layer_name: buf.slots}):
            replay, out = capture(forward, device)
            write_context(layer, batch, cache)
            buf.fill(batch)
            replay()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out.view(tokens, *batch.query.shape[1:])[:batch.query.shape[0]].clone()


def graph_step(layer, config, batch: Step, seed: int, phase: str, whose: str) -> torch.Tensor:
    """attend_graphed, a raise said as the capture or replay of `whose` backend."""
    try:
        return attend_graphed(layer, config, batch, seed, phase == "decode")
    except Exception as exc:
        raise Failure(f"{whose} in a full CUDA graph raised {first_line(exc)[:400]} ({_origin(exc)})") from None


# ---------------------------------------------------------------- the comparison


def rows_off(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """Per token, whether its row is off by more than the tolerance (atol_of: max as the comparison applies it)."""
    atol = tol.atol * max(1.0, float(expected.abs().float().nan_to_num(0.0).max())) if tol.of_max else tol.atol
    diff = (actual.float() - expected.float()).abs()
    off = (diff > atol + tol.rtol * expected.float().abs()) | (actual.isnan() & ~expected.isnan())
    return off.flatten(1).any(1)


def sequences_off(batch: Step, bad_rows: torch.Tensor) -> str:
    """Which sequences own the rows that are off, with their context and query lengths (what a block-table or length
    bug shows in)."""
    bad = bad_rows.tolist()
    starts = batch.query_start_loc.tolist()
    seqs = [s for s in range(len(batch.lens)) if any(bad[starts[s]:starts[s + 1]])]
    if not seqs:
        return ""
    shown = seqs[:6]
    more = f" and {len(seqs) - len(shown)} more" if len(seqs) > len(shown) else ""
    return (f"rows of {len(seqs)} of {len(batch.lens)} sequences differ: sequence "
            + ", ".join(f"{s} (seq_len {batch.lens[s]}, query_len {batch.q_lens[s]}, "
                        f"{-(-batch.lens[s] // batch.block_size)} blocks)" for s in shown) + more)


def judge(plan: Plan, dtype: str, stats: Stats, name: str, mine: torch.Tensor, theirs: torch.Tensor,
          expected: torch.Tensor, values: dict, batch: Step, vllm_backend: str, reference) -> None:
    """The plugin's output against vLLM's backend's (both on vLLM's cache and metadata), then against the plan's
    reference; a Failure says which differs and where. Where vLLM's backend alone is off the plan's reference (its
    Triton attention computes fp32 dot products in TF32) and the plugin's is not, the reference decides: the words
    saying so are returned, for the record."""
    tol = output_tolerance(plan, dtype, name, None)
    try:
        compare(name, mine, theirs, tol, None)
    except Mismatch as exc:
        where = sequences_off(batch, rows_off(mine, theirs, tol))
        try:
            compare(name, theirs, expected, tol, None)
            vs_reference = f"vLLM's {vllm_backend} matches the plan's reference on the same batch"
        except Mismatch as theirs_off:
            try:
                compare_judged(plan, reference, dtype, stats, name, mine, expected, values, False)
            except Mismatch:
                vs_reference = f"vLLM's {vllm_backend} differs from the plan's reference as well ({theirs_off})"
            else:
                return (f"vLLM's {vllm_backend} differs from the plan's reference where the plugin's backend matches "
                        f"it ({str(theirs_off).split(';')[0]})")
        raise Failure(f"the plugin's attention backend differs from vLLM's {vllm_backend} on the same KV cache and "
                      f"metadata: {exc}; {where}; {vs_reference}") from None
    try:
        compare_judged(plan, reference, dtype, stats, name, mine, expected, values, False)
    except Mismatch as exc:
        where = sequences_off(batch, rows_off(mine, expected, tol))
        raise Failure(f"the plugin's attention backend differs from the plan's reference (within tolerance of vLLM's "
                      f"{vllm_backend}): {exc}; {where}") from None


def check_attention_backend(plan: Plan, cell: Cell, examples: int = MAX_EXAMPLES, profile: str = "ci",
                            database: str | None = None, plugin_text: str | None = None) -> IntegrationRecord:
    """One attention_backend item: the plugin loaded by vLLM's loader, its backend selected as CUSTOM, on drawn
    batches of the cell's phase, against vLLM's own backend and the plan's reference; in the cell's graph mode (eager,
    or cuda_graph: each step replayed in a full CUDA graph, GRAPH_MODES)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    start = time.monotonic()
    device = detect().device
    graphed = cell.graph_mode == "cuda_graph"
    act = getattr(torch, DTYPE[cell.dtype].torch)
    reference = resolve(plan).reference
    args = attention_args(plan)
    stats, count = Stats(), 0
    theirs_name = vllm_backend_name(device)
    rec = IntegrationRecord(route=ROUTE, **cell.axes(), status=Status.PASSED)
    with contextlib.ExitStack() as stack:
        lacking = missing_in_vllm(plan) or (graph_lacking(cell, device) if graphed else "")  # this machine's
        try:
            missing = lacking or ("" if isinstance(args, AttentionArgs) else args)
            if missing:
                raise Failure(missing)
            module, counter = stack.enter_context(plugin_backend(plan, plugin_text))
        except Failure as exc:
            module, rec.status, rec.reason = None, Status.NOT_RUN if lacking else Status.FAILED, str(exc)
        except Exception as exc:  # a plugin that raises while loading or registering
            module, rec.status = None, Status.FAILED
            rec.reason = f"loading the plugin's attention backend raised {type(exc).__name__}: {exc}"
        if module is not None:
            # vLLM's own backend by the class path it ships (the plugin may be registered over it)
            theirs_class = resolve_obj_by_qualname(AttentionBackendEnum[theirs_name].value)
            configs = Configs(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vllm-attention-"))), act,
                              plan.numerics.max_model_len)
            rec.registered_as = {
                "backend": "CUSTOM" + (" and over CPU_ATTN (vLLM's CPU platform loads CPU_ATTN whatever is selected)"
                                       if device == "cpu" else ""),
                "selected_with": "attention_config.backend = CUSTOM (--attention-backend CUSTOM)",
                "kv_cache": cache_words(plan), "compared_with": theirs_name}
            captured: set[int] = set()  # the padded token counts the graphs were captured at

            def test(ex):
                nonlocal count
                count += 1
                values = build_args(plan, cell, ex, device)
                try:
                    expected = reference_outputs(plan, reference, values)[plan.op.outputs[0]]
                except Exception as exc:
                    raise Failure(f"the reference {plan.op.reference} raised {first_line(exc)} "
                                  f"({_origin(exc)})") from None
                batch = step_of(values, args)
                config = configs.config(batch.query.shape[1], batch.key.shape[1], batch.query.shape[2],
                                        batch.block_size, GRAPH_MODES[cell.phase] if graphed else None)
                try:
                    mine = layer_for(configs, config, batch)
                except Exception as exc:  # vLLM refused the selection (the backend's declared limits)
                    raise Failure(f"vLLM did not select the plugin's backend for this layer: {first_line(exc)} "
                                  f"({_origin(exc)})") from None
                if mine.attn_backend is not getattr(module, PLUGIN_CLASS):
                    raise Failure(f"with attention_config.backend = CUSTOM vLLM's Attention runs "
                                  f"{mine.attn_backend.__module__}.{mine.attn_backend.__name__}, not the plugin's "
                                  f"{PLUGIN_CLASS}")
                theirs = layer_for(configs, config, batch, theirs_class)
                before = counter.calls
                if graphed:
                    problem = graph_problem(mine, config, cell.phase)
                    if problem:
                        raise Failure(problem)
                    got = graph_step(mine, config, batch, ex.seed, cell.phase, "the plugin's attention backend")
                    captured.add(graph_size(config, batch, cell.phase == "decode")[0])
                else:
                    got = attend(mine, config, batch, ex.seed)
                if counter.calls == before:
                    raise Failure("the plugin's attention backend ran vLLM's forward without calling the kernel")
                want = graph_step(theirs, config, batch, ex.seed, cell.phase, f"vLLM's own {theirs_name}") \
                    if graphed else attend(theirs, config, batch, ex.seed)
                note = judge(plan, cell.dtype, stats, plan.op.outputs[0], got, want, expected, values, batch,
                             theirs_name, reference)
                if note:
                    notes.append(note)

            notes: list[str] = []
            run = RunSettings(examples=examples, profile=profile, database=database)
            # vLLM's code, the plugin's or the harness's around them: said with where it raised
            run_drawn(test, plan, cell, device, run, ROUTE, rec,
                      lambda exc: f"the attention backend item raised {first_line(exc)[:500]} ({_origin(exc)})")
            rec.kernel_calls = counter.calls
            if graphed:
                sizes = ", ".join(map(str, sorted(captured))) or "none yet"
                rec.registered_as["cuda_graph"] = (
                    f"cudagraph_mode {GRAPH_MODES[cell.phase]}: each layer's forward captured in a "
                    f"torch.cuda.CUDAGraph on a dummy batch at vLLM's capture size for the batch ({sizes} tokens), "
                    "with metadata its builder built for capture, then replayed with the batch in vLLM's persistent "
                    "buffers, padded as vLLM pads it; both backends so")
            if notes:
                rec.registered_as["compared_with"] += f"; {notes[0]}, in {len(notes)} of {count} examples"
    rec.examples, rec.duration_s = count, round(time.monotonic() - start, 3)
    tol = tolerance_for(plan, cell.dtype)
    rec.tolerance, rec.error, rec.vllm = Tolerance(tol.atol, tol.rtol), stats.record(), vllm_version()
    return rec


def run_attention_item(task: IntegrationTask) -> IntegrationOutcome:
    """An attention_backend item as a worker runs it: where it cannot run here, a NOT_RUN record with why."""
    plan, cell, run = task.plan, task.cell, task.run
    why = vllm_missing() or unsupported(plan)
    if why:
        return IntegrationOutcome(IntegrationRecord(route=ROUTE, **cell.axes(), status=Status.NOT_RUN, reason=why))
    return IntegrationOutcome(check_attention_backend(plan, cell, run.examples, run.profile, run.database))

"""The attention_backend route's plan side: how vLLM's paged KV cache and attention metadata map onto the kernel's
arguments, read from the plan's argument shapes alone.

vLLM 0.32 gives an attention backend one KV cache tensor per layer, seen as [num_blocks, num_kv_heads, block_size,
2 * head_size]: the logical [B, H, N, C] per-layer view of vllm/v1/kv_cache_interface.py (create_kv_cache_views),
whatever physical KVCacheLayout vLLM chose, each token's key in the first head_size of C and its value in the second
(the split vllm/v1/attention/backends/triton_attn.py makes, and vLLM's Triton cache writer fills). 0.32 has no
`get_kv_cache_shape`: the shape is vLLM's (its AttentionSpec), a backend only narrows the physical layout
(`supported_kv_cache_layouts`). vLLM 0.26 gives the same logical view but asks the backend for it
(`get_kv_cache_shape`) and for its physical dim order (`get_kv_cache_stride_order`, after the process-wide NHD or HND
layout): the plugin answers there as TRITON_ATTN does. The kernel's key and value caches are views of that tensor in
the order the plan's cache shape names its dims, a permute, never a copy; the batch's tensors are vLLM's own (block
table, seq_lens, query_start_loc, all int32) and the softmax scale the layer's.

Which plan argument is which: the inputs built from the batch by their `init` (block_tables, seq_lens,
query_start_loc), the query and the output by their shape [num_tokens, num_heads, head_size], the caches as the two
inputs shaped over num_blocks, block_size, num_kv_heads and head_size (keys first, vLLM's order), the scale as the one
scalar. A plan with any other argument cannot take this route (`attention_problem`: a plan error at vllm.route).

Plain Python: nothing here imports torch or vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type hints only: the plan's checks import these facts, never the other way
    from harness.plan.model import Plan
    from harness.plan.sections import Arg

ROUTE = "attention_backend"
# The dims of vLLM's per-layer KV cache view, in its order (the last is 2 * head_size: keys, then values).
VLLM_CACHE_DIMS = ("num_blocks", "num_kv_heads", "block_size", "head_size")
TOKEN_DIMS = ("num_tokens", "num_heads", "head_size")  # vLLM's query and output of one attention call
BATCH_INITS = {"block_table": "block_tables", "seq_lens": "seq_lens", "query_start_loc": "query_start_loc"}
# vLLM's names for what it passes an attention backend, in the order the plugin's run_attention takes them.
VLLM_NAMES = ("output", "query", "kv_cache", "block_table", "seq_lens", "query_start_loc", "scale")


@dataclass(frozen=True)
class AttentionArgs:
    """The plan's argument for each of vLLM's attention inputs, and its caches' dim order."""

    out: str  # the output's name (an argument, or a returned value's name)
    out_returned: bool
    query: str
    key_cache: str
    value_cache: str
    block_table: str
    seq_lens: str
    query_start_loc: str
    scale: str
    cache_dims: tuple[str, ...]  # the plan's cache dims, by symbol

    @property
    def permutation(self) -> tuple[int, ...]:
        """The dims of vLLM's [num_blocks, num_kv_heads, block_size, head_size] view, in the kernel's order."""
        return tuple(VLLM_CACHE_DIMS.index(d) for d in self.cache_dims)


def _symbols(a: Arg) -> tuple[str | None, ...]:
    return tuple(d.symbol if d.coeff == 1 else None for d in a.shape or ())


def attention_args(plan: Plan) -> AttentionArgs | str:
    """Each vLLM attention input's plan argument, or why the plan's arguments do not fit the route (words)."""
    inputs = [a for a in plan.args if a.role != "output"]
    found: dict[str, str] = {}
    for role, init in BATCH_INITS.items():
        named = [a for a in inputs if a.is_tensor and a.init == init]
        if len(named) != 1:
            return (f"one input with init {init} (vLLM's {role}), found {len(named)}: the route passes the kernel "
                    "vLLM's own batch tensors")
        if named[0].dtype != "int32":
            return f"op.args.{named[0].name} of dtype int32 (vLLM's {role} is int32); found {named[0].dtype}"
        found[role] = named[0].name
    queries = [a for a in inputs if a.is_tensor and _symbols(a) == TOKEN_DIMS]
    if len(queries) != 1:
        return (f"one input shaped [{', '.join(TOKEN_DIMS)}] (vLLM's query), found "
                f"{', '.join(a.name for a in queries) or 'none'}")
    caches = [a for a in inputs if a.is_tensor and len(a.shape) == 4 and set(_symbols(a)) == set(VLLM_CACHE_DIMS)]
    if len(caches) != 2:
        return (f"two inputs shaped over {', '.join(VLLM_CACHE_DIMS)} in some order (the key and value caches), "
                f"found {', '.join(a.name for a in caches) or 'none'}")
    if _symbols(caches[0]) != _symbols(caches[1]):
        return f"op.args.{caches[0].name} and op.args.{caches[1].name} with one dim order (views of one vLLM cache)"
    scalars = [a for a in inputs if not a.is_tensor]
    number = len(scalars) == 1 and (scalars[0].value_expr is not None or (  # a constant, or computed from the sizes
        isinstance(scalars[0].value, (int, float)) and not isinstance(scalars[0].value, bool)))
    if not number:
        found_scalars = ", ".join(a.name for a in scalars) or "none"
        return f"one number argument (the layer's softmax scale), found {found_scalars}"
    known = {*found.values(), queries[0].name, caches[0].name, caches[1].name, scalars[0].name}
    if len(plan.op.outputs) != 1:
        return f"one output (vLLM's attention output), found {', '.join(plan.op.outputs)}"
    out = plan.op.outputs[0]
    returned = not plan.has_arg(out)
    if not returned:
        if _symbols(plan.arg(out)) != TOKEN_DIMS:
            return f"op.args.{out} shaped [{', '.join(TOKEN_DIMS)}] (vLLM's attention output)"
        known.add(out)
    if plan.op.mutates:
        return (f"a kernel that writes no input (vLLM's backend owns its cache writes); op.mutates names "
                f"{', '.join(plan.op.mutates)}")
    other = [a.name for a in plan.args if a.name not in known]
    if other:
        return (f"only vLLM's attention inputs (query, KV cache, block table, seq_lens, query_start_loc, scale, the "
                f"output); op.args.{other[0]} is none of them")
    for a in (queries[0], caches[0], caches[1], *([] if returned else [plan.arg(out)])):
        if a.dtype != "act":
            return f"op.args.{a.name} of dtype act (vLLM's activations and KV cache share the model's dtype)"
    return AttentionArgs(out=out, out_returned=returned, query=queries[0].name, key_cache=caches[0].name,
                         value_cache=caches[1].name, scale=scalars[0].name, cache_dims=_symbols(caches[0]),
                         **found)


def attention_problem(plan: Plan) -> str:
    """Why the plan cannot take the attention_backend route ("" where it can, or names another route)."""
    if plan.vllm.route != ROUTE:
        return ""
    got = attention_args(plan)
    return "" if isinstance(got, AttentionArgs) else got


def _shape(dims: tuple[str, ...]) -> str:
    return f"[{', '.join(dims)}]"


def cache_words(plan: Plan) -> str:
    """How vLLM's KV cache becomes the kernel's caches, in words (the route items and the page say it)."""
    args = attention_args(plan)
    if not isinstance(args, AttentionArgs):
        return args
    vllm = "vLLM's KV cache of a layer, [num_blocks, num_kv_heads, block_size, 2 * head_size] (each token's key " \
           "then its value)"
    perm = args.permutation
    view = "" if perm == (0, 1, 2, 3) else f".permute({', '.join(map(str, perm))})"
    return (f"{vllm}, is the kernel's {args.key_cache} and {args.value_cache} {_shape(args.cache_dims)} as "
            f"kv_cache[..., :head_size]{view} and kv_cache[..., head_size:]{view}: strided views, no copy")


def _sizes_drawn(plan: Plan, symbol: str) -> list[int]:
    """The sizes the plan's cells draw for `symbol` (its values and numerics.cpu_sizes'); [] where any size may be
    drawn (awkward sizes) or the plan has no such size."""
    spec = plan.op.sizes.get(symbol)
    if spec is None:
        return []
    awkward = plan.numerics.awkward_sizes if spec.awkward is None else spec.awkward
    if awkward:
        return []
    cpu = dict(plan.numerics.cpu_sizes).get(symbol)
    return sorted({*spec.values, *(cpu if isinstance(cpu, (list, tuple)) else () if cpu is None else (cpu,))})


def kernel_block_sizes(plan: Plan) -> list[int]:
    """The cache block sizes the plugin's backend declares: those the plan's cells check ([]: any)."""
    return _sizes_drawn(plan, "block_size")


def head_sizes(plan: Plan) -> list[int]:
    """The head sizes the plugin's backend declares: those the plan's cells check ([]: any)."""
    return _sizes_drawn(plan, "head_size")


TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def model_dtypes(plan: Plan) -> list[str]:
    """The model dtypes the backend declares (torch names): the plan's floating-point cells', within op.contract."""
    allowed = plan.contract.dtypes or plan.matrix["dtype"]
    return [TORCH_DTYPES[d] for d in plan.matrix["dtype"] if d in TORCH_DTYPES and d in allowed]


def attention_source(plan: Plan) -> list[str]:
    """The plugin's plan-derived half for the attention_backend route: what the backend declares, the kernel's views
    of vLLM's KV cache, and `run_attention`, which calls the kernel by the plan's names on vLLM's tensors."""
    args = attention_args(plan)
    if not isinstance(args, AttentionArgs):
        raise ValueError(f"{plan.path}: vllm.route {ROUTE}: {args}")
    perm = args.permutation
    view = "" if perm == (0, 1, 2, 3) else f".permute({', '.join(map(str, perm))})"
    inputs = {args.query: "query", args.key_cache: "key_cache", args.value_cache: "value_cache",
              args.block_table: "block_table", args.seq_lens: "seq_lens", args.query_start_loc: "query_start_loc",
              args.scale: "scale"}
    supports_call = [f"{a.name}={inputs[a.name]}" for a in plan.args if a.name in inputs]
    kernel_call = [f"{a.name}={inputs.get(a.name, 'output')}" for a in plan.args]
    blocks, heads = kernel_block_sizes(plan), head_sizes(plan)
    dtypes = [f"torch.{d}" for d in model_dtypes(plan)]
    lines = [
        "# What the backend declares, so that vLLM selects it only within them: the plan's cell dtypes, and the block",
        "# and head sizes its cells draw ([]: any).",
        f"MODEL_DTYPES = ({', '.join(dtypes)}{',' if len(dtypes) == 1 else ''})",
        f"KERNEL_BLOCK_SIZES = {blocks}",
        f"HEAD_SIZES = {heads}",
        "",
        "",
        "def kernel_caches(kv_cache):",
        f'    """The kernel\'s {args.key_cache} and {args.value_cache} {_shape(args.cache_dims)}: views (no copy) of',
        "    vLLM's KV cache of one layer, [num_blocks, num_kv_heads, block_size, 2 * head_size], each token's key",
        '    then its value."""',
        "    head_size = kv_cache.shape[-1] // 2",
        f"    return kv_cache[..., :head_size]{view}, kv_cache[..., head_size:]{view}",
        "",
        "",
        f"def run_attention({', '.join(VLLM_NAMES)}):",
        '    """One attention call of the backend: the kernel on vLLM\'s tensors, by the plan\'s names; writes '
        'output\n    [num_tokens, num_heads, head_size]."""',
        "    key_cache, value_cache = kernel_caches(kv_cache)",
        *_call("    if not supports(", supports_call, "):"),
        "        raise NotImplementedError(f\"{OP} does not take this call (the plan's ranks, dtypes, op.contract): \"",
        '                                  f"query {tuple(query.shape)} {query.dtype}, cache {key_cache.shape}")',
    ]
    if args.out_returned:
        lines += _call("    output.copy_(kernel(", kernel_call, "))")
    else:
        lines += _call("    kernel(", kernel_call, ")")
    return lines


def _call(head: str, args: list[str], tail: str, width: int = 116) -> list[str]:
    """A call's source, its arguments wrapped under its open parenthesis to `width` columns."""
    lines, line = [], head
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else tail)
        if len(line) + len(piece.rstrip()) > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head.split("(")[0] + "(") if head.count("(") == 1 else " " * len(head)
        line += piece
    return [*lines, line]

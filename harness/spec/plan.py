"""The plan model: load `plan.yaml`, validate every field, and hand back frozen dataclasses.

Every error names the file, the line, the dotted field, what was expected and what was found,
so a user fixes a plan without reading a traceback.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from harness.spec.expressions import evaluate, names_in
from harness.spec.vllm_schemas import VLLM_KERNELS, mismatches

PHASES = ("prefill", "decode", "chunked_prefill")
DTYPES = ("fp32", "fp16", "bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "int8")
# memcheck: eager calls under compute-sanitizer memcheck on a GPU (harness.runtime.memcheck), for memory safety.
GRAPH_MODES = ("eager", "cuda_graph", "torch_compile", "memcheck")
INTENTS = ("drop-in", "fusion", "new-algorithm", "quantization")
AXES = ("phase", "dtype", "tp", "graph_mode", "sm")
PROFILES = ("dev", "ci", "nightly")  # numerics profiles (hypothesis profiles harness-<name>)
LAYOUTS = ("contiguous", "strided")
# Value initialisations by name. The structured ones come from the example's batch (harness.runtime.batches): positions
# as vLLM's scheduler forms them per phase, and a paged KV cache's block tables and lengths consistent with them.
INITS = ("normal", "around_one", "uniform", "zeros", "ones")
STRUCTURED_INITS = ("positions", "seq_lens", "query_start_loc", "block_tables", "slot_mapping")
# Parameterised inits: {uniform: [low, high]}, {integers: [low, high)} (bounds are size expressions),
# {cos_sin_cache: {base: B}} (RoPE's [max_position, rotary_dim] table).
PARAM_INITS = ("uniform", "integers", "cos_sin_cache")
SIZE_CONSTRAINTS = ("values", "awkward", "divides", "multiple_of", "even", "at_most")
# A kernel's preconditions (op.contract, or a named baseline's contract): tensors, size symbols and dtypes it is for.
CONTRACT_KEYS = ("contiguous", "row_stride_multiple_of", "multiple_of", "at_least", "at_most", "dtypes", "why")
GRANULARITIES = ("per_tensor", "per_token", "per_channel", "per_group")
ROLES = ("input", "output")
VLLM_ROUTES = ("ir", "custom_op")
BASELINES = ("native", "compiled", "vllm")
# `op.kernel: vllm:<name>`: vLLM's own compiled kernel torch.ops._C.<name> (harness.spec.vllm_schemas), loaded by
# harness.runtime.vllm_kernels from an installed vLLM or a vLLM ops library.
VLLM_KERNEL = "vllm:"
# NVIDIA compute capability (sm90) or an AMD CDNA target (gfx90a, gfx942, gfx950).
SM_PATTERN = re.compile(r"^(cpu|sm\d{2,3}|gfx9[0-9][0-9a-f])$")
SM_EXPECTED = "'cpu', 'smXY' (e.g. sm90) or an AMD target (gfx90a, gfx942, gfx950)"
# Symbols every plan gets for free: the phase decides the token count; the example's batch (harness.runtime.batches)
# decides the sequences and, for a paged KV cache, its blocks.
BUILTIN_SYMBOLS = ("num_tokens", "num_seqs", "num_blocks", "max_blocks_per_seq")
# Fixed-dtype arguments use torch's names; "act" follows the cell's dtype axis; "fp8" is the platform's fp8
# (float8_e4m3fn on CUDA, float8_e4m3fnuz on ROCm).
FIXED_DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "int32", "int64", "uint8", "bool",
                "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "fp8")


class PlanError(Exception):
    """A plan that cannot be used, located at file:line and a dotted field."""

    def __init__(self, path: str, line: int | None, field_name: str, expected: str, found: Any):
        self.path, self.line, self.field, self.expected, self.found = path, line, field_name, expected, found
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {field_name}: expected {expected}; found {found!r}")


# ---------------------------------------------------------------- YAML with line numbers


class _Map(dict):
    line: int = 0
    key_lines: dict


class _Seq(list):
    line: int = 0
    item_lines: list


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key and list item."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:  # YAML keeps the last of repeated keys silently: a plan must not
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} given twice",
                                                        key_node.start_mark)
            seen.add(key)
        mapping = _Map(super().construct_mapping(node, deep=True))
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {self.construct_object(k): k.start_mark.line + 1 for k, _ in node.value}
        return mapping

    def construct_sequence(self, node, deep=False):
        seq = _Seq(super().construct_sequence(node, deep=True))
        seq.line = node.start_mark.line + 1
        seq.item_lines = [item.start_mark.line + 1 for item in node.value]
        return seq


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)


class _Reader:
    """Reads typed fields out of a parsed mapping, raising PlanError with a location."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, node: Any, key: Any, name: str, expected: str, found: Any) -> PlanError:
        line = None
        if isinstance(node, _Map):
            line = node.key_lines.get(key, node.line)
        elif isinstance(node, _Seq):
            line = node.item_lines[key] if isinstance(key, int) and key < len(node.item_lines) else node.line
        return PlanError(self.path, line, name, expected, found)

    def mapping(self, parent: Any, key: Any, name: str, allowed: tuple[str, ...], required=()) -> _Map:
        node = parent[key] if key is not None else parent
        if node is None:
            node = _Map()
            node.line, node.key_lines = getattr(parent, "line", 0), {}
        if not isinstance(node, dict):
            raise self.fail(parent, key, name, "a mapping", node)
        for k in node:
            if k not in allowed:
                raise self.fail(node, k, f"{name}.{k}" if name else str(k), f"one of the keys {', '.join(allowed)}", k)
        for k in required:
            if k not in node:
                raise self.fail(parent, key, f"{name}.{k}" if name else k, "this key to be present", "nothing")
        return node

    def free_mapping(self, parent: Any, key: str, name: str) -> _Map:
        """A mapping whose keys are the user's own names (arguments, size symbols)."""
        node = parent.get(key)
        if not isinstance(node, dict):
            raise self.fail(parent, key, name, "a mapping", node)
        return node

    def value(self, node: _Map, key: str, name: str, types: tuple[type, ...], expected: str, default=None):
        if key not in node:
            return default
        v = node[key]
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise self.fail(node, key, name, expected, v)
        return v

    def choice(self, node: _Map, key: str, name: str, choices: tuple[str, ...], default=None):
        v = self.value(node, key, name, (str,), f"one of {', '.join(choices)}", default)
        if v is not None and v not in choices:
            raise self.fail(node, key, name, f"one of {', '.join(choices)}", v)
        return v

    def str_list(self, node: _Map, key: str, name: str, choices: tuple[str, ...] | None = None, default=()):
        if key not in node:
            return tuple(default)
        v = node[key]
        items = v if isinstance(v, list) else [v]
        for i, item in enumerate(items):
            ok = isinstance(item, str) and (choices is None or item in choices)
            if not ok:
                expected = f"one of {', '.join(choices)}" if choices else "a string"
                raise (self.fail(v, i, f"{name}[{i}]", expected, item) if isinstance(v, _Seq)
                       else self.fail(node, key, name, expected, item))
        return tuple(items)

    def int_list(self, node: _Map, key: str, name: str, minimum: int = 0, default=()):
        if key not in node:
            return tuple(default)
        v = node[key]
        items = v if isinstance(v, list) else [v]
        for i, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, int) or item < minimum:
                expected = f"an integer >= {minimum}"
                raise (self.fail(v, i, f"{name}[{i}]", expected, item) if isinstance(v, _Seq)
                       else self.fail(node, key, name, expected, item))
        return tuple(items)


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class Dim:
    """One entry of a symbolic shape: an arithmetic expression over size symbols (`num_heads*head_size`,
    `num_seqs + 1`). `coeff` and `symbol` are set where it is `N*symbol`, `symbol` or a constant."""

    text: str
    coeff: int | None = None
    symbol: str | None = None

    def size(self, sizes: dict[str, int]) -> int:
        return int(evaluate(self.text, sizes))

    @property
    def names(self) -> set[str]:
        return names_in(self.text)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Arg:
    """One argument of the op's call, in call order."""

    name: str
    shape: tuple[Dim, ...] | None = None  # None: a scalar passed as is
    dtype: str = "act"
    layouts: tuple[str, ...] = ("contiguous",)
    init: str = "normal"
    init_args: Any = None  # a parameterised init's parameters ([low, high], {base: B})
    role: str = "input"
    value: Any = None  # scalars only (None: an optional tensor left out)
    value_expr: str | None = None  # a scalar computed from the sizes (`head_size`)
    pad: float = 0  # what CUDA-graph padding rows hold (a value valid for the op: a position, a length)
    line: int = 0

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


@dataclass(frozen=True)
class Rule:
    """An `exclude` or `expect` entry: axis values it matches, and why."""

    match: tuple[tuple[str, tuple], ...]
    why: str
    line: int

    def matches(self, cell_axes: dict[str, Any]) -> bool:
        return all(cell_axes[axis] in values for axis, values in self.match)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    # atol as a fraction of the output's largest magnitude: for reductions (a GEMM, attention), whose
    # outputs cancel to near zero while their rounding error follows the size of what was summed.
    of_max: bool = False


@dataclass(frozen=True)
class SizeSpec:
    """A size symbol: the values to draw and the constraints between symbols."""

    values: tuple[int, ...]
    awkward: bool | None = None  # None: numerics.awkward_sizes decides
    divides: str | None = None  # this size divides that symbol's (GQA: num_kv_heads divides num_heads)
    multiple_of: int = 1
    even: bool = False
    at_most: str | None = None  # not larger than that symbol's size (a partial rotary dim)


@dataclass(frozen=True)
class Contract:
    """What a kernel is written for (`op.contract`, or a named baseline's `contract`). Inputs outside it are not
    drawn for the kernel, cells of other dtypes are excluded, benchmark shapes outside it are not timed for it, and
    the kernel's vLLM plugin rejects calls outside it in supports_args (vLLM then falls back). Sizes are the plan's
    symbols as drawn (before tensor-parallel sharding); a row stride is stride(-2), in elements."""

    contiguous: tuple[str, ...] = ()  # tensors that must be fully contiguous
    row_stride_multiple_of: tuple[tuple[str, int], ...] = ()  # (tensor, N): its rows start N elements apart
    multiple_of: tuple[tuple[str, int], ...] = ()  # (size symbol, N)
    at_least: tuple[tuple[str, int], ...] = ()
    at_most: tuple[tuple[str, int], ...] = ()
    dtypes: tuple[str, ...] = ()  # the cell dtypes it supports; empty: all
    why: str = ""
    line: int = 0

    @property
    def empty(self) -> bool:
        return not (self.contiguous or self.row_stride_multiple_of or self.multiple_of or self.at_least
                    or self.at_most or self.dtypes)

    def layouts(self, arg: Arg) -> tuple[str, ...]:
        """The layouts drawn for `arg`: contiguous alone where the contract says so."""
        return ("contiguous",) if arg.name in self.contiguous else arg.layouts

    def bounds(self, sym: str) -> tuple[int, int | None]:
        return dict(self.at_least).get(sym, 1), dict(self.at_most).get(sym)

    def size_step(self, sym: str, args: tuple[Arg, ...]) -> int:
        """What `sym` is drawn a multiple of: its multiple_of, and where a tensor drawn only contiguous has rows
        `N*sym` wide, what makes them a multiple of its row stride apart."""
        step = dict(self.multiple_of).get(sym, 1)
        for name, n in self.row_stride_multiple_of:
            arg = next(a for a in args if a.name == name)
            width = arg.shape[-1]
            if "strided" not in self.layouts(arg) and width.symbol == sym:
                step = math.lcm(step, n // math.gcd(n, width.coeff))
        return step

    def allows_size(self, sym: str, value: int, args: tuple[Arg, ...]) -> bool:
        low, high = self.bounds(sym)
        return value % self.size_step(sym, args) == 0 and value >= low and (high is None or value <= high)

    def outside(self, args: tuple[Arg, ...], sizes: dict[str, int], dtype: str) -> str:
        """Why a call on contiguous tensors of these sizes and dtype is outside the contract ("" when it is not)."""
        if self.dtypes and dtype not in self.dtypes:
            return f"dtype {dtype} is not one of {', '.join(self.dtypes)}"
        for sym, value in sizes.items():
            low, high = self.bounds(sym)
            n = dict(self.multiple_of).get(sym, 1)
            if value % n:
                return f"{sym} {value} is not a multiple of {n}"
            if value < low:
                return f"{sym} {value} is below {low}"
            if high is not None and value > high:
                return f"{sym} {value} is above {high}"
        for name, n in self.row_stride_multiple_of:
            width = next(a for a in args if a.name == name).shape[-1].size(sizes)
            if width % n:
                return f"{name}'s row stride {width} is not a multiple of {n}"
        return ""

    def describe(self) -> str:
        """The contract in words: "x contiguous; hidden a multiple of 8; dtypes bf16, fp16"."""
        parts = [f"{', '.join(self.contiguous)} contiguous"] if self.contiguous else []
        parts += [f"{name}'s row stride a multiple of {n} elements" for name, n in self.row_stride_multiple_of]
        parts += [f"{sym} a multiple of {n}" for sym, n in self.multiple_of]
        parts += [f"{sym} at least {n}" for sym, n in self.at_least]
        parts += [f"{sym} at most {n}" for sym, n in self.at_most]
        parts += [f"dtypes {', '.join(self.dtypes)}"] if self.dtypes else []
        return "; ".join(parts)


@dataclass(frozen=True)
class Quantized:
    """One quantized output: compared in its quantized domain, with its scale tensor."""

    output: str
    scale: str  # the argument or output holding its scales
    granularity: str


@dataclass(frozen=True)
class Quantization:
    outputs: tuple[Quantized, ...] = ()
    # At most this fraction of a quantized output's elements may be one quantization step off (vLLM's fp8 tests).
    max_step_fraction: float = 0.01

    def of(self, output: str) -> Quantized | None:
        return next((q for q in self.outputs if q.output == output), None)

@dataclass(frozen=True)
class Numerics:
    examples: int = 30
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    prefill_tokens: tuple[int, int] = (128, 8192)
    timeout_s: float = 300.0
    # Triton's interpreter costs milliseconds per program instance, so CPU cells draw at most
    # this many elements per activation; the cap applied is recorded with each result.
    cpu_element_budget: int = 65536
    # Longest context a sequence of a structured batch reaches (positions, paged KV); capped by the budget on CPUs.
    max_model_len: int = 4096
    # Sizes a CPU machine draws instead of op.sizes (symbol -> values), where a model's real sizes would take
    # the interpreter minutes per example (a linear's weight); the report says what the CPU run sampled.
    cpu_sizes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # Draw odd, non-power-of-two sizes besides the plan's own (off only for a kernel that is
    # exact for the listed sizes alone).
    awkward_sizes: bool = True


@dataclass(frozen=True)
class Benchmark:
    decode: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()
    chunked_prefill: tuple[int, ...] = ()
    baselines: tuple[str, ...] = ("native", "compiled")
    # Named baselines by import path (Liger-Kernel's, FlashInfer's, ...), called like the kernel: name -> path.
    named: tuple[tuple[str, str], ...] = ()
    bytes: str | None = None  # optional byte model; default counts every tensor arg once
    flops: str | None = None
    # The real model each size comes from: ("hidden=4096", "Llama-3-8B"); a key may pair several symbols.
    models: tuple[tuple[str, str], ...] = ()
    contracts: tuple[tuple[str, Contract], ...] = ()  # named baseline -> its contract, where it states one

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {p: getattr(self, p) for p in PHASES if getattr(self, p)}

    def contract(self, name: str) -> Contract | None:
        """A named baseline's contract, None where it states none."""
        return dict(self.contracts).get(name)

    def model(self, sizes: dict) -> str | None:
        """The model a benchmark shape's sizes come from (the entry naming the most symbols wins), else None."""
        best = None
        for key, model in self.models:
            pairs = [part.split("=") for part in key.split(",")]
            if all(str(sizes.get(sym)) == value for sym, value in pairs) and (best is None or len(pairs) > best[0]):
                best = (len(pairs), model)
        return best[1] if best else None


@dataclass(frozen=True)
class TensorParallel:
    """How the op runs on N ranks. `trivial`: every rank gets the full inputs (replicated)."""

    kind: str = "trivial"
    # input name -> (dim, merged parts) for sharded inputs; absent inputs are replicated
    shard: tuple[tuple[str, int, int], ...] = ()
    # (output, "replicated" | "sum" | "gather", dim); outputs not listed are replicated
    combine: tuple[tuple[str, str, int], ...] = ()
    sequence_parallel: bool = False  # tensors with a num_tokens dim are split across ranks by tokens
    # (tensor, symbol): a sharded dim made of `symbol` equal units (whole heads), split only between units
    units: tuple[tuple[str, str], ...] = ()
    # tensors whose units are replicated when there are fewer than ranks (vLLM's KV heads below the TP size)
    replicate: tuple[str, ...] = ()
    # (output, merged parts) for gathered outputs in a merged layout ([a_r | b_r] on rank r)
    merged_outputs: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Vllm:
    target: str = "v1"
    route: str = "ir"
    layer: str | None = None  # e.g. vllm.model_executor.layers.layernorm:RMSNorm
    ir_op: str | None = None  # name under vllm.ir.ops
    custom_op: str | None = None  # vLLM CustomOp registry name, e.g. rms_norm
    provider: str | None = None  # IR provider name the plugin registers (default: <op name>_kernel)


@dataclass(frozen=True)
class Plan:
    path: Path
    name: str
    intent: str
    kernel: str
    reference: str
    fake: str | None  # torch.compile fake implementation; derived from the reference when absent
    description: str
    replaces: str | None
    args: tuple[Arg, ...]
    outputs: tuple[str, ...]
    mutates: tuple[str, ...]
    sizes: dict[str, tuple[int, ...]]
    size_specs: dict[str, SizeSpec]
    matrix: dict[str, tuple]
    excludes: tuple[Rule, ...]
    expects: tuple[Rule, ...]
    tolerance: dict[str, Tolerance]
    output_tolerance: dict[str, Tolerance]  # per output, over the dtype table (scales of a quantized output)
    numerics: Numerics
    benchmark: Benchmark
    tp: TensorParallel
    quantization: Quantization
    generate: str | None  # import path of a custom input generator
    vllm: Vllm
    capture_sizes: tuple[int, ...] | None
    accumulation: str
    raw_text: str = field(repr=False, default="")
    warnings: tuple[str, ...] = ()  # settings that can never apply to a cell of the matrix
    contract: Contract = Contract()  # the kernel's preconditions (op.contract)

    def load_kernel(self) -> Callable:
        if self.vllm_kernel:
            raise ValueError(f"{self.kernel} is vLLM's compiled kernel: harness.runtime.vllm_kernels.load_kernel loads it")
        return import_object(self.kernel)

    @property
    def vllm_kernel(self) -> str | None:
        """The torch.ops._C name where op.kernel is vLLM's own compiled kernel (`vllm:rms_norm`), else None."""
        return self.kernel.removeprefix(VLLM_KERNEL) if self.kernel.startswith(VLLM_KERNEL) else None

    def load_reference(self) -> Callable:
        return import_object(self.reference)

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    def has_arg(self, name: str) -> bool:
        return any(a.name == name for a in self.args)

    @property
    def tensor_args(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.is_tensor)

    @property
    def returned_outputs(self) -> tuple[str, ...]:
        """Outputs the op returns (the others are written into its arguments)."""
        return tuple(o for o in self.outputs if not self.has_arg(o))

    @property
    def written_args(self) -> tuple[str, ...]:
        """Arguments the op writes: output buffers, then the inputs it mutates."""
        return tuple(a.name for a in self.args if a.role == "output") + tuple(self.mutates)

    def token_dim(self, name: str) -> int | None:
        """The num_tokens dimension of an argument (None: it has none); returned outputs have tokens first."""
        if not self.has_arg(name):
            return 0
        return next((i for i, d in enumerate(self.arg(name).shape or ()) if d.symbol == "num_tokens"), None)

    @property
    def op_namespace(self) -> str:
        """The torch.library namespace of the op: the kernel's top-level package (e.g. `kernels`); `vllm_c` for
        vLLM's compiled kernels (torch.ops.vllm is vLLM's own namespace)."""
        if self.vllm_kernel:
            return "vllm_c"
        return re.sub(r"\W", "_", self.kernel.split(":")[0].split(".")[0])

    @property
    def op_qualname(self) -> str:
        """The one torch.library name of the op: what cells test, the report documents and the plugin ships."""
        return f"{self.op_namespace}::{self.name}"

    def schema(self) -> str:
        """The torch.library schema of the kernel's call: written arguments aliased, scalars typed."""
        written = set(self.written_args)
        params = []
        for i, a in enumerate(self.args):
            if a.is_tensor:
                params.append(f"Tensor(a{i}!) {a.name}" if a.name in written else f"Tensor {a.name}")
            elif a.value_expr:
                params.append(f"int {a.name}")
            elif a.value is None:  # an optional tensor left out
                params.append(f"Tensor? {a.name}")
            else:
                kind = {bool: "bool", int: "int", float: "float", str: "str"}[type(a.value)]
                params.append(f"{kind} {a.name}")
        n_ret = len(self.returned_outputs)
        ret = "()" if n_ret == 0 else "Tensor" if n_ret == 1 else "(" + ", ".join(["Tensor"] * n_ret) + ")"
        return f"({', '.join(params)}) -> {ret}"

    def cuda_graph_sizes(self) -> list[int]:
        """Capture sizes: the plan's, else vLLM's defaults for numerics.max_num_seqs."""
        return sorted(self.capture_sizes or vllm_capture_sizes(self.numerics.max_num_seqs))


def vllm_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default cudagraph capture sizes: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)."""
    largest = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
    return [s for s in sizes if s <= largest]


def import_object(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------- parsing


def _parse_dim(text: Any) -> Dim | None:
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return Dim(str(text), text, None)
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"\s*(?:(\d+)\s*\*\s*)?([A-Za-z_]\w*)\s*", text)
    if m:
        return Dim(text.strip(), int(m.group(1) or 1), m.group(2))
    try:
        names_in(text)
    except ValueError:
        return None
    return Dim(text.strip())


def _check_import(r: _Reader, node: _Map, key: str, name: str, optional_module: str | None = None):
    path = r.value(node, key, name, (str,), "an import path 'package.module:attribute'")
    if path is None:
        return None
    if not re.fullmatch(r"[\w.]+:[\w.]+", path):
        raise r.fail(node, key, name, "an import path 'package.module:attribute'", path)
    if optional_module and path.split(".")[0] == optional_module:
        return path  # checked where it is used: the package may not be installed here
    try:
        obj = import_object(path)
    except Exception as exc:  # any import-time failure is a plan error here, not a crash
        raise r.fail(node, key, name, f"an importable object ({type(exc).__name__}: {exc})", path) from None
    if not callable(obj) and key not in ("replaces", "layer"):
        raise r.fail(node, key, name, "a function (callable)", f"{path}, a {type(obj).__name__}")
    return path


def _check_kernel(r: _Reader, op: _Map) -> str:
    """op.kernel: an import path, or `vllm:<name>`, one of vLLM's compiled kernels the harness describes."""
    path = r.value(op, "kernel", "op.kernel", (str,), "an import path 'package.module:attribute' or vllm:<name>")
    if not path.startswith(VLLM_KERNEL):
        return _check_import(r, op, "kernel", "op.kernel")
    if path.removeprefix(VLLM_KERNEL) not in VLLM_KERNELS:
        raise r.fail(op, "kernel", "op.kernel", "vllm:<name> naming one of vLLM's kernels "
                     f"({', '.join(sorted(VLLM_KERNELS))}), or an import path 'package.module:attribute'", path)
    return path


def _check_vllm_schema(r: _Reader, root: _Map, op: _Map, plan: "Plan") -> None:
    """A `vllm:` kernel is called with the plan's arguments in order: they must be its schema's parameters; and it
    is not its own baseline."""
    kernel = VLLM_KERNELS[plan.vllm_kernel]
    for index, expected, found in mismatches(kernel, plan.args, plan.written_args):
        if index is None:
            raise r.fail(op, "args", "op.args", expected, found)
        name = plan.args[index].name
        raise r.fail(op["args"], name, f"op.args.{name}", expected, found)
    if "vllm" in plan.benchmark.baselines:
        raise r.fail(root["benchmark"], "baselines", "benchmark.baselines",
                     f"native, compiled or named baselines (the kernel is vLLM's own {kernel.call}: it is timed as the "
                     "kernel)", "vllm")


def _check_signature(r: _Reader, node: _Map, key: str, name: str, path: str | None, names: list[str],
                     positional: bool = False) -> None:
    """The callable at `path` accepts the plan's arguments as the harness passes them (by name, or in order)."""
    if path is None or path.split(".")[0] == "vllm":
        return
    try:
        sig = inspect.signature(import_object(path))
    except (TypeError, ValueError):  # a builtin or an op without a Python signature: checked when called
        return
    try:
        sig.bind(*names) if positional else sig.bind(**{n: None for n in names})
    except TypeError as exc:
        how = "in order" if positional else "by name"
        raise r.fail(node, key, name, f"a function taking the plan's arguments {how} ({', '.join(names)}): {exc}",
                     f"{path}{sig}") from None


def _never_applies(r: _Reader, root: _Map, plan: "Plan") -> tuple[str, ...]:
    """Settings that can never apply to any cell of the matrix, as warnings (file:line: field: ...): a narrowed
    matrix is a normal way of working, but a setting it leaves idle is said, not silently dropped."""
    m, found = plan.matrix, []
    for dt in plan.tolerance:
        if dt not in m["dtype"]:
            found.append(r.fail(root["tolerance"], dt, f"tolerance.{dt}", "a dtype of matrix.dtype", dt))
    if "cuda_graph" in root and "cuda_graph" not in m["graph_mode"]:
        found.append(r.fail(root, "cuda_graph", "cuda_graph", "cuda_graph in matrix.graph_mode for capture sizes "
                            "to apply", list(m["graph_mode"])))
    if plan.tp.kind == "sharded" and max(m["tp"]) == 1:
        found.append(r.fail(root, "tp", "tp.kind", "a matrix.tp above 1 for sharding to apply", list(m["tp"])))
    for phase in plan.benchmark.shapes():
        if phase not in m["phase"]:
            found.append(r.fail(root["benchmark"], phase, f"benchmark.{phase}", "a phase of matrix.phase", phase))
    cells = [dict(zip(AXES, v)) for v in itertools.product(*(m[a] for a in AXES))]
    for i, rule in enumerate(plan.expects):
        if not any(rule.matches(c) and not any(x.matches(c) for x in plan.excludes)
                   and c["dtype"] in (plan.contract.dtypes or m["dtype"]) for c in cells):
            found.append(r.fail(root["expect"], i, f"expect[{i}]", "a rule matching a cell the plan does not exclude",
                                dict(rule.match)))
    return tuple(str(w) for w in found)


def _check_models(r: _Reader, root: _Map, plan: "Plan") -> None:
    """The byte and flop models evaluate on the plan's sizes (else --bench would fail at collection)."""
    for field_name, expr in (("benchmark.bytes", plan.benchmark.bytes), ("benchmark.flops", plan.benchmark.flops)):
        if expr is None:
            continue
        names = {**{sym: values[0] for sym, values in plan.sizes.items()}, "num_tokens": 1, "act_bytes": 2}
        try:
            evaluate(expr, names)
        except ValueError as exc:
            raise r.fail(root["benchmark"], field_name.split(".")[1], field_name,
                         f"an arithmetic expression over {', '.join(sorted(names))} ({exc})", expr) from None


def _expr(r: _Reader, node, key, name: str, symbols: set[str]) -> str:
    """A size expression (a number, a symbol or arithmetic over symbols) naming only known symbols."""
    v = node[key]
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise r.fail(node, key, name, "a number or a size expression", v)
    try:
        unknown = sorted(names_in(str(v)) - symbols)
    except ValueError as exc:
        raise r.fail(node, key, name, f"a size expression ({exc})", v) from None
    if unknown:
        raise r.fail(node, key, name, f"symbols defined in op.sizes or built in ({', '.join(sorted(symbols))})",
                     unknown[0])
    return str(v)


def _parse_init(r: _Reader, spec: _Map, fname: str, symbols: set[str]) -> tuple[str, Any]:
    if "init" not in spec:
        return "normal", None
    init = spec["init"]
    if isinstance(init, str):
        if init not in INITS + STRUCTURED_INITS:
            raise r.fail(spec, "init", f"{fname}.init", f"one of {', '.join(INITS + STRUCTURED_INITS)} or a mapping "
                         f"with one of {', '.join(PARAM_INITS)}", init)
        return init, None
    if not isinstance(init, dict) or len(init) != 1 or next(iter(init)) not in PARAM_INITS:
        raise r.fail(spec, "init", f"{fname}.init", f"a name or a one-key mapping of {', '.join(PARAM_INITS)}", init)
    kind, params = next(iter(init.items()))
    where = f"{fname}.init.{kind}"
    if kind in ("uniform", "integers"):
        if not isinstance(params, list) or len(params) != 2:
            raise r.fail(init, kind, where, "[low, high]", params)
        bounds = tuple(_expr(r, params, i, f"{where}[{i}]", symbols) for i in range(2))
        return kind, bounds
    r.mapping(init, kind, where, ("base",), required=("base",))
    base = r.value(params, "base", f"{where}.base", (int, float), "the rotary base (a number)")
    return kind, {"base": float(base)}


def _parse_args(r: _Reader, op: _Map, symbols: set[str]) -> tuple[Arg, ...]:
    args_node = r.free_mapping(op, "args", "op.args")
    if not args_node:
        raise r.fail(op, "args", "op.args", "at least one argument", args_node)
    args = []
    for name, spec in args_node.items():
        fname = f"op.args.{name}"
        line = args_node.key_lines.get(name, args_node.line)
        if not isinstance(spec, dict):  # a scalar passed as is (eps, a flag; null: an optional tensor left out)
            if spec is not None and not isinstance(spec, (int, float, bool, str)):
                raise r.fail(args_node, name, fname, "a tensor spec mapping, a scalar or null", spec)
            args.append(Arg(name=name, value=spec, line=line))
            continue
        if "value" in spec:  # a scalar computed from the sizes
            r.mapping(args_node, name, fname, ("value",))
            args.append(Arg(name=name, value_expr=_expr(r, spec, "value", f"{fname}.value", symbols), line=line))
            continue
        r.mapping(args_node, name, fname, ("shape", "dtype", "layout", "init", "role", "pad"), required=("shape",))
        shape_node = spec["shape"]
        if not isinstance(shape_node, list):
            raise r.fail(spec, "shape", f"{fname}.shape", "a list of sizes or size expressions ([] for 0-d)",
                         shape_node)
        dims = []
        for i, entry in enumerate(shape_node):
            dim = _parse_dim(entry)
            if dim is None:
                raise r.fail(shape_node, i, f"{fname}.shape[{i}]",
                             "a positive integer, a symbol or a size expression (num_heads*head_size)", entry)
            unknown = sorted(dim.names - symbols)
            if unknown:
                raise r.fail(shape_node, i, f"{fname}.shape[{i}]",
                             f"a symbol defined in op.sizes or built in ({', '.join(sorted(symbols))})", unknown[0])
            dims.append(dim)
        dtype = r.value(spec, "dtype", f"{fname}.dtype", (str,), "'act' or a torch dtype name", "act")
        if dtype != "act" and dtype not in FIXED_DTYPES:
            raise r.fail(spec, "dtype", f"{fname}.dtype", f"'act' or one of {', '.join(FIXED_DTYPES)}", dtype)
        init, init_args = _parse_init(r, spec, fname, symbols)
        args.append(Arg(
            name=name, shape=tuple(dims), dtype=dtype,
            layouts=r.str_list(spec, "layout", f"{fname}.layout", LAYOUTS, ("contiguous",)),
            init=init, init_args=init_args,
            role=r.choice(spec, "role", f"{fname}.role", ROLES, "input"),
            pad=r.value(spec, "pad", f"{fname}.pad", (int, float), "a number (the CUDA-graph padding value)", 0),
            line=line,
        ))
    return tuple(args)


def _parse_sizes(r: _Reader, op: _Map) -> tuple[dict[str, tuple[int, ...]], dict[str, SizeSpec]]:
    sizes_node = r.free_mapping(op, "sizes", "op.sizes") if "sizes" in op else _Map()
    sizes, specs = {}, {}
    for sym, node in sizes_node.items():
        f = f"op.sizes.{sym}"
        if sym in BUILTIN_SYMBOLS:
            raise r.fail(sizes_node, sym, f, f"a symbol other than the built-in {', '.join(BUILTIN_SYMBOLS)}", sym)
        if not isinstance(node, dict):
            node = _Map({"values": node})
            node.line, node.key_lines = sizes_node.line, {"values": sizes_node.key_lines.get(sym, sizes_node.line)}
        else:
            r.mapping(sizes_node, sym, f, SIZE_CONSTRAINTS, required=("values",))
        values = r.int_list(node, "values", f, minimum=1)
        if not values:
            raise r.fail(sizes_node, sym, f, "at least one size", node.get("values"))
        spec = SizeSpec(values, r.value(node, "awkward", f"{f}.awkward", (bool,), "true or false"),
                        r.value(node, "divides", f"{f}.divides", (str,), "a size symbol"),
                        r.value(node, "multiple_of", f"{f}.multiple_of", (int,), "a positive integer", 1),
                        r.value(node, "even", f"{f}.even", (bool,), "true or false", False),
                        r.value(node, "at_most", f"{f}.at_most", (str,), "a size symbol"))
        for key in ("divides", "at_most"):
            other = getattr(spec, key)
            if other is not None and (other not in sizes_node or other == sym):
                raise r.fail(node, key, f"{f}.{key}", "another symbol of op.sizes", other)
        bad = [v for v in values if v % spec.multiple_of or (spec.even and v % 2)]
        if bad:
            raise r.fail(node, "values", f, "values that meet the symbol's own constraints (multiple_of, even)", bad[0])
        sizes[sym], specs[sym] = values, spec
    return sizes, specs


def _parse_tolerances(r: _Reader, root: _Map, outputs: tuple[str, ...]):
    tolerance, per_output = {}, {}
    if "tolerance" not in root:
        return tolerance, per_output
    tol_node = r.mapping(root, "tolerance", "tolerance", DTYPES + ("outputs",))

    def one(parent, key, name) -> Tolerance:
        t = r.mapping(parent, key, name, ("atol", "rtol", "atol_of"), required=("atol", "rtol"))
        return Tolerance(float(r.value(t, "atol", f"{name}.atol", (int, float), "a number >= 0")),
                         float(r.value(t, "rtol", f"{name}.rtol", (int, float), "a number >= 0")),
                         r.choice(t, "atol_of", f"{name}.atol_of", ("max",)) == "max")

    for key in tol_node:
        if key == "outputs":
            outs = r.mapping(tol_node, "outputs", "tolerance.outputs", outputs)
            per_output = {o: one(outs, o, f"tolerance.outputs.{o}") for o in outs}
        else:
            tolerance[key] = one(tol_node, key, f"tolerance.{key}")
    return tolerance, per_output


def _parse_quantization(r: _Reader, root: _Map, args: tuple[Arg, ...], outputs: tuple[str, ...]) -> Quantization:
    node = root.get("quantization", "none")
    if node == "none" or node is None:
        return Quantization()
    r.mapping(root, "quantization", "quantization", ("outputs", "max_step_fraction"), required=("outputs",))
    outs = r.mapping(node, "outputs", "quantization.outputs", outputs)
    names = {a.name for a in args} | set(outputs)
    quantized = []
    for out, spec in outs.items():
        f = f"quantization.outputs.{out}"
        r.mapping(outs, out, f, ("scale", "granularity"), required=("scale", "granularity"))
        scale = r.value(spec, "scale", f"{f}.scale", (str,), "the argument or output holding the scales")
        if scale not in names:
            raise r.fail(spec, "scale", f"{f}.scale", f"an argument or output ({', '.join(sorted(names))})", scale)
        arg = next((a for a in args if a.name == out), None)
        if arg is not None and arg.dtype not in ("fp8", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int8"):
            raise r.fail(outs, out, f, "an output of a quantized dtype (fp8, float8_*, int8)", arg.dtype)
        quantized.append(Quantized(out, scale, r.choice(spec, "granularity", f"{f}.granularity", GRANULARITIES)))
    frac = r.value(node, "max_step_fraction", "quantization.max_step_fraction", (int, float), "a fraction in [0, 1]",
                   0.01)
    if not 0 <= frac <= 1:
        raise r.fail(node, "max_step_fraction", "quantization.max_step_fraction", "a fraction in [0, 1]", frac)
    return Quantization(tuple(quantized), float(frac))


def _parse_rules(r: _Reader, root: _Map, key: str, axis_values: dict[str, tuple]) -> tuple[Rule, ...]:
    if key not in root or root[key] is None:
        return ()
    node = root[key]
    if not isinstance(node, list):
        raise r.fail(root, key, key, "a list of rules", node)
    rules = []
    for i, entry in enumerate(node):
        name = f"{key}[{i}]"
        allowed = AXES + ("why", "status") if key == "expect" else AXES + ("why",)
        if not isinstance(entry, dict):
            raise r.fail(node, i, name, "a mapping of axis values and 'why'", entry)
        r.mapping(node, i, name, allowed, required=("why",))
        why = r.value(entry, "why", f"{name}.why", (str,), "a reason as text")
        if not why.strip():
            raise r.fail(entry, "why", f"{name}.why", "a non-empty reason", why)
        if key == "expect":
            r.choice(entry, "status", f"{name}.status", ("fail",), "fail")
        match = []
        for axis in AXES:
            if axis not in entry:
                continue
            values = entry[axis] if isinstance(entry[axis], list) else [entry[axis]]
            for v in values:
                if v not in axis_values[axis]:
                    raise r.fail(entry, axis, f"{name}.{axis}",
                                 f"values of matrix.{axis} ({', '.join(map(str, axis_values[axis]))})", v)
            match.append((axis, tuple(values)))
        if not match:
            raise r.fail(node, i, name, "at least one axis to match", dict(entry))
        rules.append(Rule(tuple(match), why, entry.line))
    return tuple(rules)


def _parse_tp(r: _Reader, root: _Map, args: tuple[Arg, ...], outputs: tuple[str, ...],
              tp_sizes: tuple[int, ...] = (1,), symbol_names: tuple[str, ...] = ()) -> TensorParallel:
    if "tp" not in root:
        return TensorParallel()
    node = r.mapping(root, "tp", "tp", ("kind", "inputs", "outputs", "sequence_parallel"), required=("kind",))
    kind = r.choice(node, "kind", "tp.kind", ("trivial", "sharded"))
    sp = r.value(node, "sequence_parallel", "tp.sequence_parallel", (bool,), "true or false", False)
    tensor_names = {a.name: a for a in args if a.is_tensor}

    def has_tokens(name: str) -> bool:
        return name in tensor_names and any(d.symbol == "num_tokens" for d in tensor_names[name].shape)

    units, replicate = [], []

    def check_dim(spec: _Map, key: str, f: str, name: str, merged: int) -> int:
        """A dimension of `name` that can be split into tp * merged equal parts for every TP size."""
        dim = r.value(spec, key, f"{f}.{key}", (int,), "a dimension (an integer)")
        unit = r.value(spec, "units", f"{f}.units", (str,), "the size symbol counting the dim's units (num_heads)")
        if unit is not None:
            if unit not in symbol_names:
                raise r.fail(spec, "units", f"{f}.units", "a symbol of op.sizes", unit)
            units.append((name, unit))
        if r.value(spec, "replicate", f"{f}.replicate", (bool,), "true or false", False):
            if unit is None:
                raise r.fail(spec, "replicate", f"{f}.replicate", "units to replicate (set units too)", True)
            replicate.append(name)
        if name not in tensor_names:
            return dim  # a returned output: its shape is the op's to decide
        shape = tensor_names[name].shape
        if not -len(shape) <= dim < len(shape):
            raise r.fail(spec, key, f"{f}.{key}", f"a dimension of a {len(shape)}-d tensor", dim)
        d = shape[dim]
        if d.symbol == "num_tokens":
            raise r.fail(spec, key, f"{f}.{key}", "a dimension other than num_tokens "
                         "(tokens are split with tp.sequence_parallel)", dim)
        bad = [n for n in tp_sizes if d.symbol is None and d.coeff is not None and d.coeff % (n * merged)]
        if bad:
            raise r.fail(spec, key, f"{f}.{key}", f"a dimension divisible by tp x merged ({bad[0]} x {merged})",
                         str(d))
        return dim % len(shape)

    def merged_parts(spec: _Map, f: str) -> int:
        merged = r.value(spec, "merged", f"{f}.merged", (int,), "the number of merged parts (>= 1)", 1)
        if merged < 1:
            raise r.fail(spec, "merged", f"{f}.merged", "the number of merged parts (>= 1)", merged)
        return merged

    shard, combine, merged_outputs = [], [], []
    if "inputs" in node:
        inputs = r.mapping(node, "inputs", "tp.inputs", tuple(tensor_names))
        for name, spec in inputs.items():
            f = f"tp.inputs.{name}"
            if spec == "replicated":
                continue
            r.mapping(inputs, name, f, ("shard", "merged", "units", "replicate"), required=("shard",))
            if sp and has_tokens(name):
                raise r.fail(inputs, name, f, "'replicated' (tp.sequence_parallel already splits it by tokens)",
                             dict(spec))
            merged = merged_parts(spec, f)
            shard.append((name, check_dim(spec, "shard", f, name, merged), merged))
    if "outputs" in node:
        outs = r.mapping(node, "outputs", "tp.outputs", outputs)
        for name, spec in outs.items():
            f = f"tp.outputs.{name}"
            if sp and has_tokens(name) and spec != "replicated":
                raise r.fail(outs, name, f, "'replicated' (tp.sequence_parallel puts it back together by tokens)",
                             spec if isinstance(spec, str) else dict(spec))
            if spec in ("replicated", "sum"):
                combine.append((name, spec, 0))
                continue
            r.mapping(outs, name, f, ("gather", "merged", "units", "replicate"), required=("gather",))
            merged = merged_parts(spec, f)
            combine.append((name, "gather", check_dim(spec, "gather", f, name, merged)))
            if merged > 1:
                merged_outputs.append((name, merged))
    if kind == "trivial" and (shard or any(c[1] != "replicated" for c in combine)):
        raise r.fail(node, "kind", "tp.kind", "'sharded' when inputs are sharded or outputs combined", kind)
    if kind == "sharded" and not shard and not sp:
        raise r.fail(node, "kind", "tp.inputs", "at least one sharded input for kind 'sharded'", "none")
    if kind == "sharded":
        declared = {c[0] for c in combine}
        for name in outputs:
            if name not in declared and not (sp and has_tokens(name)):
                where = node["outputs"] if "outputs" in node else node
                raise r.fail(where, None if "outputs" in node else "kind", f"tp.outputs.{name}",
                             "how ranks' outputs combine for kind 'sharded' (replicated, sum or {gather: dim})",
                             "nothing")
    return TensorParallel(kind, tuple(shard), tuple(combine), sp, merged_outputs=tuple(merged_outputs),
                          units=tuple(units), replicate=tuple(replicate))


def _parse_contract(r: _Reader, parent: _Map, key: str, name: str, args: tuple[Arg, ...],
                    sizes: dict[str, tuple[int, ...]], matrix_dtypes: tuple[str, ...],
                    cpu_sizes: tuple[tuple[str, tuple[int, ...]], ...]) -> Contract:
    """A kernel's contract (`op.contract`, or a named baseline's): known names, positive numbers, and something
    of the plan left to draw under it."""
    node = r.mapping(parent, key, name, CONTRACT_KEYS)
    tensors = {a.name: a for a in args if a.is_tensor}

    def counts(k: str, keys: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        if k not in node:
            return ()
        entries = r.mapping(node, k, f"{name}.{k}", keys)
        for sub, n in entries.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise r.fail(entries, sub, f"{name}.{k}.{sub}", "a positive integer", n)
        return tuple(entries.items())

    contiguous = r.str_list(node, "contiguous", f"{name}.contiguous", tuple(tensors))
    for i, t in enumerate(contiguous):
        if "contiguous" not in tensors[t].layouts:  # nothing of the plan's would be left to draw
            where = (node["contiguous"], i, f"{name}.contiguous[{i}]") if isinstance(node["contiguous"], _Seq) \
                else (node, "contiguous", f"{name}.contiguous")
            raise r.fail(*where, f"a tensor the plan draws contiguous (op.args.{t}.layout lists contiguous)", t)
    strides = counts("row_stride_multiple_of", tuple(tensors))
    for t, n in strides:
        rows, f, shape = node["row_stride_multiple_of"], f"{name}.row_stride_multiple_of.{t}", tensors[t].shape
        if len(shape) < 2:
            raise r.fail(rows, t, f, "a tensor of 2 or more dimensions (one with rows)", f"{t}: {len(shape)}-d")
        width = shape[-1]
        if not width.names <= set(sizes):
            raise r.fail(rows, t, f, "a tensor whose last dimension is made of op.sizes symbols", str(width))
        if t in contiguous or "strided" not in tensors[t].layouts:  # its rows are its width apart
            if width.coeff is None:
                raise r.fail(rows, t, f, f"a tensor whose last dimension is a number, a symbol or N*symbol, as "
                             f"{t} is drawn contiguous only (its width is its row stride)", str(width))
            if width.symbol is None and width.coeff % n:
                raise r.fail(rows, t, f, f"a multiple that {t}'s width ({width.coeff}) meets, as {t} is drawn "
                             "contiguous only", n)
    multiple, at_least, at_most = (counts(k, tuple(sizes)) for k in ("multiple_of", "at_least", "at_most"))
    for sym, high in at_most:
        low = dict(at_least).get(sym, 1)
        if low > high:
            raise r.fail(node["at_most"], sym, f"{name}.at_most.{sym}", f"at least {name}.at_least.{sym} ({low})",
                         high)
    dtypes = r.str_list(node, "dtypes", f"{name}.dtypes", matrix_dtypes)
    if "dtypes" in node and not dtypes:
        raise r.fail(node, "dtypes", f"{name}.dtypes", "at least one dtype of matrix.dtype", [])
    contract = Contract(contiguous, strides, multiple, at_least, at_most, dtypes,
                        r.value(node, "why", f"{name}.why", (str,), "text", ""), parent.key_lines.get(key, parent.line))
    # Every constrained size keeps at least one of the plan's sizes (on a CPU machine, of numerics.cpu_sizes).
    for sym, planned in sizes.items():
        for values, where in ((planned, f"op.sizes.{sym}"), (dict(cpu_sizes).get(sym), f"numerics.cpu_sizes.{sym}")):
            if not values or any(contract.allows_size(sym, v, args) for v in values):
                continue
            listed = ", ".join(map(str, values))
            k = next((k for k in ("multiple_of", "at_least", "at_most") if sym in dict(getattr(contract, k))), None)
            if k:
                raise r.fail(node[k], sym, f"{name}.{k}.{sym}", f"a constraint that a size of {where} ({listed}) "
                             "meets", node[k][sym])
            t = next(t for t, _ in strides if tensors[t].shape[-1].symbol == sym)
            raise r.fail(node["row_stride_multiple_of"], t, f"{name}.row_stride_multiple_of.{t}",
                         f"a multiple that {t}'s rows ({tensors[t].shape[-1]} wide, drawn contiguous only) meet for "
                         f"a size of {where} ({listed})", dict(strides)[t])
    return contract


def _parse_baselines(r: _Reader, node: _Map, contract_of: Callable) -> tuple[tuple[str, ...], tuple, tuple]:
    """`benchmark.baselines`: built-in names (native, compiled, vllm), `{name: import path}` entries and
    `{name: {path: import path, contract: {...}}}` entries; returns (built-in, named, named contracts)."""
    if "baselines" not in node:
        return ("native", "compiled"), (), ()
    items = node["baselines"] if isinstance(node["baselines"], list) else [node["baselines"]]
    builtin, named, contracts = [], [], []
    for i, item in enumerate(items):
        where = f"benchmark.baselines[{i}]"
        if isinstance(item, str) and item in BASELINES:
            builtin.append(item)
        elif isinstance(item, dict) and len(item) == 1:
            name, path = next(iter(item.items()))
            if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)) or name in BASELINES + ("kernel",):
                raise r.fail(item, name, where, "a baseline name of lowercase letters, digits and _ other than "
                             f"{', '.join(BASELINES)} and kernel"
                             + (" (YAML reads off/on/yes/no/true/false as a boolean: quote the name)"
                                if isinstance(name, bool) else ""), name)
            if name in dict(named):
                raise r.fail(item, name, where, "a baseline name not used before in benchmark.baselines", name)
            holder, key, field_name = item, name, f"{where}.{name}"
            if isinstance(path, dict):  # {name: {path: ..., contract: {...}}}
                r.mapping(item, name, field_name, ("path", "contract"), required=("path",))
                if "contract" in path:
                    contracts.append((name, contract_of(path, "contract", f"{field_name}.contract")))
                holder, key, field_name, path = path, "path", f"{field_name}.path", path["path"]
            # Syntax only: the package may be installed on one machine and not on another; a benchmark that
            # cannot import it reports that baseline as not run.
            if not isinstance(path, str) or not re.fullmatch(r"[\w.]+:[\w.]+", path):
                raise r.fail(holder, key, field_name, "an import path 'package.module:attribute'", path)
            named.append((name, path))
        else:
            expected = (f"one of {', '.join(BASELINES)} or {{name: 'package.module:attribute'}} or "
                        "{name: {path: 'package.module:attribute', contract: {...}}}")
            raise (r.fail(node["baselines"], i, where, expected, item) if isinstance(node["baselines"], _Seq)
                   else r.fail(node, "baselines", where, expected, item))
    return tuple(builtin), tuple(named), tuple(contracts)


def _parse_models(r: _Reader, node: _Map, sizes: dict[str, tuple[int, ...]]) -> tuple[tuple[str, str], ...]:
    """`benchmark.models`: `{"hidden=4096": "Llama-3-8B"}`, keys of `symbol=value` pairs (comma-separated) over
    the plan's sizes, values the model's name."""
    if "models" not in node:
        return ()
    models = r.free_mapping(node, "models", "benchmark.models")
    choices = "; ".join(f"{sym}: {', '.join(map(str, values))}" for sym, values in sizes.items()) or "none"
    out = []
    for key, model in models.items():
        f = f"benchmark.models.{key}"
        pairs = []
        for part in str(key).split(","):
            sym, eq, value = (t.strip() for t in part.partition("="))
            if not eq or sym not in sizes or not value.isdigit() or int(value) not in sizes[sym]:
                raise r.fail(models, key, f, f"'symbol=value' pairs with sizes of op.sizes ({choices})", key)
            pairs.append(f"{sym}={int(value)}")
        if not isinstance(model, str) or not model.strip():
            raise r.fail(models, key, f, "the name of the model these sizes come from", model)
        out.append((",".join(pairs), " ".join(model.split())))
    return tuple(out)


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    r = _Reader(str(path))
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(str(path), None, "(file)", "a readable plan file", exc.strerror) from None
    try:
        root = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PlanError(str(path), mark.line + 1 if mark else None, "(yaml)", "valid YAML",
                        getattr(exc, "problem", str(exc))) from None
    if not isinstance(root, dict):
        raise PlanError(str(path), 1, "(top level)", "a mapping with an 'op' section", root)
    r.mapping(root, None, "", ("op", "matrix", "exclude", "expect", "tolerance", "numerics", "benchmark", "tp",
                               "quantization", "vllm", "cuda_graph"), required=("op", "matrix"))

    op = r.mapping(root, "op", "op", ("name", "intent", "description", "kernel", "reference", "replaces", "args",
                                      "outputs", "mutates", "sizes", "accumulation", "fake", "generate",
                                      "contract"),
                   required=("name", "intent", "kernel", "reference", "args", "outputs"))
    name = r.value(op, "name", "op.name", (str,), "an identifier")
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise r.fail(op, "name", "op.name", "an identifier (letters, digits, _)", name)
    intent = r.choice(op, "intent", "op.intent", INTENTS)

    sizes, size_specs = _parse_sizes(r, op)
    args = _parse_args(r, op, set(sizes) | set(BUILTIN_SYMBOLS))
    tensor_names = tuple(a.name for a in args if a.is_tensor)
    outputs = r.str_list(op, "outputs", "op.outputs")
    mutates = r.str_list(op, "mutates", "op.mutates", tensor_names)
    for i, out in enumerate(outputs):
        a = next((a for a in args if a.name == out), None)
        if a is not None and a.role != "output" and out not in mutates:
            raise r.fail(op["outputs"], i, f"op.outputs[{i}]",
                         "an output argument (role: output), a mutated input, or a name for a returned value", out)
    for a in args:
        if a.role == "output" and a.name not in outputs:
            raise r.fail(op["args"], a.name, f"op.args.{a.name}.role", "output arguments to be listed in op.outputs",
                         a.name)

    mx = r.mapping(root, "matrix", "matrix", AXES, required=AXES)
    matrix = {
        "phase": r.str_list(mx, "phase", "matrix.phase", PHASES),
        "dtype": r.str_list(mx, "dtype", "matrix.dtype", DTYPES),
        "tp": r.int_list(mx, "tp", "matrix.tp", minimum=1),
        "graph_mode": r.str_list(mx, "graph_mode", "matrix.graph_mode", GRAPH_MODES),
        "sm": r.str_list(mx, "sm", "matrix.sm"),
    }
    for i, sm in enumerate(matrix["sm"]):
        if not SM_PATTERN.match(sm):
            node = mx["sm"]
            raise (r.fail(node, i, f"matrix.sm[{i}]", SM_EXPECTED, sm) if isinstance(node, _Seq)
                   else r.fail(mx, "sm", "matrix.sm", SM_EXPECTED, sm))
    for axis, values in matrix.items():
        if not values:
            raise r.fail(mx, axis, f"matrix.{axis}", "at least one value", mx[axis])
        if len(set(values)) != len(values):
            raise r.fail(mx, axis, f"matrix.{axis}", "values without repeats", list(values))

    tolerance, output_tolerance = _parse_tolerances(r, root, outputs)

    num_node = r.mapping(root, "numerics", "numerics", tuple(f.name for f in dataclasses.fields(Numerics))) \
        if "numerics" in root else _Map()
    numerics_kw = {}
    for f in dataclasses.fields(Numerics):
        if f.name not in num_node:
            continue
        if f.name == "prefill_tokens":
            pair = r.int_list(num_node, f.name, "numerics.prefill_tokens", minimum=1)
            if len(pair) != 2 or pair[0] > pair[1]:
                raise r.fail(num_node, f.name, "numerics.prefill_tokens", "[min, max] token counts", list(pair))
            numerics_kw[f.name] = pair
        elif f.name == "timeout_s":
            numerics_kw[f.name] = float(r.value(num_node, f.name, "numerics.timeout_s", (int, float), "seconds"))
        elif f.name == "awkward_sizes":
            numerics_kw[f.name] = r.value(num_node, f.name, "numerics.awkward_sizes", (bool,), "true or false")
        elif f.name == "cpu_sizes":
            node = r.mapping(num_node, f.name, "numerics.cpu_sizes", tuple(sizes))
            numerics_kw[f.name] = tuple((sym, r.int_list(node, sym, f"numerics.cpu_sizes.{sym}", minimum=1))
                                        for sym in node)
        else:
            v = r.value(num_node, f.name, f"numerics.{f.name}", (int,), "a positive integer")
            if v < 1:
                raise r.fail(num_node, f.name, f"numerics.{f.name}", "a positive integer", v)
            numerics_kw[f.name] = v

    def contract_of(parent: _Map, key: str, field_name: str) -> Contract:
        return _parse_contract(r, parent, key, field_name, args, sizes, matrix["dtype"],
                               numerics_kw.get("cpu_sizes", ()))

    contract = contract_of(op, "contract", "op.contract") if "contract" in op else Contract()
    bench = Benchmark()
    if "benchmark" in root:
        b = r.mapping(root, "benchmark", "benchmark", PHASES + ("baselines", "bytes", "flops", "models"))
        builtin, named, contracts = _parse_baselines(r, b, contract_of)
        bench = Benchmark(
            **{p: r.int_list(b, p, f"benchmark.{p}", minimum=1) for p in PHASES},
            baselines=builtin, named=named, contracts=contracts,
            bytes=r.value(b, "bytes", "benchmark.bytes", (str,), "a byte-count expression"),
            flops=r.value(b, "flops", "benchmark.flops", (str,), "a flop-count expression"),
            models=_parse_models(r, b, sizes),
        )

    vllm = Vllm()
    if "vllm" in root:
        v = r.mapping(root, "vllm", "vllm", ("target", "route", "layer", "ir_op", "custom_op", "provider"))
        target = r.choice(v, "target", "vllm.target", ("v1",), "v1")
        provider = r.value(v, "provider", "vllm.provider", (str,), "a vLLM IR provider name")
        if provider is not None and (provider in ("native", "unfused")
                                     or not re.fullmatch(r"[a-z_][a-z_0-9]*", provider)):
            raise r.fail(v, "provider", "vllm.provider",
                         "a provider name of lowercase letters, digits and _ other than native and unfused", provider)
        vllm = Vllm(target=target, route=r.choice(v, "route", "vllm.route", VLLM_ROUTES, "ir"),
                    layer=_check_import(r, v, "layer", "vllm.layer", optional_module="vllm"),
                    ir_op=r.value(v, "ir_op", "vllm.ir_op", (str,), "a vLLM IR op name"),
                    custom_op=r.value(v, "custom_op", "vllm.custom_op", (str,), "a vLLM CustomOp name"),
                    provider=provider)

    capture_sizes = None
    if "cuda_graph" in root:
        cg = r.mapping(root, "cuda_graph", "cuda_graph", ("capture_sizes",))
        capture_sizes = r.int_list(cg, "capture_sizes", "cuda_graph.capture_sizes", minimum=1) or None


    plan = Plan(
        path=path, name=name, intent=intent,
        kernel=_check_kernel(r, op),
        reference=_check_import(r, op, "reference", "op.reference", optional_module="vllm"),
        fake=_check_import(r, op, "fake", "op.fake"),
        description=r.value(op, "description", "op.description", (str,), "text", ""),
        replaces=_check_import(r, op, "replaces", "op.replaces", optional_module="vllm"),
        args=args, outputs=outputs, mutates=mutates, sizes=sizes, size_specs=size_specs, matrix=matrix,
        excludes=_parse_rules(r, root, "exclude", matrix),
        expects=_parse_rules(r, root, "expect", matrix),
        tolerance=tolerance, output_tolerance=output_tolerance, numerics=Numerics(**numerics_kw), benchmark=bench,
        tp=_parse_tp(r, root, args, outputs, matrix["tp"], tuple(sizes)), quantization=_parse_quantization(r, root, args, outputs),
        generate=_check_import(r, op, "generate", "op.generate"), vllm=vllm, capture_sizes=capture_sizes,
        accumulation=r.choice(op, "accumulation", "op.accumulation", ("fp32", "input"), "fp32"),
        raw_text=text, contract=contract,
    )
    arg_names = [a.name for a in args]
    inputs = [a.name for a in args if a.role != "output"]
    if plan.vllm_kernel:
        _check_vllm_schema(r, root, op, plan)
    else:
        _check_signature(r, op, "kernel", "op.kernel", plan.kernel, arg_names)
    _check_signature(r, op, "reference", "op.reference", plan.reference, inputs)
    _check_signature(r, op, "fake", "op.fake", plan.fake, arg_names, positional=True)
    _check_models(r, root, plan)
    return dataclasses.replace(plan, warnings=_never_applies(r, root, plan))

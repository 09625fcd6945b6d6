"""The plan model: load `plan.yaml`, validate every field, and hand back frozen dataclasses.

Every error names the file, the line, the dotted field, what was expected and what was found,
so a user fixes a plan without reading a traceback.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

PHASES = ("prefill", "decode", "chunked_prefill")
DTYPES = ("fp32", "fp16", "bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "int8")
GRAPH_MODES = ("eager", "cuda_graph", "torch_compile")
INTENTS = ("drop-in", "fusion", "new-algorithm", "quantization")
AXES = ("phase", "dtype", "tp", "graph_mode", "sm")
PROFILES = ("dev", "ci", "nightly")  # numerics profiles (hypothesis profiles harness-<name>)
LAYOUTS = ("contiguous", "strided")
INITS = ("normal", "around_one", "uniform", "zeros")
ROLES = ("input", "output")
VLLM_ROUTES = ("ir", "custom_op")
BASELINES = ("native", "compiled", "vllm")
# NVIDIA compute capability (sm90) or an AMD CDNA target (gfx90a, gfx942, gfx950).
SM_PATTERN = re.compile(r"^(cpu|sm\d{2,3}|gfx9[0-9][0-9a-f])$")
SM_EXPECTED = "'cpu', 'smXY' (e.g. sm90) or an AMD target (gfx90a, gfx942, gfx950)"
# The token count is the one symbol every plan gets for free: the phase decides it.
BUILTIN_SYMBOLS = ("num_tokens",)
# Fixed-dtype arguments use torch's names; "act" follows the cell's dtype axis.
FIXED_DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint8")


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
    """One entry of a symbolic shape: `coeff * symbol` (symbol None means a constant)."""

    coeff: int
    symbol: str | None

    def size(self, sizes: dict[str, int]) -> int:
        return self.coeff * (sizes[self.symbol] if self.symbol else 1)

    def __str__(self) -> str:
        if self.symbol is None:
            return str(self.coeff)
        return self.symbol if self.coeff == 1 else f"{self.coeff}*{self.symbol}"


@dataclass(frozen=True)
class Arg:
    """One argument of the op's call, in call order."""

    name: str
    shape: tuple[Dim, ...] | None = None  # None: a scalar passed as is
    dtype: str = "act"
    layouts: tuple[str, ...] = ("contiguous",)
    init: str = "normal"
    role: str = "input"
    value: Any = None  # scalars only
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
    # Draw odd, non-power-of-two sizes besides the plan's own (off only for a kernel that is
    # exact for the listed sizes alone).
    awkward_sizes: bool = True


@dataclass(frozen=True)
class Benchmark:
    decode: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()
    chunked_prefill: tuple[int, ...] = ()
    baselines: tuple[str, ...] = ("native", "compiled")
    bytes: str | None = None  # optional byte model; default counts every tensor arg once
    flops: str | None = None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {p: getattr(self, p) for p in PHASES if getattr(self, p)}


@dataclass(frozen=True)
class TensorParallel:
    """How the op runs on N ranks. `trivial`: every rank gets the full inputs (replicated)."""

    kind: str = "trivial"
    # input name -> (dim, merged parts) for sharded inputs; absent inputs are replicated
    shard: tuple[tuple[str, int, int], ...] = ()
    # (output, "replicated" | "sum" | "gather", dim); outputs not listed are replicated
    combine: tuple[tuple[str, str, int], ...] = ()
    sequence_parallel: bool = False  # tensors with a num_tokens dim are split across ranks by tokens
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
    matrix: dict[str, tuple]
    excludes: tuple[Rule, ...]
    expects: tuple[Rule, ...]
    tolerance: dict[str, Tolerance]
    numerics: Numerics
    benchmark: Benchmark
    tp: TensorParallel
    quantization: Any
    vllm: Vllm
    capture_sizes: tuple[int, ...] | None
    accumulation: str
    raw_text: str = field(repr=False, default="")

    def load_kernel(self) -> Callable:
        return import_object(self.kernel)

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
        """The torch.library namespace of the op: the kernel's top-level package (e.g. `kernels`)."""
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
        return Dim(text, None)
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"\s*(?:(\d+)\s*\*\s*)?([A-Za-z_]\w*)\s*", text)
    return Dim(int(m.group(1) or 1), m.group(2)) if m else None


def _check_import(r: _Reader, node: _Map, key: str, name: str, optional_module: str | None = None):
    path = r.value(node, key, name, (str,), "an import path 'package.module:attribute'")
    if path is None:
        return None
    if not re.fullmatch(r"[\w.]+:[\w.]+", path):
        raise r.fail(node, key, name, "an import path 'package.module:attribute'", path)
    if optional_module and path.split(".")[0] == optional_module:
        return path  # checked where it is used: the package may not be installed here
    try:
        import_object(path)
    except Exception as exc:  # any import-time failure is a plan error here, not a crash
        raise r.fail(node, key, name, f"an importable object ({type(exc).__name__}: {exc})", path) from None
    return path


def _parse_args(r: _Reader, op: _Map, symbols: set[str]) -> tuple[Arg, ...]:
    args_node = r.free_mapping(op, "args", "op.args")
    if not args_node:
        raise r.fail(op, "args", "op.args", "at least one argument", args_node)
    args = []
    for name, spec in args_node.items():
        fname = f"op.args.{name}"
        line = args_node.key_lines.get(name, args_node.line)
        if not isinstance(spec, dict):  # a scalar passed as is (eps, a flag)
            if not isinstance(spec, (int, float, bool, str)):
                raise r.fail(args_node, name, fname, "a tensor spec mapping or a scalar", spec)
            args.append(Arg(name=name, value=spec, line=line))
            continue
        r.mapping(args_node, name, fname, ("shape", "dtype", "layout", "init", "role"), required=("shape",))
        shape_node = spec["shape"]
        if not isinstance(shape_node, list) or not shape_node:
            raise r.fail(spec, "shape", f"{fname}.shape", "a non-empty list of sizes or symbols", shape_node)
        dims = []
        for i, entry in enumerate(shape_node):
            dim = _parse_dim(entry)
            if dim is None:
                raise r.fail(shape_node, i, f"{fname}.shape[{i}]", "a positive integer, a symbol or 'N*symbol'", entry)
            if dim.symbol and dim.symbol not in symbols:
                raise r.fail(shape_node, i, f"{fname}.shape[{i}]",
                             f"a symbol defined in op.sizes or built in ({', '.join(sorted(symbols))})", dim.symbol)
            dims.append(dim)
        dtype = r.value(spec, "dtype", f"{fname}.dtype", (str,), "'act' or a torch dtype name", "act")
        if dtype != "act" and dtype not in FIXED_DTYPES:
            raise r.fail(spec, "dtype", f"{fname}.dtype", f"'act' or one of {', '.join(FIXED_DTYPES)}", dtype)
        args.append(Arg(
            name=name, shape=tuple(dims), dtype=dtype,
            layouts=r.str_list(spec, "layout", f"{fname}.layout", LAYOUTS, ("contiguous",)),
            init=r.choice(spec, "init", f"{fname}.init", INITS, "normal"),
            role=r.choice(spec, "role", f"{fname}.role", ROLES, "input"),
            line=line,
        ))
    return tuple(args)


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
              tp_sizes: tuple[int, ...] = (1,)) -> TensorParallel:
    if "tp" not in root:
        return TensorParallel()
    node = r.mapping(root, "tp", "tp", ("kind", "inputs", "outputs", "sequence_parallel"), required=("kind",))
    kind = r.choice(node, "kind", "tp.kind", ("trivial", "sharded"))
    sp = r.value(node, "sequence_parallel", "tp.sequence_parallel", (bool,), "true or false", False)
    tensor_names = {a.name: a for a in args if a.is_tensor}

    def has_tokens(name: str) -> bool:
        return name in tensor_names and any(d.symbol == "num_tokens" for d in tensor_names[name].shape)

    def check_dim(spec: _Map, key: str, f: str, name: str, merged: int) -> int:
        """A dimension of `name` that can be split into tp * merged equal parts for every TP size."""
        dim = r.value(spec, key, f"{f}.{key}", (int,), "a dimension (an integer)")
        if name not in tensor_names:
            return dim  # a returned output: its shape is the op's to decide
        shape = tensor_names[name].shape
        if not -len(shape) <= dim < len(shape):
            raise r.fail(spec, key, f"{f}.{key}", f"a dimension of a {len(shape)}-d tensor", dim)
        d = shape[dim]
        if d.symbol == "num_tokens":
            raise r.fail(spec, key, f"{f}.{key}", "a dimension other than num_tokens "
                         "(tokens are split with tp.sequence_parallel)", dim)
        bad = [n for n in tp_sizes if d.symbol is None and d.coeff % (n * merged)]
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
            r.mapping(inputs, name, f, ("shard", "merged"), required=("shard",))
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
            r.mapping(outs, name, f, ("gather", "merged"), required=("gather",))
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
    return TensorParallel(kind, tuple(shard), tuple(combine), sp, tuple(merged_outputs))


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
                                      "outputs", "mutates", "sizes", "accumulation", "fake"),
                   required=("name", "intent", "kernel", "reference", "args", "outputs"))
    name = r.value(op, "name", "op.name", (str,), "an identifier")
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise r.fail(op, "name", "op.name", "an identifier (letters, digits, _)", name)
    intent = r.choice(op, "intent", "op.intent", INTENTS)

    sizes_node = r.free_mapping(op, "sizes", "op.sizes") if "sizes" in op else _Map()
    sizes = {}
    for sym in sizes_node:
        if sym in BUILTIN_SYMBOLS:
            raise r.fail(sizes_node, sym, f"op.sizes.{sym}", "a symbol other than the built-in num_tokens", sym)
        sizes[sym] = r.int_list(sizes_node, sym, f"op.sizes.{sym}", minimum=1)
        if not sizes[sym]:
            raise r.fail(sizes_node, sym, f"op.sizes.{sym}", "at least one size", sizes_node[sym])
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

    tolerance = {}
    if "tolerance" in root:
        tol_node = r.mapping(root, "tolerance", "tolerance", DTYPES)
        for dt in tol_node:
            t = r.mapping(tol_node, dt, f"tolerance.{dt}", ("atol", "rtol"), required=("atol", "rtol"))
            tolerance[dt] = Tolerance(
                float(r.value(t, "atol", f"tolerance.{dt}.atol", (int, float), "a number >= 0")),
                float(r.value(t, "rtol", f"tolerance.{dt}.rtol", (int, float), "a number >= 0")))

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
        else:
            v = r.value(num_node, f.name, f"numerics.{f.name}", (int,), "a positive integer")
            if v < 1:
                raise r.fail(num_node, f.name, f"numerics.{f.name}", "a positive integer", v)
            numerics_kw[f.name] = v

    bench = Benchmark()
    if "benchmark" in root:
        b = r.mapping(root, "benchmark", "benchmark", PHASES + ("baselines", "bytes", "flops"))
        bench = Benchmark(
            **{p: r.int_list(b, p, f"benchmark.{p}", minimum=1) for p in PHASES},
            baselines=r.str_list(b, "baselines", "benchmark.baselines", BASELINES, ("native", "compiled")),
            bytes=r.value(b, "bytes", "benchmark.bytes", (str,), "a byte-count expression"),
            flops=r.value(b, "flops", "benchmark.flops", (str,), "a flop-count expression"),
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

    quant = root.get("quantization", "none")
    if quant != "none" and not isinstance(quant, dict):
        raise r.fail(root, "quantization", "quantization", "'none' or a mapping describing the scheme", quant)

    return Plan(
        path=path, name=name, intent=intent,
        kernel=_check_import(r, op, "kernel", "op.kernel"),
        reference=_check_import(r, op, "reference", "op.reference", optional_module="vllm"),
        fake=_check_import(r, op, "fake", "op.fake"),
        description=r.value(op, "description", "op.description", (str,), "text", ""),
        replaces=_check_import(r, op, "replaces", "op.replaces", optional_module="vllm"),
        args=args, outputs=outputs, mutates=mutates, sizes=sizes, matrix=matrix,
        excludes=_parse_rules(r, root, "exclude", matrix),
        expects=_parse_rules(r, root, "expect", matrix),
        tolerance=tolerance, numerics=Numerics(**numerics_kw), benchmark=bench,
        tp=_parse_tp(r, root, args, outputs, matrix["tp"]), quantization=quant, vllm=vllm, capture_sizes=capture_sizes,
        accumulation=r.choice(op, "accumulation", "op.accumulation", ("fp32", "input"), "fp32"),
        raw_text=text,
    )

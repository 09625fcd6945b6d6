"""vLLM's own compiled kernels (`torch.ops._C.*`) as data: which kernel implements an op, and how to call it.

One `VllmKernel` per kernel: its `torch.ops._C` name, its schema as vLLM 0.26.0 registers it
(csrc/torch_bindings.cpp; the light ops in csrc/libtorch_stable/torch_bindings.cpp, built as
`_C_stable_libtorch.abi3.so`), and `args`, the adapter from a plan's keyword arguments to vLLM's
positional ones: the plan argument passed for each schema parameter, as the bundled plan of that op
names it. Two uses, both calling vLLM's kernel with the plan's arguments picked by `args`:

- the `vllm` provider of a plan (`providers: [vllm]`), run through the plan's numerics cells, its `dtypes` its
  contract there;
- the `vllm` benchmark baseline of a plan, the same call timed (harness.runtime.providers.load_kernel).

Where a plan's kernel goes into vLLM (layer, CustomOp, IR op, quantization method) is the plan's own `vllm:`
section (harness.spec.vllm_ops); this table only says which compiled kernel does the op. Plain Python, at
the bottom of the layers so that the plan's schema knows the kernels' names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    """One parameter of a kernel's schema: `Tensor! result` is (result, Tensor, written)."""

    name: str
    type: str  # Tensor, float, int, bool
    written: bool = False  # Tensor!: the kernel writes it
    optional: bool = False  # Tensor?: may be None
    default: str | None = None

    def __str__(self) -> str:
        marks = ("!" if self.written else "") + ("?" if self.optional else "")
        return f"{self.type}{marks} {self.name}" + (f"={self.default}" if self.default is not None else "")


_PARAM = re.compile(r"^(?P<type>\w+)(?P<marks>[!?]*)\s+(?P<name>\w+)(?:\s*=\s*(?P<default>\S+))?$")


def parse_schema(schema: str) -> tuple[str, tuple[Param, ...]]:
    """(name, parameters) of a schema `name(Tensor! out, Tensor input, float eps) -> ()`."""
    m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*->\s*\(\)\s*", schema)
    if not m:
        raise ValueError(f"not a schema of a kernel returning (): {schema!r}")
    params = []
    for text in (t.strip() for t in m.group(2).split(",") if t.strip()):
        p = _PARAM.match(" ".join(text.split()))
        if not p:
            raise ValueError(f"cannot read the parameter {text!r} of {schema!r}")
        params.append(Param(p["name"], p["type"], "!" in p["marks"], "?" in p["marks"], p["default"]))
    return m.group(1), tuple(params)


@dataclass(frozen=True)
class VllmKernel:
    """One of vLLM's compiled kernels: what it is called, its schema, and the plan arguments it takes."""

    name: str  # the op it implements, as its bundled plan names it (op.name)
    in_tree: str  # torch.ops._C.<in_tree>
    schema: str  # as vLLM 0.26.0 registers it
    args: tuple[str, ...]  # the plan argument passed for each schema parameter, in the schema's order
    dtypes: tuple[str, ...] = ()  # the cell dtypes it takes, where not all (its contract as a provider)
    why: str = ""  # why, in words
    # As a provider: the fraction of a quantized output's elements allowed one fp8 step from the reference's, where
    # vLLM's kernel rounds in another order than the op's native path (None: the plan's quantization.max_step_fraction)
    max_step_fraction: float | None = None

    @property
    def params(self) -> tuple[Param, ...]:
        return parse_schema(self.schema)[1]

    @property
    def call(self) -> str:
        return f"torch.ops._C.{self.in_tree}"


# vLLM's static-fp8 norm kernels and their native path (normalise, round, times the weight, round, quantize) round
# the normalised value differently: at bf16 (8 significant bits against e4m3's 4) 1.2-2.0% of elements land one fp8
# step apart on an H200, in every benchmark shape (fp16 and fp32 under 1%). vLLM's own tests of these kernels accept
# one step anywhere (rtol 0.2); a wrong scale or a truncating cast moves far more than 5%.
STATIC_FP8_NORM_STEPS = 0.05

VLLM_KERNELS = {k.in_tree: k for k in (
    VllmKernel("rms_norm", "rms_norm", "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()",
               ("out", "x", "weight", "eps")),
    VllmKernel("fused_add_rms_norm", "fused_add_rms_norm",
               "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()",
               ("x", "residual", "weight", "eps")),
    VllmKernel("silu_and_mul", "silu_and_mul", "silu_and_mul(Tensor! result, Tensor input) -> ()", ("out", "x")),
    VllmKernel("rotary_embedding", "rotary_embedding",
               "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
               "bool is_neox) -> ()",
               ("positions", "query", "key", "head_size", "cos_sin_cache", "is_neox")),
    VllmKernel("rms_norm_static_fp8_quant", "rms_norm_static_fp8_quant",
               "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon) "
               "-> ()",
               ("out", "x", "weight", "scale", "eps"),
               max_step_fraction=STATIC_FP8_NORM_STEPS),
    VllmKernel("fused_add_rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant",
               "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor! residual, Tensor weight, "
               "Tensor scale, float epsilon) -> ()",
               ("out", "x", "residual", "weight", "scale", "eps"),
               max_step_fraction=STATIC_FP8_NORM_STEPS),
    VllmKernel("silu_and_mul_quant", "silu_and_mul_quant",
               "silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()", ("out", "x", "scale"),
               ("fp16", "bf16"), "vLLM's kernel takes fp16 and bf16 inputs only"),
    VllmKernel("dynamic_per_token_fp8_quant", "dynamic_per_token_scaled_fp8_quant",
               "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub) "
               "-> ()",
               ("out", "x", "scales", "scale_ub")),
)}


def _expected(p: Param) -> str:
    if p.type == "Tensor":
        what = ("a tensor the op writes (role: output, or listed in op.mutates)" if p.written
                else "a tensor the op only reads (not role: output, not in op.mutates)")
        return what + (", or null" if p.optional else "")
    return {"float": "a number", "int": "an integer or {value: <size expression>}",
            "bool": "true or false"}.get(p.type, f"a {p.type}")


def _found(arg, written: set[str]) -> str | None:
    """How the plan's argument reads against a parameter's kind ("tensor", "written tensor", ...), for matching."""
    if arg.is_tensor:
        return "written tensor" if arg.name in written else "tensor"
    if arg.value_expr:
        return "int"
    if arg.value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float"}.get(type(arg.value), type(arg.value).__name__)


def _fits(p: Param, found: str) -> bool:
    if p.type == "Tensor":
        return found == ("written tensor" if p.written else "tensor") or (p.optional and found == "null")
    if p.type == "float":
        return found in ("float", "int")
    return found == p.type


def mismatches(kernel: VllmKernel, args, written) -> list[tuple[int | None, str, str]]:
    """Where plan arguments (objects with name, is_tensor, value, value_expr), passed in this order, do not fit the
    kernel's schema: (index of the argument, or None for their number; what the schema expects; what they are).
    `written`: the names of the arguments the plan says the op writes."""
    params, written = kernel.params, set(written)
    required = sum(1 for p in params if p.default is None)
    if not required <= len(args) <= len(params):
        return [(None, f"the {len(params)} arguments of vLLM's {kernel.in_tree}, in its order "
                       f"({', '.join(str(p) for p in params)})",
                 f"{len(args)} arguments ({', '.join(a.name for a in args)})")]
    out = []
    for i, (p, arg) in enumerate(zip(params, args)):
        found = _found(arg, written)
        if not _fits(p, found):
            out.append((i, f"{_expected(p)}, for vLLM's `{p}` ({kernel.in_tree} parameter {i + 1})", found))
    return out

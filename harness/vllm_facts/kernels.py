"""vLLM's own compiled kernels (`torch.ops._C.*`): their schemas as vLLM 0.26.0 registers them, and whether a plan's
arguments fit one.

Which of vLLM's kernels does an op, and which plan argument goes to each of its parameters, is the plan's own
`implementations.vllm`: it serves as the plan's `vllm` provider, run through its numerics
cells, and its `vllm` benchmark baseline, the same call timed (harness.runtime.providers). Here is vLLM's side only:
the schemas of the vLLM release the bundled plans were written against (csrc/torch_bindings.cpp; the light ops in
csrc/libtorch_stable/torch_bindings.cpp, built as `_C_stable_libtorch.abi3.so`), so that a plan's arguments are
checked when it is loaded; a kernel this table lacks takes the plan's `signature`, else the installed vLLM's
registered schema at run time (harness.runtime.vllm_compiled, which also checks this table against the schema the
installed vLLM registers). Plain Python, below the plan's layer: the plan's checks read it.
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


# The vLLM release whose schemas are pinned below; a new release with other schemas is a second table beside it.
PINNED_VLLM = "0.26.0"
SCHEMAS = {name: f"{name}({params}) -> ()" for name, params in (
    ("rms_norm", "Tensor! result, Tensor input, Tensor weight, float epsilon"),
    ("fused_add_rms_norm", "Tensor! input, Tensor! residual, Tensor weight, float epsilon"),
    ("silu_and_mul", "Tensor! result, Tensor input"),
    ("rotary_embedding", "Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
                         "bool is_neox"),
    ("rms_norm_static_fp8_quant", "Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon"),
    ("fused_add_rms_norm_static_fp8_quant", "Tensor! result, Tensor input, Tensor! residual, Tensor weight, "
                                            "Tensor scale, float epsilon"),
    ("silu_and_mul_quant", "Tensor! result, Tensor input, Tensor scale"),
    ("dynamic_per_token_scaled_fp8_quant", "Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub"),
)}


def kernel_schema(kernel) -> str:
    """The schema of a plan's torch.ops kernel (`implementations.vllm`): its own `signature`, else vLLM 0.26.0's,
    else "" (read at run time)."""
    return kernel.signature or SCHEMAS.get(kernel.name, "")


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
        return arg.value_kind
    if arg.value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float"}.get(type(arg.value), type(arg.value).__name__)


def _fits(p: Param, found: str) -> bool:
    if p.type == "Tensor":
        return found == ("written tensor" if p.written else "tensor") or (p.optional and found == "null")
    if p.type == "float":
        return found in ("float", "int")
    return found == p.type


def mismatches(name: str, params: tuple[Param, ...], args, written) -> list[tuple[int | None, str, str]]:
    """Where plan arguments (objects with name, is_tensor, value, value_expr), passed in this order, do not fit the
    `params` of vLLM's kernel `name`: (index of the argument, or None for their number; what the schema
    expects; what they are). `written`: the names of the arguments the plan says the op writes."""
    written = set(written)
    required = sum(1 for p in params if p.default is None)
    if not required <= len(args) <= len(params):
        return [(None, f"the {len(params)} arguments of vLLM's {name}, in its order "
                       f"({', '.join(str(p) for p in params)})",
                 f"{len(args)} arguments ({', '.join(a.name for a in args)})")]
    out = []
    for i, (p, arg) in enumerate(zip(params, args)):
        found = _found(arg, written)
        if not _fits(p, found):
            out.append((i, f"{_expected(p)}, for vLLM's `{p}` ({name} parameter {i + 1})", found))
    return out


def args_problem(kernel, params: tuple[Param, ...], args, written) -> str:
    """Why the plan's arguments `kernel.args` picks cannot be passed to vLLM's kernel of these `params` ("" when
    they can), in words."""
    bad = mismatches(kernel.name, params, args, written)
    if not bad:
        return ""
    index, expected, found = bad[0]
    where = "its arguments" if index is None else f"'{kernel.args[index]}'"
    return f"the plan's {where} cannot be {kernel.call}'s: expected {expected}; found {found}"

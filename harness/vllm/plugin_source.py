"""The plan's vLLM general plugin, as Python source: one template per route, filled in from the plan alone.

A plugin has two halves. The op-specific half is the op's own: its adapter module (the plan's `vllm.adapter`, by
default the kernel's module) maps vLLM's calls onto the kernel's arguments (`vllm_forward_inputs` for a layer's
forward, `vllm_ir_inputs` for a vLLM IR op). The generic half is written here from the plan: the kernel as an
opaque torch.library op, `supports` (the plan's tensor ranks and dtypes, unit column stride, then op.contract: a
call outside them falls back to vLLM's own path) and `run_kernel`, which calls the kernel as the plan says it is
called (output buffers allocated here and written, or outputs returned) and gives back the outputs in op.outputs
order. The route's template (plugin_templates/<route>.py.tmpl) joins the two: `$docstring`, `$imports`,
`$generic` (the generic half), `$layer_module`, `$layer_class`, `$ir_op`, `$inplace`, `$provider`, `$route`.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from string import Template

from harness.vllm.op_source import custom_op_source, py_tuple
from harness.plan.dtypes import DTYPE
from harness.plan.model import Plan
from harness.vllm_facts.attention_layout import ROUTE as ATTENTION_ROUTE, attention_source, cache_words
from harness.vllm_facts.names import adapter_module, enable_setting, layer_class, plugin_entry_point, plugin_route, \
    plugin_routes, provider_name, unsupported

TEMPLATES = Path(__file__).parent / "plugin_templates"
DOCSTRING = Template('''"""vLLM general plugin: $layer_class runs $kernel as $op.

Generated from $plan_file by the vllm-op-plan harness. vLLM loads it in every process
through this entry point (pyproject.toml of the package that ships it):

    $entry_point

Loading registers the kernel; a deployment selects it with
    $enable_setting
The op's vLLM side, how vLLM's calls map onto the kernel's arguments:
    $adapter
"""''')
# Cell dtypes as a plugin names them.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8_e4m3fn": "float8_e4m3fn",
                "fp8_e4m3fnuz": "float8_e4m3fnuz", "int8": "int8"}


def plugin_template(route: str) -> Path:
    """The template of a route's plugin."""
    return TEMPLATES / f"{route}.py.tmpl"


def _inputs(plan: Plan):
    """The kernel's inputs, in call order: what `supports` and `run_kernel` take (output buffers are the plugin's)."""
    return [a for a in plan.args if a.role != "output"]


def _size_of(plan: Plan, symbol: str) -> str | None:
    """`symbol` as an expression over the kernel's inputs: a dim of an input tensor, or a scalar input computed from
    it (`head_size: {value: head_size}`); None where no input has it."""
    for a in _inputs(plan):
        if a.is_tensor:
            for i, d in enumerate(a.shape):
                if d.symbol == symbol and d.coeff:
                    dim = f"{a.name}.shape[{i - len(a.shape)}]"
                    return dim if d.coeff == 1 else f"({dim} // {d.coeff})"
        elif a.value_expr == symbol:
            return a.name
    return None


def _dtype_expr(plan: Plan, dtype: str) -> str:
    """A tensor dtype of the plan as the plugin computes it: `act` is the first activation input's dtype."""
    if dtype == "act":
        act = next(a.name for a in _inputs(plan) if a.is_tensor and a.dtype == "act")
        return f"{act}.dtype"
    if dtype == "fp8":
        return "current_platform.fp8_dtype()"  # float8_e4m3fn, or the fnuz variant on ROCm's CDNA GPUs
    return f"torch.{DTYPE[dtype].torch}"


def _supports(plan: Plan) -> list[str]:
    """`supports(<inputs>)`: whether the kernel takes the call, as the plan draws its calls."""
    inputs = _inputs(plan)
    first_act = next((a.name for a in inputs if a.is_tensor and a.dtype == "act"), None)
    checks = []
    for a in inputs:
        if not a.is_tensor:
            continue
        mine = [f"{a.name}.dim() == {len(a.shape)}"] + ([f"{a.name}.stride(-1) == 1"] if a.shape else [])
        mine += [f"{a.name}.shape[{i - len(a.shape)}] % {d.coeff} == 0" for i, d in enumerate(a.shape)
                 if d.symbol and d.coeff and d.coeff > 1]  # a dim of whole units (2*intermediate: gate and up)
        if a.dtype == "act" and a.name != first_act:
            mine.append(f"{a.name}.dtype == {first_act}.dtype")
        elif a.dtype not in ("act", "fp8"):
            mine.append(f"{a.name}.dtype == torch.{DTYPE[a.dtype].torch}")
        checks.append(" and ".join(mine) if not a.optional else f"({a.name} is None or {' and '.join(mine)})")
    notes = []
    contract = plan.contract
    if not contract.empty:
        tensors = {a.name: a for a in plan.tensor_args}
        passed = {a.name for a in inputs if a.is_tensor}
        for name in contract.contiguous:
            if name in passed:
                checks.append(f"{name}.is_contiguous()")
            else:
                notes.append(f"{name}: allocated contiguous by run_kernel")
        for name, n in contract.row_stride_multiple_of:
            width = tensors[name].shape[-1]
            if name in passed:
                checks.append(f"{name}.stride(-2) % {n} == 0")
            elif width.symbol and _size_of(plan, width.symbol):  # allocated contiguous: rows are its width apart
                factor = "" if width.coeff == 1 else f" * {width.coeff}"
                checks.append(f"{_size_of(plan, width.symbol)}{factor} % {n} == 0")
            else:
                notes.append(f"{name}'s row stride: not checked here (no input has its width)")
        for key, check in (("multiple_of", "{} % {} == 0"), ("at_least", "{} >= {}"), ("at_most", "{} <= {}")):
            for sym, n in getattr(contract, key):
                size = _size_of(plan, sym)
                if size:
                    checks.append(check.format(size, n))
                else:
                    notes.append(f"{sym} {key.replace('_', ' ')} {n}: not checked here (no input has it)")
        if contract.dtypes:
            names = [f"torch.{TORCH_DTYPES[d]}" for d in contract.dtypes]
            if first_act:
                checks.append(f"{first_act}.dtype in ({', '.join(names)}{',' if len(names) == 1 else ''})")
            else:
                notes.append(f"dtypes {', '.join(contract.dtypes)}: not checked here (no activation input)")
        why = f": {' '.join(contract.why.split())}" if contract.why else ""
        notes.insert(0, f"op.contract ({plan.path.name} line {plan.where('op.contract')}){why}")
    params = ", ".join(a.name for a in inputs)
    body = "return (" + "\n            and ".join(checks) + ")" if checks else "return True"
    return [f"def supports({params}) -> bool:",
            '    """Whether the kernel takes this call: the plan\'s tensor ranks and dtypes with unit column stride, '
            'then\n    its op.contract. vLLM runs its own path on any other call."""',
            *(f"    # {note}" for note in notes), f"    {body}"]


def _run_kernel(plan: Plan) -> list[str]:
    """`run_kernel(<inputs>)`: the kernel called as the plan calls it, outputs in op.outputs order."""
    inputs = _inputs(plan)
    lines = [f"def run_kernel({', '.join(a.name for a in inputs)}):",
             '    """The kernel called as the plan says: output buffers allocated here and written by it, outputs it '
             'returns\n    taken as returned; gives back ' + ", ".join(plan.op.outputs) + ' (op.outputs)."""']
    device = next(a.name for a in inputs if a.is_tensor)
    for a in plan.args:
        if a.role != "output":
            continue
        dims = []
        for d in a.shape:
            text = d.text
            for sym in sorted(d.names, key=len, reverse=True):
                size = _size_of(plan, sym)
                if size is None:
                    why = f"no input of the kernel gives {sym}, the size of {a.name}"
                    return lines + [f"    raise NotImplementedError({why!r})"]
                text = re.sub(rf"\b{sym}\b", size, text)
            dims.append(text)
        lines.append(f"    {a.name} = torch.empty({py_tuple(dims)}, dtype={_dtype_expr(plan, a.dtype)}, "
                     f"device={device}.device)")
    call = f"kernel_op({', '.join(a.name for a in plan.args)})"
    returned = plan.returned_outputs
    if returned:
        lines.append(f"    {', '.join(returned)} = {call}")  # one tensor, or a tuple in op.outputs order
    else:
        lines.append(f"    {call}")
    lines.append(f"    return {', '.join(plan.op.outputs)}")
    return lines


def generic_source(plan: Plan) -> str:
    """The plugin's generic half: the kernel as a torch.library op (`kernel_op`), `supports`, `run_kernel`."""
    return "\n".join([*custom_op_source(plan, op_fn="kernel_op", kernel_fn="kernel", imports=False), "", "",
                      *_supports(plan), "", "", *_run_kernel(plan)])


def render_plugin(plan: Plan) -> str:
    """The plan's vLLM general plugin: its route's template, filled in from the plan."""
    why = unsupported(plan)
    if why:
        raise ValueError(f"{plan.path}: no vLLM plugin for this plan: {why}")
    route = plugin_route(plan)
    module, _, attr = plan.op.kernel.partition(":")
    layer_module = plan.vllm.layer.partition(":")[0]
    attention = route == ATTENTION_ROUTE  # no adapter: vLLM's tensors map onto the kernel's by the plan's shapes
    docstring = DOCSTRING.substitute(
        layer_class=layer_class(plan), kernel=plan.op.kernel, op=plan.op_qualname, plan_file=plan.path.name,
        entry_point=plugin_entry_point(plan).strip().replace("\n", "\n    "), enable_setting=enable_setting(plan),
        adapter=textwrap.fill(cache_words(plan), 110, subsequent_indent="    ") if attention else
        f"{adapter_module(plan)} ({', '.join(ADAPTER_FUNCTIONS[r] for r in plugin_routes(plan))})")
    imports = [] if attention else [f"import {adapter_module(plan)} as adapter  # the op's vLLM side"]
    imports.insert(0, f"from {module} import {attr} as kernel" if "." not in attr else
                   f"import {module}  # noqa: E402\nkernel = {module}.{attr}")
    if any(a.role == "output" and a.dtype == "fp8" for a in plan.args):
        imports.insert(0, "from vllm.platforms import current_platform")
    float_dtypes = [f"torch.{TORCH_DTYPES[d]}" for d in plan.matrix["dtype"] if DTYPE[d].kind == "float"]
    capabilities = [int(sm[2:]) for sm in plan.matrix["sm"] if re.fullmatch(r"sm\d+", sm)]
    generic = generic_source(plan) + ("\n\n\n" + "\n".join(attention_source(plan)) if attention else "")
    return Template(plugin_template(route).read_text()).substitute(
        docstring=docstring, imports="\n".join(imports), generic=generic, op=plan.op_qualname,
        layer_module=layer_module, layer_class=layer_class(plan), ir_op=plan.vllm.ir_op or "",
        inplace=bool(plan.op.mutates), provider=provider_name(plan), route=route, act_dtypes=", ".join(float_dtypes),
        min_capability=min(capabilities, default=0))


# What an op's adapter module defines for each route, as the plugin's docstring names it (docs/adding-an-op.md).
ADAPTER_FUNCTIONS = {"custom_op": "vllm_forward_inputs", "ir": "vllm_ir_inputs",
                     "quantization": "vllm_create_weights, vllm_apply_inputs",
                     ATTENTION_ROUTE: "nothing: the plugin maps vLLM's tensors onto the kernel's by the plan's shapes"}

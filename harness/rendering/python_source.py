"""Python source generated from a plan: the kernel as an opaque torch.library custom op (shown in Key interfaces),
and the plan's vLLM general plugin (shown there too, and loaded through vLLM's plugin loader by the integration
items, harness.integration.routes).

The plugin is its vLLM op's template, plugin_templates/<op>.py.tmpl (a string.Template), filled in:
`$docstring` (what the plugin is and how a deployment loads and selects it), `$kernel` (the import of the plan's
kernel as `kernel`), `$op`, `$provider` and `$route` (its torch.library name, IR provider name and route), and
`$contract`, the statement ending supports_args, after the template's own checks: the plan's op.contract as checks
on what vLLM passes, so that vLLM falls back on a call outside it. Adding a vLLM op means one description in
harness.spec.vllm_ops and one template here."""

from __future__ import annotations

from pathlib import Path
from string import Template

from harness.rendering.markdown import py_str, py_tuple
from harness.spec.plan import Plan
from harness.spec.vllm_ops import VllmOp, enable_setting, plugin_entry_point, plugin_route, provider_name, \
    unsupported, vllm_op

TEMPLATES = Path(__file__).parent / "plugin_templates"
DOCSTRING = Template('''"""vLLM general plugin: $layer_class runs $kernel as $op.

Generated from $plan_file by the vllm-op-plan harness. vLLM loads it in every process
through this entry point (pyproject.toml of the package that ships it):

    $entry_point

Loading registers the kernel; a deployment selects it with
    $enable_setting
$route_note"""''')
# Cell dtypes as a plugin names them.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8_e4m3fn": "float8_e4m3fn",
                "fp8_e4m3fnuz": "float8_e4m3fnuz", "int8": "int8"}


# ---------------------------------------------------------------- the custom op


def _tensor_type(plan: Plan, name: str) -> str:
    a = plan.arg(name)
    if (a.is_tensor and a.optional) or (not a.is_tensor and a.value is None):  # schema: Tensor?
        return "torch.Tensor | None"
    return "torch.Tensor" if a.is_tensor else type(a.value).__name__


def custom_op_source(plan: Plan) -> list[str]:
    """The kernel registered as `torch.ops.<namespace>.<name>` with its schema and a fake, as lines of Python."""
    ns, name = plan.op_namespace, plan.name
    module, _, attr = plan.kernel.partition(":")
    kernel_fn = f"{name}_kernel"
    params = ", ".join(f"{a.name}: {_tensor_type(plan, a.name)}" for a in plan.args)
    names = [a.name for a in plan.args]
    call = ", ".join(f"{n}={n}" for n in names)
    returns = plan.returned_outputs
    ret_type = "None" if not returns else "torch.Tensor" if len(returns) == 1 else \
        f"tuple[{', '.join(['torch.Tensor'] * len(returns))}]"
    imp = f"from {module} import {attr} as {kernel_fn}" if "." not in attr else \
        f"import {module}\n{kernel_fn} = {module}.{attr}"
    if plan.vllm_kernel:  # vLLM's compiled kernel (harness.runtime.vllm_kernels loads it), called with the plan's order
        plain = ", ".join(a.name for a in plan.args)
        imp = f"def {kernel_fn}({plain}):  # vLLM's own kernel\n    torch.ops._C.{plan.vllm_kernel}({plain})"
    lines = [
        "import torch", "", imp, "", "",
        "@torch.library.custom_op(",
        f"    {py_str(f'{ns}::{name}')},",
        f"    mutates_args={py_tuple(py_str(n) for n in plan.written_args)},",
        f"    schema={py_str(plan.schema())},",
        ")",
        f"def {name}({params}) -> {ret_type}:",
        f"    {'return ' if returns else ''}{kernel_fn}({call})",
        "", "",
    ]
    if plan.fake:
        fmod, _, fattr = plan.fake.partition(":")
        lines += [f"from {fmod} import {fattr.split('.')[0]}", f"{name}.register_fake({fattr})"]
    elif not returns:
        lines += [f"@{name}.register_fake", f"def _({', '.join(names)}) -> None:",
                  "    return None  # writes its arguments only: nothing to allocate"]
    else:
        rmod, _, rattr = plan.reference.partition(":")
        ref_inputs = ", ".join(f"{a.name}={a.name}" for a in plan.args if a.role != "output")
        idx = [plan.outputs.index(r) for r in returns]
        outs = ", ".join(f"torch.empty_like(ref[{i}])" for i in idx)
        lines += [f"from {rmod} import {rattr.split('.')[0]}", "", "",
                  f"@{name}.register_fake", f"def _({', '.join(names)}):",
                  f"    ref = {rattr}({ref_inputs})  # on fake tensors: shapes and dtypes only",
                  "    ref = ref if isinstance(ref, tuple) else (ref,)",
                  f"    return {outs}"]
    return lines


# ---------------------------------------------------------------- the vLLM plugin


def plugin_template(op: VllmOp) -> Path:
    """The template of a vLLM op's plugin."""
    return TEMPLATES / f"{op.name}.py.tmpl"


def contract_checks(plan: Plan, op: VllmOp) -> str:
    """The statement that ends the plugin's supports_args: `return True`, or the kernel's contract (op.contract)
    as checks on what vLLM passes, so that vLLM falls back on a call outside it. The template's own checks come
    first, so these may assume what those establish (2-D rows, a weight)."""
    contract = plan.contract
    if contract.empty:
        return "return True"
    tensors = {a.name: a for a in plan.tensor_args}
    passed = {a.name: p for a, p in zip(plan.args, op.supports_params) if p and a.is_tensor}

    def size_of(sym: str) -> str | None:
        """`sym` read off the shape of a tensor vLLM passes (None: none has it)."""
        for name, param in passed.items():
            shape = tensors[name].shape
            for i, d in enumerate(shape):
                if d.symbol == sym:
                    dim = f"{param}.shape[{i - len(shape)}]"
                    return dim if d.coeff == 1 else f"({dim} // {d.coeff})"
        return None

    checks, notes = [], []
    for name in contract.contiguous:
        if name in passed:
            checks.append(f"{passed[name]}.is_contiguous()")
        else:
            notes.append(f"{name}: allocated contiguous by this plugin")
    for name, n in contract.row_stride_multiple_of:
        width = tensors[name].shape[-1]
        if name in passed:
            checks.append(f"{passed[name]}.stride(-2) % {n} == 0")
        elif width.symbol and size_of(width.symbol):  # allocated contiguous by the plugin: rows are its width apart
            factor = "" if width.coeff == 1 else f" * {width.coeff}"
            checks.append(f"{size_of(width.symbol)}{factor} % {n} == 0")
        elif width.symbol or width.coeff is None:
            notes.append(f"{name}'s row stride: not checked here (no tensor vLLM passes has its width)")
    for key, check in (("multiple_of", "{} % {} == 0"), ("at_least", "{} >= {}"), ("at_most", "{} <= {}")):
        for sym, n in getattr(contract, key):
            size = size_of(sym)
            if size:
                checks.append(check.format(size, n))
            else:
                notes.append(f"{sym} {key.replace('_', ' ')} {n}: not checked here (no tensor vLLM passes has it)")
    if contract.dtypes:
        act = next((p for name, p in passed.items() if tensors[name].dtype == "act"), None)
        names = [f"torch.{TORCH_DTYPES[d]}" for d in contract.dtypes]
        if act:
            checks.append(f"{act}.dtype in ({', '.join(names)}{',' if len(names) == 1 else ''})")
        else:
            notes.append(f"dtypes {', '.join(contract.dtypes)}: not checked here (no activation vLLM passes)")
    why = f": {' '.join(contract.why.split())}" if contract.why else ""
    lines = [f"# op.contract ({plan.path.name} line {contract.line}){why}", *(f"# {note}" for note in notes)]
    lines.append("return (" + "\n        and ".join(checks) + ")" if checks else "return True")
    return "\n".join(lines)


def render_plugin(plan: Plan) -> str:
    """The plan's vLLM general plugin: its op's template with the kernel, op name, provider, route and contract
    filled in."""
    why = unsupported(plan)
    if why:
        raise ValueError(f"{plan.path}: no vLLM plugin for this plan: {why}")
    op = vllm_op(plan)
    module, _, attr = plan.kernel.partition(":")
    route = plugin_route(plan)
    note = "" if route == plan.vllm.route else \
        f"\n(vllm.route is {plan.vllm.route}, but vLLM has no IR op for {plan.name}: the CustomOp route is used.)\n"
    docstring = DOCSTRING.substitute(
        layer_class=op.layer_class, kernel=plan.kernel, op=plan.op_qualname, plan_file=plan.path.name,
        entry_point=plugin_entry_point(plan).strip().replace("\n", "\n    "), enable_setting=enable_setting(plan),
        route_note=note)
    return Template(plugin_template(op).read_text()).substitute(
        docstring=docstring,
        kernel=(f"from {module} import {attr} as kernel" if "." not in attr
                else f"import {module}  # noqa: E402\nkernel = {module}.{attr}"),
        op=plan.op_qualname,
        provider=provider_name(plan),
        route=route,
        contract=contract_checks(plan, op).replace("\n", "\n    "),  # at the indentation of supports_args's body
    )

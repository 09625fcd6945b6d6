"""Python source generated from a plan: the kernel as an opaque torch.library custom op (shown in Key interfaces, and
the first part of the plan's vLLM plugin, harness.vllm.plugin_source), with the Python literals it writes (`py_str`,
`py_tuple`). Plain Python: text from the plan, the kernel's code never imported."""

from __future__ import annotations

import json

from harness.plan.model import Plan


def py_str(value: str) -> str:
    return json.dumps(value)  # a Python string literal (JSON's escapes are valid Python)


def py_tuple(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


# ---------------------------------------------------------------- the custom op


def _tensor_type(plan: Plan, name: str) -> str:
    a = plan.arg(name)
    if (a.is_tensor and a.optional) or (not a.is_tensor and a.value is None):  # schema: Tensor?
        return "torch.Tensor | None"
    return "torch.Tensor" if a.is_tensor else type(a.value).__name__


def custom_op_source(plan: Plan, op_fn: str | None = None, kernel_fn: str | None = None,
                     imports: bool = True) -> list[str]:
    """The kernel registered as `torch.ops.<namespace>.<name>` with its schema and a fake, as lines of Python: a
    function `op_fn` (default: the op's name) calling `kernel_fn` (default: `<name>_kernel`, imported first unless
    `imports` is off) by the plan's argument names, returning what the kernel returns."""
    ns, name = plan.op_namespace, plan.op.name
    module, _, attr = plan.op.kernel.partition(":")
    kernel_fn = kernel_fn or f"{name}_kernel"
    op_fn = op_fn or name
    params = ", ".join(f"{a.name}: {_tensor_type(plan, a.name)}" for a in plan.args)
    names = [a.name for a in plan.args]
    call = ", ".join(f"{n}={n}" for n in names)
    returns = plan.returned_outputs
    ret_type = "None" if not returns else "torch.Tensor" if len(returns) == 1 else \
        f"tuple[{', '.join(['torch.Tensor'] * len(returns))}]"
    imp = f"from {module} import {attr} as {kernel_fn}" if "." not in attr else \
        f"import {module}\n{kernel_fn} = {module}.{attr}"
    lines = ["import torch", "", imp, "", ""] if imports else []
    lines += [
        "@torch.library.custom_op(",
        f"    {py_str(f'{ns}::{name}')},",
        f"    mutates_args={py_tuple(py_str(n) for n in plan.written_args)},",
        f"    schema={py_str(plan.schema())},",
        ")",
        f"def {op_fn}({params}) -> {ret_type}:",
        f"    {'return ' if returns else ''}{kernel_fn}({call})",
        "", "",
    ]
    if plan.op.fake:
        fmod, _, fattr = plan.op.fake.partition(":")
        lines += [f"from {fmod} import {fattr.split('.')[0]}", f"{op_fn}.register_fake({fattr})"]
    elif not returns:
        lines += [f"@{op_fn}.register_fake", f"def _({', '.join(names)}) -> None:",
                  "    return None  # writes its arguments only: nothing to allocate"]
    else:
        rmod, _, rattr = plan.op.reference.partition(":")
        given = [f"{a.name}={a.name}" for a in plan.args if a.role != "output" and not a.is_null]
        nulls = [a.name for a in plan.args if a.is_null]
        if nulls:  # `name: null` reaches the reference only where its signature names it, as the harness calls it
            pairs = ", ".join(f"({py_str(n)}, {n})" for n in nulls)
            given.append(f"**{{n: v for n, v in ({pairs},) if n in inspect.signature({rattr}).parameters}}")
        ref_inputs = ", ".join(given)
        idx = [plan.op.outputs.index(r) for r in returns]
        outs = ", ".join(f"torch.empty_like(ref[{i}])" for i in idx)
        lines += [*(["import inspect"] if nulls else []), f"from {rmod} import {rattr.split('.')[0]}", "", "",
                  f"@{op_fn}.register_fake", f"def _({', '.join(names)}):",
                  f"    ref = {rattr}({ref_inputs})  # on fake tensors: shapes and dtypes only",
                  "    ref = ref if isinstance(ref, tuple) else (ref,)",
                  f"    return {outs}"]
    return lines

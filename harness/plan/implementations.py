"""The op's implementations beside the kernel under test: one map, `implementations:`, modelled on vLLM IR's
`IrOp.impls` (native is one entry of it, not a special case), the kinds an entry may be, and the keys plans wrote
before it (`benchmark.baselines`, `vllm.kernel`, `providers`), read into it with a warning that shows the new form.

An entry is named; three names are built in and name their kind (native, compiled, vllm: at most one of each, so a
record's `native` is always the op's native code); any other name is the plan's own implementation, of kind
`import` (a Python function called like the kernel) or `torch_ops` (a library's registered torch.ops kernel, called
with the plan arguments its `args` picks). Its roles: `baseline` (timed beside the kernel; the decision weighs it),
`audited` (run through the numerics cells beside the kernel: what it accepts, which a replacement must accept too),
`default` (one of the plan's own at most: what vLLM runs in the kernel's place in every profile, as vLLM's own
attention backend does for an attention kernel; the decisions weigh the kernel against it instead of native and
compiled). Its `title` is how a page and a decision name it (vLLM's TRITON_ATTN), words only.

What each kind is called and how a decision names it lives in KINDS, beside the fields it takes; how it is loaded
is harness.runtime.implementations's. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, Field

from harness.plan.fields import Section, import_path, many, one_or_list
from harness.plan.sections import Contract, VllmSwitch
from harness.plan.yaml_lines import Loc


@dataclass(frozen=True)
class Kind:
    """A kind of implementation: the entry fields it takes (required first, then optional) and its words."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    title: str  # how a page and a decision name it ("{name}": the entry's name), where the entry has no title
    keep: str  # the decision where it beats the kernel and the profile's baseline ("{title}": how it is named)
    describes: str  # what it runs, in words, for the field table and errors
    name_form: tuple[str, str] | None = None  # its `name`: a pattern, and the pattern in words
    functional: bool = False  # called as the reference is: returns the op's outputs (else written as the kernel's)
    switched_by_vllm: bool = False  # a deployment runs it by vLLM's own setting (else by the entry's `setting`)


COMMON = ("role", "kind", "contract", "setting", "title", "max_step_fraction")
KINDS = {
    "native": Kind((), (), "{name}", "keep native", "op.native (else the reference), eager: what vLLM runs without "
                   "the custom op", functional=True),
    "compiled": Kind((), (), "{name}", "leave it to Inductor", "op.native (else the reference) under torch.compile, "
                     "as vLLM's Inductor profile runs it", functional=True),
    "vllm": Kind(("name", "args"), ("signature", "switch"), "vLLM's kernel", "keep vLLM's kernel",
                 "vLLM's own compiled kernel for the op, torch.ops._C.<name>", switched_by_vllm=True,
                 name_form=(r"\w+", "its torch.ops._C name (rms_norm)")),
    "import": Kind(("path",), ("prepare",), "{name}", "leave it to {title}",
                   "a Python function called with the plan's arguments by name"),
    "torch_ops": Kind(("name", "args"), ("library", "signature"), "{name}", "leave it to {title}",
                      "a library's registered torch.ops kernel, 'namespace::name', called with the plan arguments "
                      "`args` picks, after importing `library`",
                      name_form=(r"\w+::\w+", "'namespace::name', as torch.ops registers it")),
}
BUILTIN = ("native", "compiled", "vllm")  # named by their kind, in the order records and tables list them
NATIVE, COMPILED, VLLM = BUILTIN
ROLES = ("baseline", "audited", "default")
# The decision that keeps what vLLM runs in the kernel's place (the entry with role default): vLLM runs it already,
# so it is kept, not left to.
KEEP_DEFAULT = "keep {title}"
DEFAULT = {NATIVE: {"role": ["baseline"]}, COMPILED: {"role": ["baseline"]}}  # a plan that names none: both timed


def kind_of(name: str, entry: dict | Any) -> str:
    """An entry's kind: its name's where the name is built in, else what it says (import by default)."""
    kind = entry.get("kind") if isinstance(entry, dict) else getattr(entry, "kind", None)
    return name if name in BUILTIN else kind or "import"


def title(name: str, entry: Any = None) -> str:
    """How a page and a decision name an implementation: its entry's `title`, else its kind's words ("vLLM's
    kernel"), else its name. `entry` None: a built-in one by its name."""
    return getattr(entry, "title", None) or KINDS[kind_of(name, entry)].title.format(name=name)


def keep(name: str, entry: Any = None) -> str:
    """The decision that leaves the layer to an implementation: "keep vLLM's TRITON_ATTN" for what vLLM runs in the
    kernel's place (role default), else its kind's words ("leave it to cublas", "keep native")."""
    words = KEEP_DEFAULT if "default" in (getattr(entry, "role", None) or ()) else KINDS[kind_of(name, entry)].keep
    return words.format(title=title(name, entry))


def call_of(entry: Any) -> str:
    """The torch.ops call of a vllm or torch_ops entry (torch.ops._C.rms_norm, torch.ops.flashinfer.rmsnorm)."""
    if entry.kind == VLLM:
        return f"torch.ops._C.{entry.name}"
    namespace, _, op = entry.name.partition("::")
    return f"torch.ops.{namespace}.{op}"


def function_of(plan: Any, name: str) -> str | None:
    """What an implementation of the plan runs, by import path (None: a torch.ops kernel, or no such entry): the
    native code for the functional kinds, else its path, with its prepare."""
    e = plan.implementation(name)
    if e is None:
        return None
    if KINDS[e.kind].functional:
        return plan.native_path
    return f"{e.path}; prepared by {e.prepare}" if e.path and e.prepare else e.path


# ---------------------------------------------------------------- an entry


class Implementation(Section):
    """One implementation of the op beside the kernel under test, by kind (harness.plan.implementations.KINDS:
    what each takes and how a page names it)."""

    kind: Optional[Literal[tuple(KINDS)]] = Field(None, description=(
        "import (a Python function, the default) or torch_ops (a library's torch.ops kernel); native, compiled and "
        "vllm are named by their kind"))
    role: Annotated[one_or_list(Literal[ROLES]), AfterValidator(many)] = Field(
        ["baseline"], validate_default=True, description=(
            "baseline (timed beside the kernel, weighed by the decision) and/or audited (run through the numerics "
            "cells beside the kernel), or [] (described only: vLLM's kernel a fusion produces); default beside "
            "baseline: what vLLM runs in the kernel's place, in every profile (one entry at most)"))
    path: Optional[import_path()] = None  # import: the function, called like the kernel
    # Called once per input set before timing: the timed call gets what it returns (weights dequantized or prepacked
    # for a GEMM library), so that work stays outside the timed region.
    prepare: Optional[import_path("an import path 'package.module:attribute': a function taking the kernel's "
                                  "arguments by name and returning the implementation's, by name, outside the timed "
                                  "region")] = None
    name: Optional[str] = Field(None, pattern=r"^\w+(::\w+)?$", description=(
        "its torch.ops name: vllm, the torch.ops._C name (rms_norm); torch_ops, 'namespace::name'"))
    library: Optional[str] = Field(None, pattern=r"^[\w.]+$", description=(
        "the module whose import registers a torch_ops kernel (flashinfer)"))
    args: Optional[list[str]] = Field(None, description=(
        "the plan argument passed for each parameter of its schema, in order"))
    signature: Optional[str] = Field(None, description=(
        "its schema as registered, 'name(Tensor! out, Tensor x, float eps) -> ()', where harness.vllm_facts.kernels's "
        "table lacks it (an installed library's registered schema is read at run time)"))
    contract: Optional[Contract] = None
    # As an audited implementation: the fraction of a quantized output's elements allowed one fp8 step from the
    # reference's, where it rounds in another order than the op's native path (None: the plan's quantization's).
    max_step_fraction: Optional[Annotated[float, Field(ge=0, le=1)]] = Field(None, description="a fraction in [0, 1]")
    switch: Optional[VllmSwitch] = None  # vllm: how a deployment turns it on
    # How a vLLM deployment runs it (a checkpoint format, vLLM's own kernel choice, a flag): where the kernel loses
    # to it, the decision names it and this setting.
    setting: Optional[str] = Field(None, description="how a vLLM deployment runs this implementation")
    # Words only, so a record does not rest on it (harness.results.fingerprints).
    title: Optional[str] = Field(None, description="how a page and a decision name it (vLLM's TRITON_ATTN)")

    @property
    def call(self) -> str:
        """Its torch.ops call (vllm, torch_ops kinds)."""
        return call_of(self)


# ---------------------------------------------------------------- the keys plans wrote before


def upgrade(data: dict, lines: dict[Loc, int]) -> tuple[dict, list[tuple[Loc, str]]]:
    """A plan's data with `benchmark.baselines`, `vllm.kernel` and `providers` read into `implementations`, each
    entry's lines mapped to where the old key stated it (so an error still names its line); and, per old key, a
    warning that shows the form to write instead. A plan that writes `implementations` and an old key is left as
    it is: the model then refuses the old key by name."""
    bench, vllm = data.get("benchmark"), data.get("vllm")
    old = [loc for loc, present in ((("benchmark", "baselines"), isinstance(bench, dict) and "baselines" in bench),
                                    (("vllm", "kernel"), isinstance(vllm, dict) and "kernel" in vllm),
                                    (("providers",), "providers" in data)) if present]
    if not old or "implementations" in data:
        return data, []
    data = dict(data)
    listed = bench.get("baselines") if isinstance(bench, dict) and "baselines" in bench else [NATIVE, COMPILED]
    impls: dict[Any, dict] = {}
    for i, item in enumerate(listed if isinstance(listed, list) else [listed]):
        if isinstance(item, dict) and len(item) == 1:
            name, entry = next(iter(item.items()))
            impls[name] = {"path": entry} if isinstance(entry, str) else dict(entry) if isinstance(entry, dict) \
                else {"path": entry}
            _move(lines, ("benchmark", "baselines", i, name), ("implementations", name))
        elif isinstance(item, str) and item not in impls:
            impls[item] = {}
            _move(lines, ("benchmark", "baselines", i), ("implementations", item))
        else:  # not a baseline the old form had: kept where the model will refuse it by its own words
            impls[f"benchmark.baselines[{i}]"] = {"path": item}
        impls[next(reversed(impls))].setdefault("role", []).append("baseline")
    if isinstance(vllm, dict) and isinstance(vllm.get("kernel"), dict):
        kernel = dict(vllm["kernel"])
        dtypes, why = kernel.pop("dtypes", None), kernel.pop("why", None)
        if dtypes is not None:
            kernel["contract"] = {"dtypes": dtypes, **({"why": why} if why is not None else {})}
        impls[VLLM] = {**kernel, **impls.get(VLLM, {})}
        impls[VLLM].setdefault("role", [])
        _move(lines, ("vllm", "kernel"), ("implementations", VLLM))
        for key in ("dtypes", "why"):
            _move(lines, ("vllm", "kernel", key), ("implementations", VLLM, "contract", key))
        data["vllm"] = {k: v for k, v in vllm.items() if k != "kernel"}
    providers = data.pop("providers", None)
    for i, name in enumerate(providers if isinstance(providers, list) else []):
        if isinstance(name, str) and name in impls:
            impls[name]["role"] = [*impls[name].get("role", []), "audited"]
        else:  # vllm without vllm.kernel, a name no baseline has: refused at this line, as an entry
            impls[name if isinstance(name, str) else str(name)] = {"role": ["audited"]}
            lines.setdefault(("implementations", name), lines.get(("providers", i)) or lines.get(("providers",)))
    if isinstance(bench, dict) and "baselines" in bench:
        data["benchmark"] = {k: v for k, v in bench.items() if k != "baselines"}
    lines.setdefault(("implementations",), min(lines[loc] for loc in old if loc in lines) if any(
        loc in lines for loc in old) else 0)
    data["implementations"] = impls
    keys = ", ".join(".".join(loc) for loc in old)
    return data, [(old[0], f"`implementations:` in place of {keys} (deprecated: read into it for now); write "
                           f"{new_form(impls)}")]


def _move(lines: dict[Loc, int], old: Loc, new: Loc) -> None:
    """Every line under `old` also under `new` (the error of an upgraded entry names the line the file states)."""
    for loc, line in list(lines.items()):
        if loc[:len(old)] == old:
            lines.setdefault(new + loc[len(old):], line)


def new_form(impls: dict) -> str:
    """The `implementations:` section to write, one flow mapping per entry."""
    def flow(value: Any) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(flow(v) for v in value) + "]"
        text = str(value)
        return repr(text) if any(c in text for c in ":{}[],#") or not text else text

    def shown(entry: dict) -> dict:  # the default role left out
        return {k: v for k, v in entry.items() if not (k == "role" and v == ["baseline"])}

    return "implementations: {" + ", ".join(f"{name}: {flow(shown(e))}" for name, e in impls.items()) + "}"

"""Input generation: hypothesis draws the shape of one call, a seeded torch.Generator fills it.

Hypothesis only ever sees small integers and choices (token counts, sizes, layouts, a value
scale, a seed), so failures shrink to a small shape and replay from the example database; the
tensors themselves are built on the device from the drawn seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from .matrix import Cell
from .plan import Arg, Plan

TORCH_DTYPES = {
    "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8,
    "fp8_e4m3fn": getattr(torch, "float8_e4m3fn", None), "fp8_e4m3fnuz": getattr(torch, "float8_e4m3fnuz", None),
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
}
VALUE_SCALES = ("normal", "tiny", "large", "outliers", "zero_rows")
# Largest magnitude drawn per scale; "large" stays inside fp16's range after squaring in fp32.
_SCALE = {"normal": 1.0, "tiny": 1e-3, "large": 100.0, "outliers": 1.0, "zero_rows": 1.0}


@dataclass(frozen=True)
class Example:
    """One drawn call: everything needed to rebuild its tensors exactly."""

    num_tokens: int
    sizes: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)  # arg name -> (layout, padding)
    scale: str = "normal"
    seed: int = 0
    decode_tokens: int = 0  # chunked prefill: how many of num_tokens are decode tokens

    def layout(self, name: str) -> tuple[str, int]:
        """(layout, padding) drawn for an argument; contiguous where none was drawn."""
        return self.layouts.get(name, ("contiguous", 0))

    def shape_key(self) -> tuple:
        """Everything but the token count, the data and the seed: what a compiled graph may specialise on."""
        return tuple(sorted(self.sizes.items())), tuple(sorted(self.layouts.items()))

    def describe(self) -> str:
        parts = [f"num_tokens={self.num_tokens}"]
        if self.decode_tokens:
            parts.append(f"(decode {self.decode_tokens} + prefill {self.num_tokens - self.decode_tokens})")
        parts += [f"{k}={v}" for k, v in sorted(self.sizes.items())]
        parts += [f"{k}:{lay}" + (f"+{pad}" if pad else "") for k, (lay, pad) in sorted(self.layouts.items())]
        parts += [f"scale={self.scale}", f"seed={self.seed}"]
        return " ".join(parts)


def token_cap(plan: Plan, sizes: dict, device: str) -> int | None:
    """On CPU, the most tokens whose activations fit the plan's element budget (None: no cap)."""
    if device != "cpu":
        return None
    per_token = max((_per_token_elements(a, sizes) for a in plan.tensor_args), default=1)
    return max(1, plan.numerics.cpu_element_budget // max(per_token, 1))


def _per_token_elements(arg: Arg, sizes: dict) -> int:
    if not any(d.symbol == "num_tokens" for d in arg.shape):
        return 0
    n = 1
    for d in arg.shape:
        if d.symbol != "num_tokens":
            n *= d.size(sizes)
    return n


# ---------------------------------------------------------------- strategies


@st.composite
def size_values(draw, choices: tuple[int, ...], multiple_of: int = 1, awkward_sizes: bool = True) -> int:
    """A size the plan names, or an awkward one (odd, not a power of two) up to the plan's largest."""
    awkward = st.integers(0, max(choices) // (2 * multiple_of)).map(lambda k: (2 * k + 1) * multiple_of)
    planned = st.sampled_from([c for c in choices if c % multiple_of == 0] or [multiple_of])
    return draw(st.one_of(planned, awkward) if awkward_sizes else planned)


@st.composite
def token_counts(draw, phase: str, plan: Plan, cap: int | None) -> tuple[int, int]:
    """(num_tokens, decode_tokens) shaped the way vLLM's scheduler batches this phase."""
    num = plan.numerics
    top = num.max_num_batched_tokens if cap is None else min(cap, num.max_num_batched_tokens)
    if phase == "decode":  # one token per running sequence
        return draw(st.integers(1, min(num.max_num_seqs, top))), 0
    if phase == "prefill":  # long chunks; on a capped CPU run, as long as the cap allows
        low = min(num.prefill_tokens[0], top)
        return draw(st.integers(low, min(num.prefill_tokens[1], top))), 0
    # chunked prefill: decode tokens and one prefill chunk, flattened into one batch
    decode = draw(st.integers(1, max(1, min(num.max_num_seqs, top - 1))))
    chunk = draw(st.integers(1, max(1, top - decode)))
    return decode + chunk, decode


@st.composite
def layouts(draw, args: tuple[Arg, ...]) -> dict:
    chosen = {}
    for arg in args:
        if arg.is_tensor and arg.role == "input" and len(arg.layouts) > 0:
            layout = draw(st.sampled_from(arg.layouts))
            chosen[arg.name] = (layout, draw(st.integers(1, 64)) if layout == "strided" else 0)
    return chosen


@st.composite
def examples(draw, plan: Plan, cell: Cell, device: str, tp_multiple: dict | None = None) -> Example:
    """One call of the op for this cell. `tp_multiple` maps size symbols to the multiple TP sharding needs."""
    tp_multiple = tp_multiple or {}
    sizes = {sym: draw(size_values(choices, tp_multiple.get(sym, 1), plan.numerics.awkward_sizes), label=sym)
             for sym, choices in plan.sizes.items()}
    cap = token_cap(plan, sizes, device)
    num_tokens, decode_tokens = draw(token_counts(cell.phase, plan, cap), label="tokens")
    return Example(
        num_tokens=num_tokens, decode_tokens=decode_tokens, sizes=sizes,
        layouts=draw(layouts(plan.args), label="layouts"),
        scale=draw(st.sampled_from(VALUE_SCALES), label="scale"),
        seed=draw(st.integers(0, 2**31 - 1), label="seed"),
    )


# ---------------------------------------------------------------- tensors


def build_args(plan: Plan, cell: Cell, ex: Example, device: str) -> dict:
    """The op's keyword arguments for one example, outputs poisoned, in the plan's call order."""
    gen = torch.Generator(device=device).manual_seed(ex.seed)
    act = TORCH_DTYPES[cell.dtype]
    values = {}
    for arg in plan.args:
        if not arg.is_tensor:
            values[arg.name] = arg.value
            continue
        dtype = act if arg.dtype == "act" else TORCH_DTYPES[arg.dtype]
        shape = arg_shape(arg, ex)
        if arg.role == "output":
            values[arg.name] = poisoned(shape, dtype, device)
            continue
        values[arg.name] = in_layout(_fill(arg, shape, dtype, ex.scale, gen, device), *ex.layout(arg.name))
    return values


def arg_shape(arg: Arg, ex: Example) -> list[int]:
    return [ex.num_tokens if d.symbol == "num_tokens" else d.size(ex.sizes) for d in arg.shape]


def poison_value(dtype: torch.dtype) -> float | int:
    """What unwritten memory holds: NaN, or the largest integer (no valid index or count is that large)."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).max


def poisoned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An output buffer whose unwritten elements cannot pass a comparison."""
    return torch.empty(shape, dtype=dtype, device=device).fill_(poison_value(dtype))


def in_layout(t: torch.Tensor, layout: str, pad: int) -> torch.Tensor:
    """`t` in a drawn layout. Strided: a copy inside a buffer `pad` elements wider in the last dimension, as a
    slice of a fused QKV or gate_up output is; the padding is poisoned, so a kernel reading it fails."""
    if layout != "strided" or t.dim() < 2:
        return t
    buf = poisoned(list(t.shape[:-1]) + [t.shape[-1] + pad], t.dtype, t.device)
    view = buf[..., : t.shape[-1]]
    view.copy_(t)
    return view


def _fill(arg: Arg, shape, dtype, scale: str, gen, device) -> torch.Tensor:
    full = list(shape)
    if arg.init == "zeros":
        data = torch.zeros(full, device=device)
    elif arg.init == "uniform":
        data = torch.rand(full, generator=gen, device=device)
    elif arg.init == "around_one":  # weights of a norm layer sit near 1
        data = 1.0 + 0.1 * torch.randn(full, generator=gen, device=device)
    else:
        data = torch.randn(full, generator=gen, device=device) * _SCALE[scale]
        if scale == "outliers" and data.numel():
            idx = torch.randint(0, data.numel(), (max(1, data.numel() // 100),), generator=gen, device=device)
            data.view(-1)[idx] *= 300.0
        if scale == "zero_rows" and data.dim() > 1 and data.shape[0]:
            rows = torch.rand(data.shape[0], generator=gen, device=device) < 0.5
            data[rows] = 0.0
    if dtype.is_floating_point:
        data = data.to(dtype)
    else:
        info = torch.iinfo(dtype)
        data = data.mul(16).round().clamp(info.min, info.max).to(dtype)
    return data


def clone_args(values: dict) -> dict:
    """Copies of the tensor arguments (scalars as they are): the reference runs on these."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()}

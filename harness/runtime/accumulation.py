"""`op.accumulation: fp32`, checked: a kernel accumulating in bf16 or fp16 can stay inside a 16-bit tolerance, so
the check compares the kernel's error against an fp64 truth with the error of the plan's reference, which
accumulates in fp32, on the same inputs.

Two statistics, over the rows of each output (its last dimension):
- row shift: per row, the least-squares relative scale of the row's error, b = sum(e * t) / sum(t * t), in units
  of its noise sigma (from the reference's per-element errors). A reduction accumulated in 16 bits whose result
  scales a row (RMSNorm's variance) shifts the whole row; rounding the output to 16 bits leaves b within its
  noise. Rows where the reference itself is shifted are left out (on inputs of rms near 1, x * rstd rounds back
  onto x, so the reference keeps x's scale: vLLM's rounding, not an accumulator's);
- element error: the root mean square of the error, as a multiple of the reference's.

Correct kernels also round on purpose where the reference does not: attention rounds its probabilities to the
value dtype before P @ V (as flash attention and vLLM's kernels do), which shifts whole rows and multiplies the
element error many times over; GEMMs on tensor cores add in another order. So what the statistics can tell
depends on the op's kind of reduction, which the plan states (`op.reduction`), and the limits below were
calibrated on an H200 over correct kernels of several authors and 16-bit-accumulating ones
(tests/calibration/, docs/calibration.md):
- `limit`: at most this, the kernel is consistent with fp32 accumulation;
- `decisive`: beyond this, no correct kernel of that kind was seen: the cell fails;
- in between: "inconclusive for this op", recorded, and the cell is decided on its values.
On a CPU machine, Triton's interpreter runs the capped sizes (tens of elements per reduction), where a 16-bit
accumulator over a K loop rounds too few times to show: there only row-scaling reductions are checked, and the
other kinds record that they were not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.runtime.numerics import Mismatch

# The checks whose code is here, with their versions (harness.results.checks): raise one when its results may
# differ; a refactor rewrites the manifest instead (python -m harness manifest).
CHECK_VERSIONS = {"accumulation": 1}

CLEAN_SIGMAS = 3.0  # a reference row shifted by more than this many sigma is left out
MIN_ROWS = 8
MIN_ROW_ELEMENTS = 64
# Larger outputs are left to the tolerance: the check's fp64 copies of a 2**31-element output (the int32-overflow
# example) need more memory than an H200 has, and smaller examples of the same cell already show the accumulator.
MAX_ELEMENTS = 2**27
CHECKED_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Limits:
    limit: float
    decisive: float


# op.reduction -> statistic -> its limits, from an H200 run of the corpus (docs/calibration.md: the largest value a
# correct kernel showed, the smallest a 16-bit accumulator did). inf: the statistic never fails a kernel of this kind
# (it is recorded all the same).
LIMITS: dict[str, dict[str, Limits]] = {
    # the reduction's result scales each output row (RMSNorm, per-token scales): correct <= 1.9 sigma and 1.1x,
    # a bf16 or fp16 sum of squares >= 8.1 sigma or >= 4.9x
    "row_scale": {"row_shift": Limits(4.0, 4.0), "element": Limits(4.0, 4.0)},
    # each output element is a dot product (GEMMs): correct 1.0x at K of 4096-14336 with K tiles of 32-128, whose
    # rows shift by up to 4.3 sigma (tensor cores add in their own order); a 16-bit accumulator 10.8x
    "dot": {"row_shift": Limits(4.0, math.inf), "element": Limits(2.0, 4.0)},
    # softmax-weighted sums (attention): probabilities rounded to the value dtype before P @ V shift rows by up to
    # 28 sigma and reach 12.9x, above an accumulator rounded to 16 bits per key tile (17.9 sigma, 5.4x): inseparable
    "weighted_sum": {"row_shift": Limits(4.0, math.inf), "element": Limits(4.0, math.inf)},
    # what the plan does not say: only beyond what a correct kernel of any kind showed (12.9x)
    "unknown": {"row_shift": Limits(4.0, math.inf), "element": Limits(4.0, 64.0)},
}
NOT_ON_CPU = "not checked on a CPU machine: the interpreter's capped sizes reduce over too few elements for a " \
             "16-bit accumulator to show; a GPU run checks it"


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.double().reshape(-1, t.shape[-1])


def row_bias(actual: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per row, the relative scale error that best explains the row's error (0 for an all-zero row)."""
    a, t = _rows(actual), _rows(truth)
    energy = (t * t).sum(-1)
    return torch.where(energy > 0, ((a - t) * t).sum(-1) / energy.clamp_min(1e-300), torch.zeros_like(energy))


def _rms(t: torch.Tensor) -> float:
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0


def row_noise(expected: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per row, the standard deviation of row_bias that the reference's per-element rounding alone would give."""
    e, t = _rows(expected), _rows(truth)
    energy = (t * t).sum(-1).clamp_min(1e-300)
    return ((e - t).pow(2) * t.pow(2)).sum(-1).sqrt() / energy


def statistics(actual: torch.Tensor, expected: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """The statistics this output allows (none for outputs too small or of other dtypes)."""
    if not isinstance(actual, torch.Tensor) or actual.dtype not in CHECKED_DTYPES or actual.dim() == 0 \
            or actual.shape != truth.shape or actual.shape[-1] < MIN_ROW_ELEMENTS or actual.numel() > MAX_ELEMENTS:
        return {}
    a, e, t = _rows(actual), _rows(expected), _rows(truth)
    finite = torch.isfinite(a).all(-1) & torch.isfinite(e).all(-1) & torch.isfinite(t).all(-1)
    a, e, t = a[finite], e[finite], t[finite]
    # The reference's error, floored at a 64th of an ulp at the mean magnitude: an exactly representable result
    # (the reference rounds onto the truth) must not make any rounding of the kernel's look large.
    floor = torch.finfo(actual.dtype).eps * float(t.abs().mean()) / 64 if t.numel() else 0.0
    out = {"element": _rms(a - t) / max(_rms(e - t), floor, 1e-300)} if t.numel() else {}
    sigma = row_noise(e, t)
    clean = (row_bias(e, t).abs() <= CLEAN_SIGMAS * sigma) & (sigma > 0)
    if int(clean.sum()) >= MIN_ROWS:
        out["row_shift"] = float(row_bias(a, t)[clean].pow(2).mean().sqrt() / sigma[clean].pow(2).mean().sqrt())
    return out


_WORDS = {"row_shift": ("shifts whole rows against fp64 by {v:.1f} times the noise of the fp32-accumulating "
                        "reference's rounding"),
          "element": "has {v:.1f}x the fp32-accumulating reference's element error (rms) against fp64"}


@dataclass
class Readings:
    """The largest of each statistic over a cell's examples, and what they say for the op's kind of reduction."""

    reduction: str
    values: dict[str, float] = field(default_factory=dict)

    def check(self, name: str, actual, expected, truth: torch.Tensor) -> None:
        """Record this output's statistics; Mismatch where one is beyond what any correct kernel of the op's kind
        showed."""
        for stat, v in statistics(actual, expected, truth).items():
            self.values[stat] = max(self.values.get(stat, 0.0), round(v, 3))
            lim = LIMITS[self.reduction][stat]
            if v > lim.decisive:
                bound = f"at most {lim.limit:g}" + (f"; correct kernels of this kind reach {lim.decisive:g}"
                                                    if lim.decisive > lim.limit else "")
                raise Mismatch(f"output '{name}': accumulation: the kernel {_WORDS[stat].format(v=v)} ({bound}): "
                               "its reduction does not accumulate in fp32 as op.accumulation says")

    def verdict(self) -> str | None:
        """What the cell records of the check: consistent, inconclusive for this op (and why), or not checked."""
        if not self.values:
            return None
        beyond = sorted(s for s, v in self.values.items() if v > LIMITS[self.reduction][s].limit)
        if not beyond:
            return "fp32: consistent (" + ", ".join(s.replace("_", " ") for s in sorted(self.values)) + ")"
        return (f"inconclusive for this op ({', '.join(s.replace('_', ' ') for s in beyond)} beyond the reference's "
                f"rounding, within what correct {self.reduction.replace('_', ' ')} kernels show): decided on values")

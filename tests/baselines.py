"""Kernel-style baselines for the harness's own tests: a reference wrapped in the kernel's calling convention,
as a user wraps another library's kernel (Liger-Kernel's, FlashInfer's) to the plan's signature."""

from __future__ import annotations

import time

from kernels.rms_norm import rms_norm_ref


def rms_norm_into(out, x, weight, eps):
    """rms_norm(out, x, weight, eps) that writes the reference's result into `out`."""
    out.copy_(rms_norm_ref(x, weight, eps))


def rms_norm_off_by_a_tenth(out, x, weight, eps):
    """A baseline that is fast enough to time and 10% wrong: its outputs differ from the reference."""
    out.copy_(rms_norm_ref(x, weight, eps) * 1.1)


def slow_prepare(out, x, weight, eps):
    """A named baseline's `prepare` that takes 50 ms: a timing that included it would show it."""
    time.sleep(0.05)
    return {"out": out, "x": x, "weight": weight, "eps": eps}


def rms_norm_native(x, weight, eps):
    """An op.native for plans that name one: the reference itself, under another name."""
    return rms_norm_ref(x, weight, eps)

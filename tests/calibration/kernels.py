"""The calibration corpus's own kernels: correct variants of the bundled kernels written another way, and broken
ones, each derived from a bundled kernel by the edit that makes it so (tests/calibration/mutants.py)."""

from __future__ import annotations

import torch

from kernels.fp8_quant import dynamic_per_token_scaled_fp8_quant_ref
from tests.calibration.mutants import mutant

# ---------------------------------------------------------------- correct variants

# RMSNorm: the two-pass path (squares summed per lane in fp32 over chunks) at every width.
rms_norm_two_pass = mutant("kernels.rms_norm", "rms_norm_two_pass", ("    if SINGLE_PASS:", "    if False:")).rms_norm
# RMSNorm multiplying by the weight in fp32, without rounding the normalised row first (Liger's and HF's way).
rms_norm_fp32_weight = mutant("kernels.rms_norm", "rms_norm_fp32_weight", (
    "y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w", "y = x * rstd * w")).rms_norm

# int8 weight-only GEMM with other K tiles: more or fewer fp32 additions of tensor-core partial sums.
int8_linear_block_k32 = mutant("kernels.int8_linear", "int8_linear_block_k32",
                               ("BLOCK_K = 64", "BLOCK_K = 32")).int8_weight_only_linear
int8_linear_block_k128 = mutant("kernels.int8_linear", "int8_linear_block_k128",
                                ("BLOCK_K = 64", "BLOCK_K = 128"), ("BLOCK_N = 64", "BLOCK_N = 32"),
                                ).int8_weight_only_linear

# Paged attention with other key tiles (the online softmax rescales more or less often).
paged_attention_tile16 = mutant("kernels.paged_attention", "paged_attention_tile16",
                                ("TILE = 32", "TILE = 16")).paged_attention
paged_attention_tile64 = mutant("kernels.paged_attention", "paged_attention_tile64",
                                ("TILE = 32", "TILE = 64")).paged_attention
# Paged attention whose P @ V runs in fp32 (probabilities never rounded): slower, and closer to the reference.
paged_attention_fp32_pv = mutant("kernels.paged_attention", "paged_attention_fp32_pv", (
    "p = p.to(v_ptr.dtype.element_ty).to(DOT)", "p = p.to(tl.float32)"), (
    "tl.dot(p, v.to(DOT), input_precision=\"ieee\")", "tl.dot(p, v.to(tl.float32), input_precision=\"ieee\")",
)).paged_attention


def torch_per_token_fp8_quant(out: torch.Tensor, x: torch.Tensor, scales: torch.Tensor,
                              scale_ub: torch.Tensor | None = None) -> None:
    """Dynamic per-token fp8 quantization in plain PyTorch, as a user without a kernel writes it."""
    q, s = dynamic_per_token_scaled_fp8_quant_ref(x, scale_ub, out.dtype)
    out.copy_(q)
    scales.copy_(s)


# ---------------------------------------------------------------- broken

# The int8 GEMM's accumulator rounded to the activation dtype after every K tile.
int8_linear_16bit_accumulator = mutant("kernels.int8_linear", "int8_linear_16bit_accumulator", (
    "acc += tl.dot(x.to(DOT), w.to(DOT), input_precision=\"ieee\")",
    "acc = (acc + tl.dot(x.to(DOT), w.to(DOT), input_precision=\"ieee\")).to(x_ptr.dtype.element_ty).to(tl.float32)",
)).int8_weight_only_linear
# Attention's output accumulator rounded to the cache dtype after every key tile.
paged_attention_16bit_accumulator = mutant("kernels.paged_attention", "paged_attention_16bit_accumulator", (
    "acc = acc * alpha[:, None] + tl.dot(p, v.to(DOT), input_precision=\"ieee\")",
    "acc = (acc * alpha[:, None] + tl.dot(p, v.to(DOT), input_precision=\"ieee\")).to(v_ptr.dtype.element_ty)"
    ".to(tl.float32)",
)).paged_attention
# Per-token fp8 quantization scaled for int8's range (127) instead of fp8's maximum.
fp8_quant_wrong_scale = mutant("kernels.fp8_quant", "fp8_quant_wrong_scale", (
    "scale = tl.maximum(amax / fp8_max, min_scale)", "scale = tl.maximum(amax / 127.0, min_scale)",
)).dynamic_per_token_scaled_fp8_quant
# SiLU-and-mul storing without its mask: writes past each row's end into the next row's output (or past the tensor).
silu_and_mul_unmasked_store = mutant("kernels.silu_and_mul", "silu_and_mul_unmasked_store", (
    "tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)",
    "tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty))",
)).silu_and_mul

"""RMSNorm: out = x * rsqrt(mean(x^2) + eps) * weight, rounded as vLLM's native RMSNorm.

Layout follows Triton's tutorial 05-layer-norm: one program per row, the whole row in
registers for smaller activations (one read of x, one write of out), two passes over chunks for
large ones, where streaming the row in first keeps more loads in flight (_launch_config).
"""

import functools

import torch
import triton
import triton.language as tl

from kernels.host import next_power_of_2, pow2_floor

# A row whose block would exceed this many bytes is processed in chunks (tutorial 05's limit).
MAX_FUSED_BYTES = 65536
# Activations read from this size on are normalised in two passes over chunks of at most CHUNK_BYTES
# (_launch_config). Between the sizes measured on an H200: at 128 MiB one pass won for the fp8 quantizers that
# share this rule (dynamic per-token fp8 at 8192 x 8192: 90.9% of copy bandwidth against 76.8%) and was within 1%
# of two passes for RMSNorm; at 256 MiB two passes won. The fused add has its own threshold.
TWO_PASS_BYTES = 192 << 20
# Batches from this many rows on are prefill-sized: a narrow row gets fewer warps (_launch_config).
PREFILL_ROWS = 1024
CHUNK_BYTES = 8192


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    out_row_stride,
    x_row_stride,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    # int64 row index: row * stride overflows int32 on large (or strided) activations.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        # Every program re-reads weight: keep it in L2. No hint on x: evict_first cost 2-9% of copy bandwidth
        # at prefill sizes on an H200 (8192 x 4096 bf16: 82.5% with it, 90.7% without).
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        # Padded lanes are 0, so they add nothing; divide by the true width, not BLOCK.
        var = tl.sum(x * x, axis=0) / hidden
        rstd = tl.rsqrt(var + eps)
        # vLLM rounds the normalised row to x's dtype before the weight multiply.
        y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # Wide rows: pass 1 accumulates squares per lane, pass 2 re-reads x (mostly from L2).
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += x * x
        var = tl.sum(acc, axis=0) / hidden
        rstd = tl.rsqrt(var + eps)
        for off in range(0, hidden, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < hidden
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
            tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


# Every launch asks again; the answer depends on these numbers only (bounded: the batch sizes a server sees).
@functools.cache
def _launch_config(num_tokens: int, hidden: int, elem_size: int, streams: int = 1, two_pass_bytes: int | None = None):
    """(BLOCK, single_pass, num_warps) for `num_tokens` rows of `hidden` elements of `elem_size` bytes, with
    `streams` activations read per row (1: RMSNorm's x; 2: the fused add's x and residual), two passes from
    `two_pass_bytes` of them read on (default TWO_PASS_BYTES).

    Measured on an H200 (bf16, scripts/kernel_sweep.py and scripts/one_pass_variants.py, cold L2) against
    Inductor's compiled reference:
    - Below TWO_PASS_BYTES of activations read, one pass with the row in registers is fastest, at 16
      elements per thread of the row's power-of-two floor (hidden 5120: 8 warps, 87.6% of copy bandwidth at
      8192 tokens against 81.5% with 16). Prefill-sized batches of rows up to 2048 wide take 32 per thread
      (2 warps): 2048 x 2048 RMSNorm 47.2% eager and 66.7% under CUDA graphs against 45.1% and 64.4% with 4
      (Inductor 44.5% and 63.7%); decode batches keep 16 (64 x 2048 under graphs: 6.0% against 5.7%).
    - From that size on (the fused add: from FUSED_ADD_TWO_PASS_BYTES), two passes over chunks win: pass 1
      only streams the row in (loads with nothing waiting on them), pass 2 re-reads it from L2 and writes.
      32768 x 8192 RMSNorm: 100.5% of copy bandwidth against 94.1% in one pass (Inductor 100.4%). Chunks of
      half the row suit RMSNorm, of the whole row (up to CHUNK_BYTES) the fused add, which streams two
      tensors; 8 elements (16 bytes of bf16) per thread.
    """
    block = next_power_of_2(hidden)
    fits = block * elem_size <= MAX_FUSED_BYTES
    two_pass_bytes = TWO_PASS_BYTES if two_pass_bytes is None else two_pass_bytes
    if fits and streams * num_tokens * hidden * elem_size < two_pass_bytes:
        per_thread = 32 if num_tokens >= PREFILL_ROWS and hidden <= 2048 else 16
        return block, True, min(max(pow2_floor(hidden) // (32 * per_thread), 1), 16)
    chunk = pow2_floor(hidden) if streams > 1 else max(pow2_floor(hidden) // 2, 1)
    chunk = min(chunk, CHUNK_BYTES // elem_size)
    return chunk, False, min(max(chunk * elem_size // 512, 1), 16)


def rms_norm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Write RMSNorm(x) * weight into `out`. One launch, no allocation, no host sync."""
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block, single_pass, num_warps = _launch_config(num_tokens, hidden, x.element_size())
    # Row strides are passed so strided views (last dim contiguous) need no copy.
    _rms_norm_kernel[(num_tokens,)](
        out,
        x,
        weight,
        out.stride(0),
        x.stride(0),
        hidden,
        eps,
        BLOCK=block,
        SINGLE_PASS=single_pass,
        num_warps=num_warps,
    )


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's RMSNorm.forward_native without residual."""
    orig_dtype = x.dtype
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return xf.to(orig_dtype) * weight


# ---------------------------------------------------------------- the op's vLLM side (the plan's vllm section)
# How vLLM's calls map onto the kernel's arguments: the generated plugin calls these, and so do the harness's
# integration items. Each returns the kernel's inputs by the plan's names, or None for a call the kernel does not
# take (vLLM then runs its own path).


def vllm_layer(layer_class, x, weight, eps):
    """vLLM's RMSNorm holding this call's weight, and the arguments of its forward."""
    layer = layer_class(x.shape[-1], eps=eps, dtype=weight.dtype)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    return layer, (x,)


def vllm_forward_inputs(layer, x, residual=None):
    """RMSNorm.forward(x, residual): the kernel normalises without a residual, over the whole row, with a weight."""
    if residual is not None or layer.variance_size_override is not None or not layer.has_weight:
        return None
    return {"x": x, "weight": layer.weight.data, "eps": layer.variance_epsilon}


def vllm_ir_inputs(x, weight, epsilon, variance_size=None):
    """vllm.ir.ops.rms_norm(x, weight, epsilon, variance_size)."""
    if weight is None or variance_size is not None:
        return None
    return {"x": x, "weight": weight, "eps": epsilon}

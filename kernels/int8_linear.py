"""Weight-only int8 linear: out = x @ (weight * weight_scale[:, None]).T, one fp32 scale per output channel.

Tiled like Triton's tutorial 03 (one program per [BLOCK_M, BLOCK_N] tile of out, a K loop of tl.dot
with an fp32 accumulator). The int8 weight tile is converted to the activation dtype inside the
kernel, which is exact (|w| <= 128 fits fp16 and bf16), so the dot runs on fp16/bf16 tensor cores;
the per-column scale is applied once to the fp32 accumulator after the K loop (it is constant along
K, so scaling after the sum equals dequantizing first). Then one rounding to out's dtype.

Nothing depends on absolute column or feature indices, so a tensor-parallel shard is just a smaller
problem: column-parallel (weight and weight_scale sliced along out_features; out a column block, possibly
a strided view of the full output) and row-parallel (x and weight sliced along in_features; the ranks'
partial outputs summed by the caller). All strides are passed, so such views need no copy.
"""

import os

import torch
import triton
import triton.language as tl

from kernels.host import cdiv, next_power_of_2

BLOCK_N = 64
BLOCK_K = 64


def dot_dtype(dtype: torch.dtype, device: torch.device):
    """tl.dot operand dtype: the activation dtype, except bf16 on a CPU machine (Triton's interpreter
    keeps bf16 as uint16 and its dot, numpy's matmul, multiplies the bit patterns; its int8 -> bf16
    cast is wrong too): there both operands go to fp32, exact for bf16 x and int8 w."""
    if dtype == torch.bfloat16 and (device.type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"):
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


@triton.jit
def _int8_linear_kernel(
    out_ptr, x_ptr, w_ptr, scale_ptr,
    num_tokens, out_features, in_features,
    so_m, so_n, sx_m, sx_k, sw_n, sw_k,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):
    # int64 indices: token * row stride and out_feature * in_features overflow int32 on large layers.
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < num_tokens
    n_ok = n < out_features
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < in_features
        # Masked lanes load 0, so padding along K adds nothing to the sum.
        x = tl.load(x_ptr + m[:, None] * sx_m + k[None, :] * sx_k, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        # The weight tile is read transposed: [BLOCK_K, BLOCK_N] from the [out, in] matrix.
        w = tl.load(w_ptr + n[None, :] * sw_n + k[:, None] * sw_k, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc += tl.dot(x.to(DOT), w.to(DOT), input_precision="ieee")
    scale = tl.load(scale_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    y = acc * scale[None, :]  # per output column
    tl.store(out_ptr + m[:, None] * so_m + n[None, :] * so_n, y.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def int8_weight_only_linear(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor
) -> None:
    """Write x @ (weight * weight_scale[:, None]).T into `out` ([num_tokens, out_features]).
    One launch, no allocation, no host sync."""
    num_tokens, in_features = x.shape
    out_features = weight.shape[0]
    if num_tokens == 0 or out_features == 0:
        return
    # At least 16 rows for tl.dot; decode batches (1-16 tokens) take one row block.
    block_m = min(max(16, next_power_of_2(num_tokens)), 64)
    grid = (cdiv(num_tokens, block_m), cdiv(out_features, BLOCK_N))
    _int8_linear_kernel[grid](
        out, x, weight, weight_scale,
        num_tokens, out_features, in_features,
        *out.stride(), *x.stride(), *weight.stride(),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT=dot_dtype(x.dtype, x.device),
        num_warps=4,
    )


def int8_weight_only_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Dequantize in fp32, matmul in fp32, round to x's dtype."""
    w = weight.float() * weight_scale.float()[:, None]
    return (x.float() @ w.T).to(x.dtype)


def int8_weight_only_linear_native(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """What vLLM runs without the custom op (the plan's op.native): dequantize to x's dtype, then F.linear, a GEMM in
    the activation dtype (cuBLAS on a GPU). The reference's fp32 GEMM is the accuracy oracle, not a speed baseline."""
    return torch.nn.functional.linear(x, dequantize(weight, weight_scale, x.dtype))


def dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight * weight_scale[:, None] in `dtype` ([out_features, in_features])."""
    return weight.to(dtype) * weight_scale.to(dtype)[:, None]


def dequantize_weight(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      weight_scale: torch.Tensor) -> dict:
    """The `cublas` baseline's `prepare`: the weights dequantized to x's dtype once, outside the timed region (as a
    deployment that keeps 16-bit weights would hold them)."""
    return {"out": out, "x": x, "weight": dequantize(weight, weight_scale, x.dtype)}


def dequantized_linear(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """The `cublas` baseline: out = x @ weight.T on weights already in x's dtype, one GEMM (cuBLAS on a GPU)."""
    torch.mm(x, weight.T, out=out)


# ---------------------------------------------------------------- the op's vLLM side (the plan's vllm section)
# How vLLM's linear layers reach the kernel through a quantization method: the generated plugin's LinearMethodBase
# calls these, and the harness's integration items build vLLM's layer with vllm_layer.


def vllm_layer(layer_class, quant_config, x, weight, weight_scale):
    """vLLM's linear layer (ColumnParallelLinear, RowParallelLinear) built with the quantization method's config,
    holding this call's int8 weight and scales, and the arguments of its forward."""
    out_features, in_features = weight.shape
    layer = layer_class(in_features, out_features, bias=False, quant_config=quant_config, params_dtype=x.dtype,
                        return_bias=False)
    layer.weight.data.copy_(weight)
    layer.weight_scale.data.copy_(weight_scale)
    return layer, (x,)


def vllm_create_weights(layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                        params_dtype, **extra_weight_attrs):
    """The layer's quantized weights, as vLLM's weight loader fills them: int8 [out, in] and fp32 scales per output
    feature, both sharded with the layer's output (and the weight with its input) partition."""
    from vllm.model_executor.parameter import ChannelQuantScaleParameter, ModelWeightParameter

    out_features, loader = sum(output_partition_sizes), extra_weight_attrs["weight_loader"]
    layer.register_parameter("weight", ModelWeightParameter(
        data=torch.empty(out_features, input_size_per_partition, dtype=torch.int8), input_dim=1, output_dim=0,
        weight_loader=loader))
    layer.register_parameter("weight_scale", ChannelQuantScaleParameter(
        data=torch.empty(out_features, dtype=torch.float32), output_dim=0, weight_loader=loader))


def vllm_apply_inputs(layer, x, bias=None):
    """LinearMethodBase.apply(layer, x, bias): the kernel has no bias."""
    if bias is not None:
        return None
    return {"x": x, "weight": layer.weight, "weight_scale": layer.weight_scale}

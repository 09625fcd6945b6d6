"""vLLM's own weight-only int8 GEMM as a benchmark baseline of the int8 linear plans: machete, what vLLM 0.26 picks
for a weight-only int8 layer (GPTQ 8-bit, symmetric, per-channel scales) on Hopper (MacheteLinearKernel in
vllm/model_executor/kernels/linear/mixed_precision/machete.py).

It runs from vLLM's compiled ops library (`torch.ops._C.machete_prepack_B` and `machete_mm`, both in vLLM 0.26.0's
`_C_stable_libtorch.abi3.so`), loaded from HARNESS_VLLM_OPS_LIBRARY (`--vllm-ops-library`) or an installed vLLM.
The weights are prepacked once per input set by `machete_prepack` (the plan's `prepare`), outside the timed
region, as vLLM prepacks them once when a model loads. Where the library, a CUDA GPU or Hopper is missing, both
raise RuntimeError saying so, and the benchmark records the baseline as not run with that reason. Below Hopper
vLLM picks Marlin instead, which these plans do not time.
"""

import os

import torch

LIBRARY_ENV = "HARNESS_VLLM_OPS_LIBRARY"  # what the harness's --vllm-ops-library sets


def scalar_type_id(exponent: int, mantissa: int, signed: bool, bias: int, finite_values_only: bool = False,
                   nan_repr: int = 1) -> int:
    """vLLM's ScalarType.id (vllm/scalar_type.py, 0.26): its fields packed into one int64, as its C++ side reads it."""
    value, offset = 0, 0
    for member, width in ((exponent, 8), (mantissa, 8), (signed, 1), (bias, 32), (finite_values_only, 1),
                          (nan_repr, 8)):
        value |= (int(member) & ((1 << width) - 1)) << offset
        offset += width
    return value


# scalar_types.uint8b128: an 8-bit unsigned value stored with a bias of 128 (stored = int8 value + 128), GPTQ 8-bit.
UINT8B128 = scalar_type_id(0, 8, False, 128)


def vllm_op(name: str):
    """torch.ops._C.<name>, from vLLM's ops library or an installed vLLM; RuntimeError saying why it is missing."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"vLLM's {name} runs on a CUDA GPU; this machine has none")
    if torch.cuda.get_device_capability() != (9, 0):
        major, minor = torch.cuda.get_device_capability()
        raise RuntimeError(f"vLLM's machete runs on Hopper (sm90) only, this GPU is sm{major}{minor} (vLLM picks "
                           "Marlin there, which this plan does not time)")
    try:
        return getattr(torch.ops._C, name)
    except (AttributeError, RuntimeError):
        pass
    library = os.environ.get(LIBRARY_ENV)
    try:
        if library:
            torch.ops.load_library(library)
        else:
            import vllm._custom_ops  # noqa: F401  registers torch.ops._C from an installed vLLM
    except Exception as exc:
        raise RuntimeError(f"vLLM's ops cannot be loaded ({LIBRARY_ENV}={library or 'unset'}): "
                           f"{type(exc).__name__}: {exc}") from None
    try:
        return getattr(torch.ops._C, name)
    except (AttributeError, RuntimeError):
        raise RuntimeError(f"vLLM's ops ({library or 'vllm'}) register no {name}") from None


def gptq_uint8b128(weight: torch.Tensor) -> torch.Tensor:
    """An int8 weight [out_features, in_features] as a GPTQ 8-bit checkpoint packs it: uint8b128 (value + 128), four
    consecutive input features per int32 (input feature 4j + i in bits 8i of word j, as vLLM's
    pack_quantized_values_into_int32 packs them), [in_features / 4, out_features] with the input dim contiguous
    (the `x.t().contiguous().t()` layout MacheteLinearKernel hands machete_prepack_B)."""
    stored = (weight.to(torch.int16) + 128).to(torch.uint8).contiguous()
    return stored.view(torch.int32).t()  # a little-endian view: byte i of word j is input feature 4j + i


def machete_prepack(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> dict:
    """The `machete` baseline's `prepare`: the int8 weight [out_features, in_features] as vLLM's GPTQ 8-bit
    checkpoint holds it (uint8b128, four consecutive input features per int32, [in_features / 4, out_features]),
    prepacked by machete_prepack_B; the scales in x's dtype, one group spanning in_features ([1, out_features])."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"vLLM's machete multiplies fp16 or bf16 activations, not {x.dtype}")
    prepacked = vllm_op("machete_prepack_B")(gptq_uint8b128(weight), x.dtype, UINT8B128, x.dtype)
    return {"out": out, "x": x, "weight": prepacked, "weight_scale": weight_scale.to(x.dtype)[None, :].contiguous()}


def machete_linear(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
    """out = x @ dequantized weight.T through machete_mm, as MacheteLinearKernel.apply_weights calls it (group size
    -1: per channel). machete_mm returns a new tensor: copying it into `out` adds one small kernel to the timing."""
    result = vllm_op("machete_mm")(x, weight, UINT8B128, None, weight_scale, None, -1, None, None, None)
    out.copy_(result)

"""Rotary position embedding, in place, as vLLM's `rotary_embedding(positions, query, key, head_size,
cos_sin_cache, is_neox)`:

    query [num_tokens, num_heads * head_size], key [num_tokens, num_kv_heads * head_size] or None,
    positions int64 [num_tokens], cos_sin_cache [max_position, rot_dim] = [cos | sin] per position.

In each head the first rot_dim elements rotate (the rest pass through): pairs (x, y) are
(i, rot_dim/2 + i) in the neox (rotate-half) style, (2i, 2i + 1) in the gptj (interleaved) style, and
    x' = x * cos_i - y * sin_i,  y' = y * cos_i + x * sin_i.
As vLLM's CUDA kernel: values and cos/sin are converted to fp32, rotated, rounded once. vLLM's
forward_native computes in the activation dtype (cos/sin cast to it, every product rounded), so in
fp16/bf16 the two differ by a few ulp. One program per token, all its heads in one tile.
"""

import torch
import triton
import triton.language as tl

from kernels.host import next_power_of_2


@triton.jit
def _rotate_heads(base, cos, sin, num_heads, head_size, half,
                  IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (i < half)
    if IS_NEOX:
        x_ptrs = base + h * head_size + i
        y_ptrs = x_ptrs + half
    else:
        x_ptrs = base + h * head_size + 2 * i
        y_ptrs = x_ptrs + 1
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptrs, (x * cos - y * sin).to(base.dtype.element_ty), mask=mask)
    tl.store(y_ptrs, (y * cos + x * sin).to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_embedding_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    q_row_stride,
    k_row_stride,
    cache_row_stride,
    num_heads,
    num_kv_heads,
    head_size,
    half,
    IS_NEOX: tl.constexpr,
    HAS_KEY: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # int64 token index: token * stride overflows int32 on long prefills.
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    i = tl.arange(0, BLOCK_D)[None, :]
    cache_row = cache_ptr + pos * cache_row_stride
    # One cos/sin row per token, shared by every head of query and key.
    cos = tl.load(cache_row + i, mask=i < half, other=0.0).to(tl.float32)
    sin = tl.load(cache_row + half + i, mask=i < half, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + tok * q_row_stride, cos, sin, num_heads, head_size, half, IS_NEOX, BLOCK_H, BLOCK_D)
    if HAS_KEY:
        _rotate_heads(k_ptr + tok * k_row_stride, cos, sin, num_kv_heads, head_size, half, IS_NEOX,
                      BLOCK_H, BLOCK_D)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate query (and key, if given) in place. One launch, no allocation, no host sync."""
    num_tokens = query.shape[0]
    if num_tokens == 0:
        return
    num_heads = query.shape[-1] // head_size
    num_kv_heads = 0 if key is None else key.shape[-1] // head_size
    half = cos_sin_cache.shape[-1] // 2
    block_h = next_power_of_2(max(num_heads, num_kv_heads))
    block_d = next_power_of_2(half)
    num_warps = min(max(block_h * block_d // 256, 1), 8)
    # Row strides are passed so strided views (e.g. q and k sliced out of a fused qkv) need no copy.
    _rotary_embedding_kernel[(num_tokens,)](
        positions,
        query,
        query if key is None else key,  # never touched without HAS_KEY
        cos_sin_cache,
        query.stride(0),
        0 if key is None else key.stride(0),
        cos_sin_cache.stride(0),
        num_heads,
        num_kv_heads,
        head_size,
        half,
        IS_NEOX=is_neox,
        HAS_KEY=key is not None,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=num_warps,
    )


def build_cos_sin_cache(
    base: float, rot_dim: int, max_position: int, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """[max_position, rot_dim] = [cos | sin], as vLLM's RotaryEmbedding._compute_cos_sin_cache: fp32 on the
    device, then cast to the model dtype."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float, device=device) / rot_dim))
    t = torch.arange(max_position, dtype=torch.float, device=device)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """vLLM's ApplyRotaryEmb.forward_static: every op in x's dtype."""
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1) if is_neox else (x[..., ::2], x[..., 1::2])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)


def rotary_embedding_ref(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vLLM's RotaryEmbedding.forward_native (cache cast to the query dtype); returns new (query, key)."""
    rot_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.to(query.dtype).index_select(0, positions.flatten()).chunk(2, dim=-1)

    def apply(x):
        x3 = x.reshape(x.shape[0], -1, head_size)
        rotated = _rotate_ref(x3[..., :rot_dim], cos, sin, is_neox)
        return torch.cat((rotated, x3[..., rot_dim:]), dim=-1).reshape(x.shape)

    return apply(query), None if key is None else apply(key)


# ---------------------------------------------------------------- the op's vLLM side (the plan's vllm section)
# How vLLM's calls map onto the kernel's arguments: the generated plugin calls these, and so do the harness's
# integration items. The kernel rotates query and key in place; vLLM's forward returns them as its outputs.


def vllm_layer(layer_class, positions, query, key, head_size, cos_sin_cache, is_neox):
    """vLLM's RotaryEmbedding holding this call's cos/sin cache, and the arguments of its forward."""
    max_position, rotary_dim = cos_sin_cache.shape
    layer = layer_class(head_size=head_size, rotary_dim=rotary_dim, max_position_embeddings=max_position,
                        base=10000.0, is_neox_style=is_neox, dtype=cos_sin_cache.dtype)
    layer.cos_sin_cache = cos_sin_cache  # the call's own table (the plan draws it with base 10000 too)
    return layer, (positions, query, key)


def vllm_forward_inputs(layer, positions, query, key=None):
    """RotaryEmbedding.forward(positions, query, key): the kernel takes 1-D positions and a key."""
    if key is None or positions.dim() != 1:
        return None
    return {"positions": positions, "query": query, "key": key, "head_size": layer.head_size,
            "cos_sin_cache": layer._match_cos_sin_cache_dtype(query), "is_neox": layer.is_neox_style}

"""Deliberately broken rotary_embedding variants: the harness must catch every one.

Each has the signature of `kernels.rotary_embedding.rotary_embedding`
(positions, query, key, head_size, cos_sin_cache, is_neox) -> None and carries exactly ONE bug, named
in its docstring. The kernels reuse the real one's per-head rotation with that bug planted.
"""

import triton
import triton.language as tl

from kernels.rotary_embedding import _rotate_heads
# The real kernel, for "a correct kernel passes".
from kernels.rotary_embedding import rotary_embedding as correct  # noqa: F401


@triton.jit
def _rope_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, q_row_stride, k_row_stride, cache_row_stride,
    num_heads, num_kv_heads, head_size, half,
    IS_NEOX: tl.constexpr, ROTATE_KEY: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    i = tl.arange(0, BLOCK_D)[None, :]
    cache_row = cache_ptr + pos * cache_row_stride
    cos = tl.load(cache_row + i, mask=i < half, other=0.0).to(tl.float32)
    sin = tl.load(cache_row + half + i, mask=i < half, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + tok * q_row_stride, cos, sin, num_heads, head_size, half, IS_NEOX, BLOCK_H, BLOCK_D)
    if ROTATE_KEY:
        _rotate_heads(k_ptr + tok * k_row_stride, cos, sin, num_kv_heads, head_size, half, IS_NEOX,
                      BLOCK_H, BLOCK_D)


def _launch(positions, query, key, head_size, cos_sin_cache, is_neox, rotate_key):
    num_tokens = query.shape[0]
    if num_tokens == 0:
        return
    num_heads = query.shape[-1] // head_size
    num_kv_heads = 0 if key is None else key.shape[-1] // head_size
    half = cos_sin_cache.shape[-1] // 2
    _rope_kernel[(num_tokens,)](
        positions, query, query if key is None else key, cos_sin_cache,
        query.stride(0), 0 if key is None else key.stride(0), cos_sin_cache.stride(0),
        num_heads, num_kv_heads, head_size, half,
        IS_NEOX=is_neox, ROTATE_KEY=rotate_key and key is not None,
        BLOCK_H=triton.next_power_of_2(max(num_heads, num_kv_heads)), BLOCK_D=triton.next_power_of_2(half),
    )


def always_gptj(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Bug: ignores is_neox and always rotates interleaved pairs (2i, 2i + 1): right for gptj-style
    models, wrong for every neox-style (rotate-half) one, i.e. most of them (Llama, Qwen, Mistral)."""
    _launch(positions, query, key, head_size, cos_sin_cache, False, rotate_key=True)  # BUG: is_neox dropped


def key_unrotated(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Bug: rotates query only; key is left as it came in (attention scores lose the relative position)."""
    _launch(positions, query, key, head_size, cos_sin_cache, is_neox, rotate_key=False)  # BUG


def out_of_place(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Bug: rotates copies and returns them; query and key, which the op mutates, are left as they came in."""
    query, key = query.clone(), None if key is None else key.clone()  # BUG: the caller's tensors are not written
    _launch(positions, query, key, head_size, cos_sin_cache, is_neox, rotate_key=True)
    return query, key

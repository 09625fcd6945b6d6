"""rotary_embedding against rotary_embedding_ref (vLLM's forward_native): neox and gptj styles, partial
rotary, key or no key, odd head counts, strided q/k views, empty batches, and its broken variants.

On a CPU machine the kernel runs in Triton's interpreter; on a GPU machine the same tests run on CUDA.
Token counts are small: the interpreter pays per program (one per token).
"""

from __future__ import annotations

import os

import pytest
import torch

# On a CPU machine the harness plugin sets this before any kernel is defined; set it here too so the
# file also runs on its own (Triton reads it when a @triton.jit kernel is defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.rotary_embedding import build_cos_sin_cache, rotary_embedding, rotary_embedding_ref
from tests.broken.rotary_bugs import always_gptj, key_unrotated

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_POSITION = 4096
BASE = 10000.0
# (atol, rtol). The reference rounds every product and difference to the activation dtype (as
# forward_native), the kernel rounds once from fp32 (as vLLM's CUDA kernel), and a CPU machine truncates
# that final cast to bf16: up to 2 ulp apart on outputs of magnitude ~3. Worst seen here over these
# shapes and 3 seeds: fp32 0, fp16 3.9e-3, bf16 3.1e-2, at most 0.46 of these tolerances. (vLLM's
# 1e-3/1.6e-2 for bf16 fails by 6.6x where x1*cos - x2*sin cancels: the rounded products dominate.)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_inputs(num_tokens: int, num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                seed: int = 0, fused_qkv: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions, query, key), randn activations, positions spread over the whole cache (0 and the last
    one included). With fused_qkv, query and key are column slices of one [T, (H + 2K) * D] tensor, the way
    vLLM splits its qkv projection: their row stride is the fused width, not their own."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=g)
    positions[: min(num_tokens, 2)] = torch.tensor([0, MAX_POSITION - 1])[: min(num_tokens, 2)]
    q_width, k_width = num_heads * head_size, num_kv_heads * head_size
    if fused_qkv:
        qkv = torch.randn(num_tokens, q_width + 2 * k_width, generator=g).to(dtype).to(DEVICE)
        query, key = qkv[:, :q_width], qkv[:, q_width : q_width + k_width]
    else:
        query = torch.randn(num_tokens, q_width, generator=g).to(dtype).to(DEVICE)
        key = torch.randn(num_tokens, k_width, generator=g).to(dtype).to(DEVICE)
    return positions.to(DEVICE), query, key


def _check(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


def _run(kernel, positions, query, key, head_size, cache, is_neox) -> None:
    """Reference first (the kernel is in place), then the kernel; compares query and key."""
    ref_q, ref_k = rotary_embedding_ref(positions, query, key, head_size, cache, is_neox)
    kernel(positions, query, key, head_size, cache, is_neox)
    _check(query, ref_q, query.dtype)
    if key is not None:
        _check(key, ref_k, key.dtype)


# (num_tokens, num_heads, num_kv_heads, head_size, rot_dim): GQA, one token, odd head counts,
# partial rotary (rot_dim < head_size, Phi/GPT-NeoX style), head sizes 80 and 120 (half not a power of 2),
# and a Llama-70B-sized tile (32 query heads, 8 kv heads, 128).
SHAPES = [(7, 4, 2, 64, 64), (1, 2, 2, 128, 128), (5, 3, 1, 80, 32), (3, 5, 5, 120, 120), (4, 6, 3, 96, 48),
          (2, 32, 8, 128, 128)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("num_tokens, num_heads, num_kv_heads, head_size, rot_dim", SHAPES)
def test_matches_reference(num_tokens: int, num_heads: int, num_kv_heads: int, head_size: int, rot_dim: int,
                           is_neox: bool, dtype: torch.dtype) -> None:
    cache = build_cos_sin_cache(BASE, rot_dim, MAX_POSITION, dtype, DEVICE)
    positions, query, key = make_inputs(num_tokens, num_heads, num_kv_heads, head_size, dtype)
    def tail(t: torch.Tensor) -> torch.Tensor:  # the part of each head past rot_dim
        return t.view(num_tokens, -1, head_size)[..., rot_dim:].clone()

    pass_q, pass_k = tail(query), tail(key)
    _run(rotary_embedding, positions, query, key, head_size, cache, is_neox)
    # ... which passes through bit for bit.
    assert torch.equal(tail(query), pass_q) and torch.equal(tail(key), pass_k)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_without_key(is_neox: bool) -> None:
    """key=None (cross-layer KV sharing): query is rotated as usual."""
    cache = build_cos_sin_cache(BASE, 64, MAX_POSITION, torch.bfloat16, DEVICE)
    positions, query, _ = make_inputs(5, 4, 2, 64, torch.bfloat16)
    ref_q, ref_k = rotary_embedding_ref(positions, query, None, 64, cache, is_neox)
    rotary_embedding(positions, query, None, 64, cache, is_neox)
    assert ref_k is None
    _check(query, ref_q, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_strided_views_of_fused_qkv(is_neox: bool, dtype: torch.dtype) -> None:
    """query and key as slices of one qkv tensor; the value slice (and everything else) is untouched."""
    positions, query, key = make_inputs(6, 4, 2, 64, dtype, fused_qkv=True)
    qkv = query._base if query._base is not None else query
    value_before = qkv[:, 6 * 64 :].clone()
    assert query.stride(0) == key.stride(0) == 8 * 64 and not query.is_contiguous()
    cache = build_cos_sin_cache(BASE, 64, MAX_POSITION, dtype, DEVICE)
    _run(rotary_embedding, positions, query, key, 64, cache, is_neox)
    assert torch.equal(qkv[:, 6 * 64 :], value_before)


def test_empty_batch() -> None:
    positions, query, key = make_inputs(0, 4, 2, 64, torch.float32)
    cache = build_cos_sin_cache(BASE, 64, MAX_POSITION, torch.float32, DEVICE)
    rotary_embedding(positions, query, key, 64, cache, True)
    assert query.shape == (0, 256) and key.shape == (0, 128)


def test_inputs_other_than_query_and_key_untouched() -> None:
    positions, query, key = make_inputs(4, 2, 2, 64, torch.float32)
    cache = build_cos_sin_cache(BASE, 64, MAX_POSITION, torch.float32, DEVICE)
    positions_before, cache_before = positions.clone(), cache.clone()
    rotary_embedding(positions, query, key, 64, cache, True)
    assert torch.equal(positions, positions_before) and torch.equal(cache, cache_before)


def test_cos_sin_cache_layout() -> None:
    """[cos | sin] of position * base^(-2i / rot_dim), against fp64 (positions < 64 keep fp32 angles exact
    to ~1e-5)."""
    rot_dim, max_pos = 48, 64
    cache = build_cos_sin_cache(BASE, rot_dim, max_pos, torch.float32, DEVICE)
    angle = torch.arange(max_pos, dtype=torch.float64)[:, None] * BASE ** (
        -torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    expected = torch.cat((angle.cos(), angle.sin()), dim=-1).float()
    assert cache.shape == (max_pos, rot_dim) and cache.dtype == torch.float32
    torch.testing.assert_close(cache.cpu(), expected, atol=2e-5, rtol=0)
    assert build_cos_sin_cache(BASE, rot_dim, max_pos, torch.bfloat16, DEVICE).dtype == torch.bfloat16


# ----------------------------------------------------------------------------- the checks can fail


def test_broken_always_gptj_fails_on_neox() -> None:
    positions, query, key = make_inputs(5, 4, 2, 64, torch.float32)
    cache = build_cos_sin_cache(BASE, 64, MAX_POSITION, torch.float32, DEVICE)
    with pytest.raises(AssertionError):
        _run(always_gptj, positions, query, key, 64, cache, is_neox=True)
    # ... and it is right where its one assumption holds, so the failure above is the bug.
    positions, query, key = make_inputs(5, 4, 2, 64, torch.float32)
    _run(always_gptj, positions, query, key, 64, cache, is_neox=False)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_broken_key_unrotated_fails(is_neox: bool) -> None:
    positions, query, key = make_inputs(5, 4, 2, 64, torch.float32)
    cache = build_cos_sin_cache(BASE, 64, MAX_POSITION, torch.float32, DEVICE)
    ref_q, ref_k = rotary_embedding_ref(positions, query, key, 64, cache, is_neox)
    key_unrotated(positions, query, key, 64, cache, is_neox)
    _check(query, ref_q, torch.float32)  # query is right...
    with pytest.raises(AssertionError):
        _check(key, ref_k, torch.float32)  # ...key is not

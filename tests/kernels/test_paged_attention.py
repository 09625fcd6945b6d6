"""paged_attention against paged_attention_ref on decode and chunked-prefill batches, and its broken variant.

Inputs are built here with a seeded generator (on a CPU machine the kernel runs in Triton's interpreter;
on a GPU machine the same tests run on CUDA). Batches are small: the interpreter pays per program.
"""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import paged_attention, paged_attention_native, paged_attention_ref
from tests.broken.paged_attention_bugs import attends_whole_blocks

# These tests run kernels in this process: in Triton's interpreter made faithful, as the workers run them.
pytestmark = pytest.mark.usefixtures("faithful_interpreter")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (atol, rtol). bf16/fp16: P is rounded to the cache dtype for the P @ V dot, and a CPU machine truncates
# the final fp32 -> bf16 cast (1 ulp); measured worst cases here: fp32 5e-7, fp16 1e-3, bf16 1.6e-2.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_batch(
    q_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_size: int,
    block_size: int, dtype: torch.dtype, seed: int = 0, kv_interleaved: bool = False, query_in_qkv: bool = False,
) -> Batch:
    """(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc) satisfying the kernel's
    invariants: distinct random block ids, spare blocks and stale block-table entries, random cache slots
    past every seq_len (what a real cache holds there)."""
    g = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_needed) + 3
    ids = torch.randperm(num_blocks, generator=g).to(torch.int32)
    # Stale entries past each sequence's blocks point at real blocks: the kernel must not use them.
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), max(blocks_needed, default=0) + 1),
                                 generator=g, dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks_needed):
        block_tables[s, :n] = ids[used:used + n]
        used += n
    num_tokens = sum(q_lens)
    if query_in_qkv:  # query as vLLM slices it from a fused qkv projection: a strided token dim
        qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, generator=g).to(DEVICE, dtype)
        query = qkv[:, : num_heads * head_size].view(num_tokens, num_heads, head_size)
    else:
        query = torch.randn(num_tokens, num_heads, head_size, generator=g).to(dtype)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    if kv_interleaved:  # one [num_blocks, 2, ...] tensor, K and V as strided views of it
        kv = torch.randn(num_blocks, 2, *cache_shape[1:], generator=g).to(DEVICE, dtype)  # views made there
        key_cache, value_cache = kv[:, 0], kv[:, 1]
    else:
        key_cache = torch.randn(cache_shape, generator=g).to(dtype)
        value_cache = torch.randn(cache_shape, generator=g).to(dtype)
    query_start_loc = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    tensors = (query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
               query_start_loc)
    return tuple(t.to(DEVICE) for t in tensors)


# (q_lens, seq_lens): q_len 1 is decode; q_len == seq_len a first prefill chunk; else a later chunk.
BATCHES = {
    "decode": ([1, 1, 1, 1], [1, 37, 16, 70]),  # seq_len 1, mid-block, block-aligned, several tiles
    "chunked_mix": ([1, 5, 20, 3], [40, 18, 20, 67]),
    "prefill_only": ([23], [23]),
    "graph_padding": ([2, 1, 0, 0], [9, 33, 0, 0]),  # trailing q_len 0 sequences write nothing
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (num_heads, num_kv_heads, head_size)
HEADS = [(4, 2, 32), (2, 2, 40), (6, 2, 16), (8, 1, 16)]  # GQA; MHA with head_size 40; 3 and 8 per kv head


def _run_and_compare(batch: Batch, dtype: torch.dtype, kernel=paged_attention) -> None:
    query = batch[0]
    scale = query.shape[-1] ** -0.5
    expected = paged_attention_ref(*batch, scale)
    out = torch.full_like(query, float("nan"), memory_format=torch.contiguous_format)
    kernel(out, *batch, scale)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_matches_reference(batch_name: str, dtype: torch.dtype) -> None:
    q_lens, seq_lens = BATCHES[batch_name]
    _run_and_compare(make_batch(q_lens, seq_lens, 4, 2, 32, 16, dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("batch_name", list(BATCHES))
def test_native_baseline_matches_reference(batch_name: str, dtype: torch.dtype) -> None:
    """The speed baseline (op.native: batched SDPA over gathered pages) computes the same attention, and traces as one
    graph: no host sync, so it can be timed under CUDA-graph capture and torch.compile."""
    batch = make_batch(*BATCHES[batch_name], num_heads=4, num_kv_heads=2, head_size=32, block_size=16, dtype=dtype)
    scale = batch[0].shape[-1] ** -0.5
    expected = paged_attention_ref(*batch, scale)
    torch._dynamo.reset()
    traced = torch.compile(paged_attention_native, backend="eager", fullgraph=True)
    torch.testing.assert_close(traced(*batch, scale), expected, atol=TOL[dtype][0], rtol=TOL[dtype][1])


@pytest.mark.parametrize("num_heads, num_kv_heads, head_size", HEADS)
def test_head_layouts(num_heads: int, num_kv_heads: int, head_size: int) -> None:
    dtype = torch.float16
    q_lens, seq_lens = BATCHES["chunked_mix"]
    _run_and_compare(make_batch(q_lens, seq_lens, num_heads, num_kv_heads, head_size, 16, dtype), dtype)


@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_block_sizes(block_size: int) -> None:
    dtype = torch.float32
    _run_and_compare(make_batch([1, 4], [45, 9], 4, 2, 32, block_size, dtype, seed=1), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_strided_views(dtype: torch.dtype) -> None:
    """Query sliced from a fused qkv output; K/V as views of one interleaved [num_blocks, 2, ...] cache."""
    q_lens, seq_lens = BATCHES["chunked_mix"]
    batch = make_batch(q_lens, seq_lens, 4, 2, 32, 16, dtype, kv_interleaved=True, query_in_qkv=True)
    assert not batch[0].is_contiguous() and not batch[1].is_contiguous()
    _run_and_compare(batch, dtype)


def test_empty_batch() -> None:
    query, key_cache, value_cache, *_ = make_batch([1], [5], 4, 2, 32, 16, torch.float16)
    out = torch.empty(0, 4, 32, dtype=torch.float16, device=DEVICE)
    empty_i32 = torch.empty(0, 1, dtype=torch.int32, device=DEVICE)
    paged_attention(out, query[:0], key_cache, value_cache, empty_i32, empty_i32[:, 0],
                    torch.zeros(1, dtype=torch.int32, device=DEVICE), 0.1)
    assert paged_attention_ref(query[:0], key_cache, value_cache, empty_i32, empty_i32[:, 0],
                               torch.zeros(1, dtype=torch.int32, device=DEVICE), 0.1).shape == (0, 4, 32)


def test_broken_variant_fails() -> None:
    """Attending over whole blocks is caught on lengths that end mid-block and missed on aligned ones."""
    dtype = torch.float32
    q_lens, seq_lens = BATCHES["decode"]
    with pytest.raises(AssertionError, match="Mismatched elements"):
        _run_and_compare(make_batch(q_lens, seq_lens, 4, 2, 32, 16, dtype), dtype, kernel=attends_whole_blocks)
    with pytest.raises(AssertionError, match="Mismatched elements"):
        _run_and_compare(make_batch([5, 1], [18, 35], 4, 2, 32, 16, dtype), dtype, kernel=attends_whole_blocks)
    _run_and_compare(make_batch([1, 16], [16, 32], 4, 2, 32, 16, dtype), dtype, kernel=attends_whole_blocks)

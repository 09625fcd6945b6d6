"""Paged attention for decode and chunked-prefill batches (vLLM's varlen layout, flash KV-cache layout).

Sequence s owns query rows query_start_loc[s] : query_start_loc[s + 1] (q_len of them: 1 for decode,
more for a prefill chunk) and a context of seq_len = seq_lens[s] tokens, the last q_len of which are its
new tokens. Query row i of s sits at absolute position seq_len - q_len + i and attends, causally, to
positions 0 .. that position, read from the KV cache through the sequence's block table:

    out[t, h] = softmax(scale * q[t, h] . K[:pos+1, h // (num_heads // num_kv_heads)]) @ V[...]

Layout follows vLLM's Triton unified attention: one program per (query block of one sequence, kv head),
the BLOCK_Q query tokens times the num_heads / num_kv_heads query heads of that kv head stacked into
the BLOCK_M rows of one tl.dot, so GQA reads each K/V tile once per kv head. An online softmax in fp32
walks the context in tiles of TILE positions (the tutorial 06 recurrence, in exp2). The grid depends on
shapes only: num_tokens // BLOCK_Q + num_seqs query blocks cover every sequence's blocks, whatever the
split; each program finds its sequence by a binary search of query_start_loc. No host sync, no
allocation: the launcher is CUDA-graph capturable.

Inputs must satisfy (the kernel does not check; breaking one reads wrong memory or gives wrong rows):
  - query, out: [num_tokens, num_heads, head_size], one dtype (fp16, bf16 or fp32); the last dim
    contiguous is not required (all strides are passed).
  - key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size], query's dtype; any strides
    (e.g. views of one [num_blocks, 2, ...] tensor).
  - num_heads % num_kv_heads == 0; query head h uses kv head h // (num_heads // num_kv_heads).
  - query_start_loc: int32 [num_seqs + 1], query_start_loc[0] == 0, non-decreasing,
    query_start_loc[num_seqs] == num_tokens (rows past it would be left unwritten).
  - seq_lens: int32 [num_seqs]; q_len <= seq_len <= max_blocks_per_seq * block_size. A sequence with
    q_len == 0 (CUDA-graph padding) writes nothing.
  - block_tables: int32 [num_seqs, max_blocks_per_seq]; the first cdiv(seq_len, block_size) entries of
    row s are valid block ids (< num_blocks), distinct across the whole batch; later entries are never
    read. Cache slots at positions >= seq_len may hold anything: they are never attended to.
"""

import math
import os

import torch
import triton
import triton.language as tl

from kernels.host import next_power_of_2

# KV positions per inner iteration (independent of the cache's block_size; each position looks up its
# own block). 32 keeps the interpreter's iteration count low and is a reasonable tile on an H200.
TILE = 32


@triton.jit
def _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence s whose first query block, query_start_loc[s] // BLOCK_Q + s, is <= q_block."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale, num_seqs, head_size, block_size,
    so_t, so_h, so_d, sq_t, sq_h, sq_d,
    sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d, sbt,
    QUERIES_PER_KV: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_PAD: tl.constexpr,
    TILE: tl.constexpr, DOT: tl.constexpr,
):
    q_block_global = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return  # a spare program of the shape-only grid
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    # Row r: query token q_block * BLOCK_Q + r // G of this sequence, query head kv_head * G + r % G.
    rows = tl.arange(0, BLOCK_M)
    q_pos = q_block * BLOCK_Q + rows // QUERIES_PER_KV
    head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_ok = (rows < BLOCK_Q * QUERIES_PER_KV) & (q_pos < q_len)
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < head_size
    # int64: token * stride and block id * block stride overflow int32 on large batches and caches.
    token = (q_start + q_pos).to(tl.int64)
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + token[:, None] * sq_t + head[:, None] * sq_h + d[None, :] * sq_d, mask=q_mask, other=0.0)
    q = q.to(DOT)
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp: log2(e) folded into the scale

    # A query at absolute position p sees keys 0..p. Every row (padding rows too) sees key 0, which is
    # in the first tile, so the running max is finite after it: no -inf - -inf = NaN later.
    causal_limit = context_len + q_pos
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)  # this block's last query + 1
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * sbt
    for start in range(0, kv_end, TILE):
        kv = start + tl.arange(0, TILE)
        kv_ok = kv < kv_end  # never past seq_len: later slots of the last block hold stale data
        blk = tl.load(bt_row + kv // block_size, mask=kv_ok, other=0).to(tl.int64)
        slot = kv % block_size
        k = tl.load(k_ptr + (blk * sk_b + slot * sk_s + kv_head * sk_h)[None, :] + d[:, None] * sk_d,
                    mask=d_ok[:, None] & kv_ok[None, :], other=0.0)
        s = tl.dot(q, k.to(DOT), input_precision="ieee") * qk_scale
        s = tl.where((kv[None, :] <= causal_limit[:, None]) & kv_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (blk * sv_b + slot * sv_s + kv_head * sv_h)[:, None] + d[None, :] * sv_d,
                    mask=kv_ok[:, None] & d_ok[None, :], other=0.0)
        # P is rounded to the cache dtype for the P @ V dot (as flash attention does on tensor cores).
        p = p.to(v_ptr.dtype.element_ty).to(DOT)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(DOT), input_precision="ieee")
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(out_ptr + token[:, None] * so_t + head[:, None] * so_h + d[None, :] * so_d,
             acc.to(out_ptr.dtype.element_ty), mask=q_mask)


def dot_dtype(dtype: torch.dtype, device: torch.device):
    """The tl.dot operand dtype for `dtype` tensors on `device`.

    On a GPU the dots run on the inputs' dtype (fp16/bf16 tensor cores; fp32 with input_precision
    "ieee", so an fp32 run matches an fp32 reference: tf32 would cost ~1e-3 relative). CPU tensors run in
    Triton's interpreter (as does anything under TRITON_INTERPRET=1), whose dot is numpy's matmul on the
    raw storage: bf16 is stored as uint16 there, so a bf16 dot multiplies bit patterns. There bf16
    operands are widened to fp32, which is exact (a bf16 product fits in fp32): results match a GPU's
    bf16 dot up to summation order.
    """
    if dtype == torch.bfloat16 and (device.type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"):
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def paged_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> None:
    """Write causal paged attention of `query` over the cache into `out`. One launch, no allocation."""
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    group = num_heads // num_kv_heads
    # At least 16 rows for tl.dot; BLOCK_Q query tokens share one program's K/V tiles.
    block_m = max(16, next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        scale, num_seqs, head_size, block_size,
        *out.stride(), *query.stride(), *key_cache.stride(), *value_cache.stride(), block_tables.stride(0),
        QUERIES_PER_KV=group, BLOCK_Q=block_q, BLOCK_M=block_m,
        HEAD_PAD=max(16, next_power_of_2(head_size)), TILE=TILE,
        DOT=dot_dtype(query.dtype, query.device),
        num_warps=4,
    )


def _sequences(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc):
    """Per sequence with query tokens: its token rows (q0, q1), its K and V gathered through its block table
    ([seq_len, kv_heads, head_size], the cache's dtype), and the positions of its query tokens (causal masks)."""
    _, block_size, num_kv_heads, head_size = key_cache.shape
    starts = query_start_loc.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        q0, q1 = starts[s], starts[s + 1]
        if q1 == q0:
            continue
        blocks = block_tables[s, : math.ceil(seq_len / block_size)].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_size)[:seq_len]
        v = value_cache[blocks].reshape(-1, num_kv_heads, head_size)[:seq_len]
        yield q0, q1, k, v, torch.arange(seq_len - (q1 - q0), seq_len, device=query.device)


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Gather each sequence's K/V through its block table, causal softmax attention in fp32, rounded to
    query's dtype (like vLLM's ref_paged_attn, but without rounding the probabilities). Rows no
    sequence owns are 0."""
    group = query.shape[1] // key_cache.shape[2]
    out = torch.zeros_like(query)
    for q0, q1, k, v, q_abs in _sequences(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc):
        k, v = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[q0:q1].float(), k) * scale
        hidden = torch.arange(k.shape[0], device=query.device)[None, :] > q_abs[:, None]
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out


def paged_attention_native(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The plan's op.native: attention as PyTorch runs it without a custom kernel, in query's dtype: each query
    token's K/V gathered through its sequence's block table, then one batched torch scaled_dot_product_attention
    (GQA, keys up to the token's position). Everything stays on the device (no host loop over sequences), so it runs
    under CUDA-graph capture and torch.compile. A decode batch gathers each sequence's pages once; a chunked-prefill
    batch gathers them once per query token, a cost the page's bounds show. The reference's fp32 einsums are the
    accuracy oracle, not a speed baseline."""
    num_tokens = query.shape[0]
    ends = query_start_loc[1:].long()
    tokens = torch.arange(num_tokens, device=query.device)
    seq = torch.searchsorted(ends, tokens, right=True)  # the sequence each token belongs to; num_seqs: none
    owned = seq < ends.shape[0]
    seq = seq.clamp(max=ends.shape[0] - 1)
    position = seq_lens.long()[seq] - (ends[seq] - tokens)  # the token's position in its sequence
    blocks = block_tables.long()[seq]  # [num_tokens, max_blocks_per_seq]; padding holds a valid block id
    # [num_tokens, kv_heads, keys, head_size]
    k = key_cache[blocks].flatten(1, 2).transpose(1, 2)
    v = value_cache[blocks].flatten(1, 2).transpose(1, 2)
    visible = torch.arange(k.shape[2], device=query.device)[None, :] <= position[:, None]
    o = torch.nn.functional.scaled_dot_product_attention(query[:, :, None], k, v, attn_mask=visible[:, None, None],
                                                         scale=scale, enable_gqa=True)
    return torch.where(owned[:, None, None], o[:, :, 0], 0).to(query.dtype)

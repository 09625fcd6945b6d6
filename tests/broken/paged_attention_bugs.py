"""Deliberately broken paged_attention variants: the harness must catch each.

Same signature as `kernels.paged_attention.paged_attention`
(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale) -> None; each
carries exactly ONE bug, named in its docstring. The kernels are copies of the real one with that bug.
"""

import torch
import triton
import triton.language as tl

from kernels.paged_attention import TILE, _find_seq, dot_dtype


@triton.jit
def _whole_blocks_kernel(
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
        return
    # BUG: the context is taken to fill its last block: seq_len rounded up to whole blocks, so the
    # stale slots past seq_len are attended to (and the new tokens' positions shift with it). Reads stay
    # inside the sequence's blocks, so nothing faults.
    seq_len = tl.cdiv(tl.load(seq_lens_ptr + seq), block_size) * block_size
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_pos = q_block * BLOCK_Q + rows // QUERIES_PER_KV
    head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_ok = (rows < BLOCK_Q * QUERIES_PER_KV) & (q_pos < q_len)
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < head_size
    token = (q_start + q_pos).to(tl.int64)
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + token[:, None] * sq_t + head[:, None] * sq_h + d[None, :] * sq_d, mask=q_mask, other=0.0)
    q = q.to(DOT)
    qk_scale = scale * 1.4426950408889634

    causal_limit = context_len + q_pos
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * sbt
    for start in range(0, kv_end, TILE):
        kv = start + tl.arange(0, TILE)
        kv_ok = kv < kv_end
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
        p = p.to(v_ptr.dtype.element_ty).to(DOT)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(DOT), input_precision="ieee")
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(out_ptr + token[:, None] * so_t + head[:, None] * so_h + d[None, :] * so_d,
             acc.to(out_ptr.dtype.element_ty), mask=q_mask)


def attends_whole_blocks(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> None:
    """Bug: ignores seq_len within the last block (attends over whole blocks): wrong whenever a
    sequence's length is not a multiple of block_size; right when every length ends on a block edge."""
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    group = num_heads // num_kv_heads
    block_m = max(16, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _whole_blocks_kernel[grid](
        out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        scale, num_seqs, head_size, block_size,
        *out.stride(), *query.stride(), *key_cache.stride(), *value_cache.stride(), block_tables.stride(0),
        QUERIES_PER_KV=group, BLOCK_Q=block_q, BLOCK_M=block_m,
        HEAD_PAD=max(16, triton.next_power_of_2(head_size)), TILE=TILE,
        DOT=dot_dtype(query.dtype, query.device),
        num_warps=4,
    )

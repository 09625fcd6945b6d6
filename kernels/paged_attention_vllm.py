"""vLLM's TRITON_ATTN kernel as a benchmark baseline of the paged-attention plan: `unified_attention`
(vllm/v1/attention/ops/triton_unified_attention.py, one signature in vLLM 0.26 and 0.32), called as
TritonAttentionImpl.forward calls it (vllm/v1/attention/backends/triton_attn.py), on the plan's own tensors. The plan's
cache layout, [num_blocks, block_size, num_kv_heads, head_size], is TRITON_ATTN's own view of vLLM's KV cache, and
block_tables, seq_lens and query_start_loc are the int32 tensors vLLM hands it.

`triton_attn_inputs` (the plan's `prepare`) does once per input set what vLLM does outside the attention call: the
batch's longest query and context are host integers of vLLM's scheduler metadata (read here from the tensors: a host
sync, kept out of the timed call as vLLM keeps it out), the decode path's split-softmax buffers are allocated once as
TritonAttentionMetadataBuilder allocates them, the k/v descales are the unquantized cache's 1.0, and the block table
is widened as vLLM's is wide (below). `triton_attn` is the timed call.

vLLM is imported where it is called, so this module imports without it. Where vLLM is not installed, or runs no Triton
kernel on this machine (its CPU build replaces Triton with a stand-in: Triton has no CPU backend there), the prepare
raises saying so, and the benchmark records the baseline as not run with that reason.
"""

import torch

# vLLM's block table rows are max_model_len wide, and its kernel reads a tile's block ids without a mask (tiles of up to
# 128 positions): the plan's rows, as long as their longest sequence, are widened by that many positions' entries,
# each the row's last (a valid id), so the last tile's reads stay inside the table.
WIDEST_TILE = 128


def _vllm_runs_triton() -> None:
    """RuntimeError where vLLM cannot run its Triton kernels here."""
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError as exc:
        raise RuntimeError(f"vLLM is not installed here ({type(exc).__name__}: {exc}): TRITON_ATTN is vLLM's") from None
    if not HAS_TRITON:
        raise RuntimeError("vLLM runs no Triton kernel on this machine (vllm.triton_utils replaces Triton with a "
                           "stand-in where it has no GPU backend): TRITON_ATTN runs on a GPU")


def triton_attn_inputs(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                       scale: float) -> dict:
    """unified_attention's arguments, by name, for the plan's call, as TritonAttentionImpl.forward passes them for a
    causal decoder layer over an unquantized cache (no sliding window, soft cap, ALiBi, sinks or output scale)."""
    _vllm_runs_triton()
    from vllm.v1.attention.backends.triton_attn import MIN_LAUNCH_GRID_SIZE_2D, NUM_PAR_SOFTMAX_SEGMENTS

    num_heads, head_size = query.shape[1], query.shape[2]
    num_seqs, num_kv_heads = seq_lens.shape[0], key_cache.shape[2]
    # The builder's threshold below which a decode batch takes the split-softmax (3D) path. Under FULL_AND_PIECEWISE
    # vLLM moves it to the nearest CUDA-graph capture size, which vLLM's default sizes hold for 1, 2, 4 and 8 KV heads.
    threshold = MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
    segments = NUM_PAR_SOFTMAX_SEGMENTS
    f32 = {"dtype": torch.float32, "device": query.device}
    one = torch.ones((), **f32)  # the layer's _k_scale and _v_scale for an unquantized cache
    block_size = key_cache.shape[1]
    extra = block_tables[:, -1:].expand(num_seqs, -(-WIDEST_TILE // block_size))
    table = torch.cat([block_tables, extra], dim=1)
    return {
        "q": query, "k": key_cache, "v": value_cache, "out": out,
        "cu_seqlens_q": query_start_loc, "seqused_k": seq_lens, "block_table": table,
        "max_seqlen_q": int((query_start_loc[1:] - query_start_loc[:-1]).max()), "max_seqlen_k": int(seq_lens.max()),
        "softmax_scale": float(scale), "causal": True, "window_size": (-1, -1), "softcap": 0,
        "q_descale": None, "k_descale": one.expand(num_seqs, num_kv_heads),
        "v_descale": one.expand(num_seqs, num_kv_heads),
        "seq_threshold_3D": threshold, "num_par_softmax_segments": segments,
        "softmax_segm_output": torch.empty(threshold, num_heads, segments, 1 << (head_size - 1).bit_length(), **f32),
        "softmax_segm_max": torch.empty(threshold, num_heads, segments, **f32),
        "softmax_segm_expsum": torch.empty(threshold, num_heads, segments, **f32),
    }


def triton_attn(**inputs) -> None:
    """The timed call: vLLM's unified_attention on what triton_attn_inputs prepared; writes `out`."""
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    unified_attention(**inputs)

"""Deliberately broken wrappers around the bundled paged attention, each ONE bug in how it reads vLLM's batch: the
attention_backend route items (tests/test_attention_backend.py) must fail each, saying where the rows differ.

Same signature as `kernels.paged_attention.paged_attention`; each passes the real kernel one wrong batch tensor.
"""

import torch

from kernels.paged_attention import paged_attention


def block_table_off_by_one(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale):
    """Bug: page i of a sequence is read from its block table's entry i + 1 (the last entry repeats), so every
    position past the first page, and the first page too once a second exists, reads another sequence's block or an
    unused one."""
    shifted = torch.cat([block_tables[:, 1:], block_tables[:, -1:]], dim=1)
    paged_attention(out, query, key_cache, value_cache, shifted, seq_lens, query_start_loc, scale)


def context_one_short(out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale):
    """Bug: each sequence's length is taken one short, so its last key is never attended to and every query's
    position shifts by one."""
    paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens - 1, query_start_loc, scale)

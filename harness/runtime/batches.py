"""The sequences behind one drawn call, as vLLM's scheduler forms them: what structured inputs are built from.

A decode batch is one new token per running sequence, each deep into its context; a prefill batch is a
few prompts from position 0; a chunked-prefill batch is decode tokens plus one prompt chunk that starts
part-way into its prompt. From the sequences follow positions (RoPE), the lengths and start offsets a
varlen attention reads, and a paged KV cache's block tables (distinct valid block ids, enough blocks
for each context) and slot mapping. Everything is derived from the example's seed, so hypothesis
shrinks and replays it like any other draw.

Plain Python: the tensors are built from these lists in harness.runtime.inputs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Batch:
    q_lens: tuple[int, ...]  # new tokens per sequence (1 for decode)
    context_lens: tuple[int, ...]  # tokens of each sequence after this step (its seq_len)
    block_size: int
    num_blocks: int  # every sequence's blocks, and one spare: the id unused table entries point at
    max_blocks_per_seq: int
    tables_seed: int  # what the block ids are shuffled from (block_tables)

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    def symbols(self) -> dict[str, int]:
        return {"num_seqs": self.num_seqs, "num_blocks": self.num_blocks,
                "max_blocks_per_seq": self.max_blocks_per_seq}

    @cached_property
    def block_tables(self) -> tuple[tuple[int, ...], ...]:
        """Per sequence, distinct block ids padded to max_blocks_per_seq with the spare id. Drawn when first asked
        for: shuffling the block ids of a long decode batch is most of the cost of drawing it, and most ops read
        no block table."""
        ids = list(range(self.num_blocks))
        random.Random(self.tables_seed).shuffle(ids)
        spare, width = ids.pop(), self.max_blocks_per_seq
        tables, at = [], 0
        for c in self.context_lens:
            n = -(-c // self.block_size)
            tables.append(tuple(ids[at:at + n]) + (spare,) * (width - n))
            at += n
        return tuple(tables)

    def positions(self) -> list[int]:
        """Each new token's position: the last q_len positions of its sequence."""
        return [p for q, c in zip(self.q_lens, self.context_lens) for p in range(c - q, c)]

    def query_start_loc(self) -> list[int]:
        out = [0]
        for q in self.q_lens:
            out.append(out[-1] + q)
        return out

    def slot_mapping(self) -> list[int]:
        """Where each new token's key and value are written: block id * block_size + offset in the block."""
        slots = []
        for q, c, table in zip(self.q_lens, self.context_lens, self.block_tables):
            for p in range(c - q, c):
                slots.append(table[p // self.block_size] * self.block_size + p % self.block_size)
        return slots


def _split(rng: random.Random, total: int, max_part: int, parts: int) -> list[int]:
    """`total` tokens as `parts` or more sequences (each at most `max_part`), at random cut points."""
    parts = min(total, max(parts, -(-total // max_part)))
    while True:
        cuts = sorted(rng.sample(range(1, total), parts - 1)) if parts > 1 else []
        lens = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
        if max(lens) <= max_part:
            return lens
        parts = min(total, parts + 1)


def draw_batch(phase: str, num_tokens: int, decode_tokens: int, seed: int, max_len: int, block_size: int) -> Batch:
    """The sequences of one call with `num_tokens` new tokens; contexts at most `max_len` tokens."""
    rng = random.Random(seed)
    max_len = max(max_len, 1)
    if phase == "decode":
        q_lens = [1] * num_tokens
        contexts = [rng.randint(1, max_len) for _ in q_lens]
    elif phase == "prefill":  # a few prompts, each from position 0
        q_lens = _split(rng, num_tokens, max_len, rng.randint(1, 4))
        contexts = list(q_lens)
    else:  # chunked prefill: decode tokens, then prompt chunks, the last starting part-way into its prompt
        chunks = _split(rng, num_tokens - decode_tokens, max_len, 1)
        q_lens = [1] * decode_tokens + chunks
        contexts = ([rng.randint(1, max_len) for _ in range(decode_tokens)] + chunks[:-1]
                    + [rng.randint(chunks[-1], max_len)])
    needed = [-(-c // block_size) for c in contexts]
    return Batch(tuple(q_lens), tuple(contexts), block_size, sum(needed) + 1, max(needed, default=1),
                 rng.getrandbits(64))

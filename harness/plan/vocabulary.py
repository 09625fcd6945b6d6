"""The plan language's words: the values of the matrix's axes, the numerics profiles, an argument's layouts, value
scales, inits and roles, the built-in size symbols, and the quantization granularities.

Plain Python with no pydantic, so that the pytest plugin's entry point (harness.plugin) can name the axes and
profiles without loading the plan model.
"""

import re

PHASES = ("prefill", "decode", "chunked_prefill")
# memcheck: eager calls under compute-sanitizer memcheck on a GPU (harness.runtime.memcheck), for memory safety.
GRAPH_MODES = ("eager", "cuda_graph", "torch_compile", "memcheck")
INTENTS = ("drop-in", "fusion", "new-algorithm", "quantization")
AXES = ("phase", "dtype", "tp", "graph_mode", "sm")
PROFILES = ("dev", "ci", "nightly")  # numerics profiles (hypothesis profiles harness-<name>)
LAYOUTS = ("contiguous", "strided")
VALUE_SCALES = ("normal", "tiny", "large", "outliers", "zero_rows")  # the value scales examples are drawn at
# Value initialisations by name. The structured ones come from the example's batch (harness.runtime.batches): positions
# as vLLM's scheduler forms them per phase, and a paged KV cache's block tables and lengths consistent with them.
INITS = ("normal", "around_one", "uniform", "zeros", "ones")
STRUCTURED_INITS = ("positions", "seq_lens", "query_start_loc", "block_tables", "slot_mapping")
# Parameterised inits: {uniform: [low, high]}, {integers: [low, high)} (bounds are size expressions),
# {cos_sin_cache: {base: B}} (RoPE's [max_position, rotary_dim] table).
PARAM_INITS = ("uniform", "integers", "cos_sin_cache")
GRANULARITIES = ("per_tensor", "per_token", "per_channel", "per_group")
ROLES = ("input", "output")
# NVIDIA compute capability (sm90) or an AMD CDNA target (gfx90a, gfx942, gfx950).
SM_PATTERN = re.compile(r"^(cpu|sm\d{2,3}|gfx9[0-9][0-9a-f])$")
SM_EXPECTED = "'cpu', 'smXY' (e.g. sm90) or an AMD target (gfx90a, gfx942, gfx950)"
# Symbols every plan gets for free: the phase decides the token count; the example's batch (harness.runtime.batches)
# decides the sequences and, for a paged KV cache, its blocks.
BUILTIN_SYMBOLS = ("num_tokens", "num_seqs", "num_blocks", "max_blocks_per_seq")

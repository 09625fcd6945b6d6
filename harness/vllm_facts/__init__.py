"""What the harness knows of vLLM as plain facts, the bottom layer (pyproject.toml's layer contract): the plan's
checks, results, decisions and pages read them, and they import nothing else of the harness (the plan types they
take appear in type hints only).

- names: the plan's route into vLLM, and every name and setting a deployment types;
- kernels: vLLM's compiled kernels as data, the schemas vLLM 0.26.0 registers them under, and whether a plan's
  arguments fit one; ir_tolerances: vLLM IR's default tolerances (both pinned copies: where vLLM is installed,
  harness.runtime.vllm_compiled reads its own and the tests check the copies against them);
- defaults: vLLM's own defaults per kind of switch, platform and profile;
- fusion_cases: the profiles a fusion pass is checked under;
- attention_layout: how vLLM's KV cache and metadata map onto an attention kernel's arguments.

What is vLLM's fact about one op (its compiled kernel and switch, the fusion that produces it) is the plan's own
`vllm:` section, not a table here: adding an op edits no harness module.
"""

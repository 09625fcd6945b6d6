"""Everything that knows vLLM, each module at the layer of the work it does (pyproject.toml's layer contract):

- the plan's vLLM side as names and settings (names), vLLM's compiled kernels as data and the schemas vLLM 0.26.0
  registers them under (kernels), vLLM's own defaults per platform and profile (defaults), the profiles a fusion
  pass is checked under (fusion_cases), how vLLM's KV cache and metadata map onto an attention kernel's arguments
  (attention_layout): plain Python beside the plan's model, which validates against them;
- the plugin generated for a plan (plugin_source, plugin_templates): plain Python beside the pages, which show it;
- vLLM's compiled kernels loaded and called (compiled): beside the runtime, which runs them as providers;
- the integration items (routes, fusion, engine, engine_probe; attention_backend above routes, whose plugin loading
  it uses): vLLM imported, the plan's kernel put into it.

What is vLLM's fact about one op (its compiled kernel and switch, the fusion that produces it) is the plan's own
`vllm:` section, not a table here: adding an op edits no harness module.
"""

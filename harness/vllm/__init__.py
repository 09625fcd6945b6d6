"""vLLM in the loop: the integration items, which import vLLM and put the plan's kernel into it, one layer between
the plugin and the runtime (pyproject.toml's layer contract): routes (routes, plugin loading, dispatch checks),
fusion (vLLM's fusion passes per profile), engine and engine_probe (a running engine with the plugin),
attention_backend (the plugin's attention backend on vLLM's own KV cache), and plugin_source with plugin_templates/
(the plugin generated for a plan, which the pages show too).

vLLM's plain facts (names, kernel schemas, defaults, fusion profiles, the attention layout) are harness.vllm_facts,
below the plan; loading vLLM's compiled kernels is the runtime's (harness.runtime.vllm_compiled).
"""

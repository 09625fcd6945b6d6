"""How the op fits into vLLM: the high-level design (a Mermaid flowchart of the dispatch), the key interfaces (the
torch.library custom op and the vLLM plugin, with whether the plugin was verified), and the critical path (a
Mermaid sequence of one forward pass)."""

from __future__ import annotations

from harness.rendering.markdown import code, md, mm
from harness.rendering.plan_words import capture_sizes, custom_op_name, layer_class, layer_path, route_proof, \
    route_words
from harness.vllm_facts.attention_layout import ROUTE as ATTENTION_ROUTE, cache_words
from harness.vllm.plugin_source import ADAPTER_FUNCTIONS, render_plugin
from harness.vllm.op_source import custom_op_source
from harness.results.store import IntegrationRecord
from harness.plan.model import Plan
from harness.cells.status import Status
from harness.vllm_facts.names import ROUTE_KINDS, adapter_module, enable_setting, in_tree_flag, oot_flag, \
    plugin_entry_point, plugin_module_name, plugin_route, plugin_routes, provider_name, route_lacking, unsupported


CUDA_GRAPH_BOX = "CUDA graph: captured at the capture sizes, replayed (full for decode, piecewise for prefill)"

def design(plan: Plan, integration: dict | None = None) -> str:
    op = custom_op_name(plan)
    layer = layer_path(plan)
    layer_label = f"{layer_class(plan)} layer ({layer})" if layer else f"model layer calling {plan.op.name}"
    provider = provider_name(plan)
    g = ["flowchart TD", f'    caller["{mm("decoder layer in the model file")}"]',
         f'    layer["{mm(layer_label)}"]']
    route = plan.vllm.route
    lacking = route_lacking(plan, integration)
    if route is None or not ROUTE_KINDS[route].driven or lacking:
        # a route the harness does not drive (or none): its words only, no vLLM symbol the run did not check
        how = ROUTE_KINDS[route].words.split(" (")[0] if route else "no route named (vllm.route)"
        g += [f'    dispatch{{"{mm("route: " + how + " (not proven here)")}"}}',
              '    native["' + mm("vLLM's own path") + '"]']
        edges = ["    caller --> layer --> dispatch", "    dispatch --> customop", "    dispatch --> native"]
        g += [f'    customop[["{mm(op + ": opaque torch.library custom op + fake")}"]]',
              f'    kernel["{mm("kernel " + plan.op.kernel)}"]']
        where = (f"Where {code(plan.op.name)} would plug into vLLM ({md(plan.vllm.target)}, {route_words(plan)}; "
                 f"{route_proof(plan, None)}):") if route else \
            "The plan names no route into vLLM (`vllm.route`), so nothing here names a vLLM symbol:"
        if lacking:
            where = (f"The plan's route ({code(route)}) does not exist in the vLLM its integration items ran "
                     f"against: {md(lacking)}. Nothing here draws it:")
        return "\n".join(["## High-level design", "", where, "", "```mermaid", *g, *edges, "    customop --> kernel",
                          "```"])
    if route == ATTENTION_ROUTE:
        return _attention_design(plan, op, g)
    flag = oot_flag(plan)
    if route == "ir":
        g += [f'    dispatch{{"{mm("vLLM IR dispatch: vllm.ir.ops." + plan.vllm.ir_op + ", priority per platform")}"}}',
              f'    provider["{mm("provider " + provider + " (register_impl)")}"]',
              f'    native["{mm("native provider: forward_native")}"]']
        edges = ["    caller --> layer --> dispatch",
                 f'    dispatch -->|"{mm("priority: " + provider)}"| provider --> customop',
                 f'    dispatch -->|"{mm("fallback: native")}"| native --> inductor']
    elif route == "quantization":
        g += [f'    dispatch{{"{mm("quantization config --quantization " + provider + ": get_quant_method")}"}}',
              f'    provider["{mm("PluginLinearMethod.apply (LinearMethodBase)")}"]',
              f'    native["{mm("another quantization: its own linear method")}"]']
        edges = ["    caller --> layer --> dispatch",
                 f'    dispatch -->|"{mm("--quantization " + provider)}"| provider --> customop',
                 f'    dispatch -->|"{mm("another method")}"| native --> inductor']
    else:
        g += [f'    dispatch{{"{mm("CustomOp dispatch: custom_ops " + flag)}"}}',
              f'    provider["{mm("forward_cuda of the register_oot subclass")}"]',
              f'    native["{mm("forward_native")}"]']
        edges = ["    caller --> layer --> dispatch",
                 f'    dispatch -->|"{mm("enabled")}"| provider --> customop',
                 f'    dispatch -->|"{mm("disabled (default)")}"| native --> inductor']
    g += [f'    customop[["{mm(op + ": opaque torch.library custom op + fake")}"]]',
          f'    kernel["{mm("kernel " + plan.op.kernel)}"]',
          f'    inductor["{mm("Inductor: traces and fuses the native code")}"]',
          f'    dynamo["{mm("torch.compile (Dynamo): one opaque node, shapes from the fake")}"]',
          f'    cudagraph["{mm(CUDA_GRAPH_BOX)}"]']
    g += edges + ["    customop --> kernel", "    dynamo -.-> customop", "    dynamo -.-> inductor",
                  "    cudagraph -.-> kernel"]
    return "\n".join(["## High-level design", "",
                      f"Where {code(plan.op.name)} plugs into vLLM ({md(plan.vllm.target)}, route "
                      f"{code(plan.vllm.route)}):",
                      "", "```mermaid", *g, "```"])


def interfaces(plan: Plan, integration: dict) -> str:
    lines = ["## Key interfaces", "",
             f"The kernel as an opaque {code('torch.library')} custom op, so torch.compile keeps it as one node and "
             "CUDA graphs capture its launch (schema from the plan; outputs and mutated inputs declared):", "",
             "```python", *custom_op_source(plan), "```", ""]
    # The vLLM registration: the plugin module the integration items load through vLLM's own plugin loader.
    lines += ["", plugin_markdown(plan, integration)]
    return "\n".join(lines)


def _attention_design(plan: Plan, op: str, g: list[str]) -> str:
    """The attention_backend route's flowchart: vLLM's backend selection, the plugin's impl calling the kernel."""
    g += [f'    dispatch{{"{mm("attention backend selection: --attention-backend CUSTOM (a CPU: over CPU_ATTN)")}"}}',
          f'    provider["{mm("PluginAttentionImpl.forward: vLLM KV cache views + metadata")}"]',
          f'    native["{mm("vLLM own backend (FLASH_ATTN, TRITON_ATTN, CPU_ATTN, ...)")}"]',
          f'    kernel["{mm("kernel " + plan.op.kernel)}"]',
          f'    dynamo["{mm("torch.compile: vllm.unified_attention_with_output, one opaque splitting op")}"]',
          f'    cudagraph["{mm(CUDA_GRAPH_BOX)}"]']
    edges = ["    caller --> layer --> dispatch", f'    dispatch -->|"{mm("CUSTOM")}"| provider --> kernel',
             f'    dispatch -->|"{mm("another backend")}"| native', "    dynamo -.-> provider",
             "    cudagraph -.-> kernel"]
    return "\n".join(["## High-level design", "",
                      f"Where {code(plan.op.name)} plugs into vLLM ({md(plan.vllm.target)}, route "
                      f"{code(plan.vllm.route)}; {md(cache_words(plan))}):", "", "```mermaid", *g, *edges, "```"])


def plugin_markdown(plan: Plan, integration: dict[str, IntegrationRecord] | None = None) -> str:
    """The plugin as the report shows it: entry point, module, how to select it, and whether it was verified."""
    why = unsupported(plan) or md(route_lacking(plan, integration))
    if why:
        return f"No vLLM plugin: {why}.\n"
    route = plugin_route(plan)
    functions = ", ".join(code(ADAPTER_FUNCTIONS[r]) for r in plugin_routes(plan))
    side = (f"no op-specific vLLM side: the plugin maps vLLM's tensors onto the kernel's by the plan's shapes "
            f"({md(cache_words(plan))})" if route == ATTENTION_ROUTE else
            f"the op's vLLM side is {code(adapter_module(plan))} ({functions}, and {code('vllm_layer')} for the "
            "integration items)")
    lines = [f"vLLM general plugin ({ROUTE_KINDS[route].words.split(' (')[0]} route), rendered from "
             f"the route's template; {side}. "
             "Entry point, in the pyproject.toml of the package that ships the kernel:", "",
             "```toml", plugin_entry_point(plan).rstrip(), "```", "",
             f"Module `{plugin_module_name(plan)}.py`:", "", "```python", render_plugin(plan).rstrip(), "```", "",
             f"Select it in a deployment: `{enable_setting(plan)}`."
             + (f" (`{in_tree_flag(plan)}` in `custom_ops` turns on vLLM's own kernel instead.)"
                if in_tree_flag(plan) else ""), ""]
    if integration is not None:
        loaded = ATTENTION_ROUTE if route == ATTENTION_ROUTE else "plugin"  # the items loading it by vLLM's loader
        plugin_items = {k: v for k, v in sorted(integration.items()) if k.startswith(f"vllm-{loaded}[")}
        passed = [k for k, v in plugin_items.items() if v.status == Status.PASSED]
        failed = [k for k, v in plugin_items.items() if v.status in (Status.FAILED, Status.XFAIL)]
        if failed:
            lines.append(f"Loading it through vLLM's plugin loader FAILED in {len(failed)} of {len(plugin_items)} "
                         f"items: {plugin_items[failed[0]].reason}")
        elif passed:
            what = ("vLLM's Attention layer ran the backend on vLLM's own KV cache and metadata, calling the kernel, "
                    "and matched vLLM's own backend and the reference" if route == ATTENTION_ROUTE else
                    "vLLM's layer called the kernel and matched the reference")
            lines.append(f"Verified: loaded through vLLM's plugin loader, {what} in {len(passed)} items "
                         f"({', '.join(passed)}).")
        else:
            lines.append("Not verified on any machine yet (vLLM not installed where the plan ran).")
        lines.append("")
    return "\n".join(lines)


def critical_path(plan: Plan) -> str:
    op = custom_op_name(plan)
    cs = capture_sizes(plan)
    call = f"{op}({', '.join(a.name for a in plan.args)})"
    sharded = max(plan.matrix["tp"]) > 1
    s = ["sequenceDiagram",
         f"    participant R as {mm('model runner')}",
         f"    participant G as {mm('CUDA graph / compiled model')}",
         *([f"    participant T as {mm('TP group (NCCL)')}"] if sharded else []),
         f"    participant L as {mm(layer_class(plan))}",
         f"    participant K as {mm(op)}"]

    def collectives_before():
        if not sharded:
            return []
        if plan.tp.sequence_parallel:
            return [f"    G->>T: {mm('reduce-scatter of the previous layer output (tokens split over ranks)')}"]
        if plan.tp.kind == "trivial":
            return [f"    G->>T: {mm('all-reduce of the row-parallel linear output, before the op')}",
                    f"    T-->>G: {mm('full hidden states, replicated on every rank')}"]
        shards = ", ".join(f"{n} dim {d}" for n, d, _ in plan.tp.shard)
        return [f"    Note over G,K: {mm('each rank holds its shard: ' + shards)}"]

    def collectives_after():
        if not sharded:
            return []
        out = []
        for name, how, dim in plan.tp.combine:
            if how == "gather":
                out.append(f"    G->>T: {mm(f'all-gather {name} on dim {dim}')}")
            elif how == "sum":
                out.append(f"    G->>T: {mm(f'all-reduce (sum) {name}')}")
        if plan.tp.sequence_parallel:
            out.append(f"    G->>T: {mm('all-gather of the tokens')}")
        return out

    def forward(how: str):
        return [*collectives_before(),
                f"    G->>L: {mm('forward(hidden states)')}",
                f"    L->>K: {mm(how + ': ' + call)}",
                f"    K-->>L: {mm(', '.join(plan.op.outputs) + ' written')}",
                f"    L-->>G: {mm('hidden states')}",
                *collectives_after()]

    s += [f"    Note over R,K: {mm(f'decode, up to {cs[-1]} tokens: full CUDA graph replay')}",
          f"    R->>G: {mm('copy inputs into static buffers, pad to the next capture size')}",
          f"    R->>G: {mm('replay')}",
          *forward("captured launch"),
          f"    G-->>R: {mm('outputs (the first num_tokens rows)')}",
          f"    Note over R,K: {mm('prefill and chunked prefill: piecewise torch.compile')}",
          f"    R->>G: {mm('run the compiled pieces (num_tokens dynamic)')}",
          *forward("opaque op call"),
          f"    G-->>R: {mm('outputs')}"]
    if not sharded:
        s.insert(len(s) - 1, f"    Note over G,K: {mm('TP 1 only: no collective')}")
    return "\n".join(["## Critical path", "", "One forward pass through the op:", "", "```mermaid", *s, "```"])

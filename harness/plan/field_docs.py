"""Every field of a plan file, in words: the one text the README's field table and the JSON Schema's
`markdownDescription` (what an editor shows on hover, beside the terse `description` an error says was expected)
are made from. `python -m harness fields` prints the table; tests/test_architecture.py checks the README holds it.
Plain data: nothing here imports the harness's other layers (the kinds of implementation are described beside
their own fields, harness.plan.implementations).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.plan.implementations import BUILTIN, KINDS


@dataclass(frozen=True)
class FieldDoc:
    """One row of the table: the fields it names (as a user writes them), what they say, an example, and where the
    text goes in the JSON Schema: (definition, property) pairs, the definition None for the plan file itself, the
    property None for the definition as a whole."""

    fields: str
    says: str
    example: str
    targets: tuple[tuple[str | None, str | None], ...]


FIELD_DOCS = (
    FieldDoc(
        '`op.name`, `op.intent`, `op.description`',
        "the op; drop-in | fusion | new-algorithm | quantization; what it computes, in words (the page's "
        'problem breakdown)',
        '`name: rms_norm`, `intent: fusion`',
        (('Op', 'name'), ('Op', 'intent'), ('Op', 'description'))),
    FieldDoc(
        '`op.kernel`, `op.reference`',
        'import paths: the kernel under test (writes outputs into arguments or returns them) and its '
        'functional PyTorch reference, the accuracy oracle, which may compute in fp32 (returns `op.outputs` in '
        "order). vLLM's own compiled kernel is not named here but in `implementations.vllm` and run beside the "
        'kernel (a `vllm:` path here is refused, saying so). A `@triton.jit` function is '
        'refused (name the Python function that launches it), and so is a reference annotated to return None '
        '(an in-place function: the kernel named where the reference belongs)',
        '`kernel: kernels.rms_norm:rms_norm`',
        (('Op', 'kernel'), ('Op', 'reference'))),
    FieldDoc(
        '`op.native`',
        "what vLLM runs without the custom op, in the activation dtype (the layer's `forward_native`; for a "
        'quantized linear, dequantize to the activation dtype and `F.linear`), called exactly like the '
        'reference: the `native` and `compiled` baselines time it (default: the reference). Name it where the '
        'reference computes otherwise: a plan whose reference multiplies matrices in fp32 on 16-bit '
        'activations and names no native is warned at `op.reference` (rule below)',
        '`native: kernels.int8_linear:int8_weight_only_linear_native`',
        (('Op', 'native'),)),
    FieldDoc(
        '`op.replaces`, `op.fake`, `op.generate`',
        'the vLLM layer it replaces; a torch.compile fake (else derived from the reference); a custom input '
        'generator `fn(values, *, plan, cell, example, sizes, generator, device) -> {name: tensor}`; each '
        'checked against that call',
        '`generate: mypkg.inputs:my_batch`',
        (('Op', 'replaces'), ('Op', 'fake'), ('Op', 'generate'))),
    FieldDoc(
        '`op.args.<name>` (tensor)',
        'in call order: `shape` (sizes, symbols or expressions over them, `[]` for 0-d), `dtype` (`act` = the '
        "cell's dtype, `fp8` = the platform's fp8, or float32, float16, bfloat16, float64, int8, int32, int64, "
        'uint8, bool, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz), `layout` (contiguous, strided), `role` '
        '(input, output), `init`, `pad` (what CUDA-graph padding rows hold, default 0), `optional: true` (an '
        'input the kernel also takes as None: every cell draws examples with a value and without, and a '
        'minimal example says `name=None`), `ignorable` (why a correct kernel may leave the input unread in '
        'some calls: a generated wrong kernel ignoring it is then a warning at validate, not a refusal), '
        '`value_scales` (one or a list of the value scales drawn for it, '
        'default all of normal, tiny, large, outliers, zero_rows; at another scale it is filled at the normal '
        "scale: attention's query and keys stay at a model's scale, as values of 100 give logits of 1e4). A "
        'kernel parameter defaulting to None that the plan leaves out, pins to `null` though the reference takes '
        'it too, or never draws as None is warned',
        '`query: {shape: [num_tokens, num_heads*head_size], dtype: act, layout: [contiguous, strided]}`, '
        '`scale_ub: {shape: [1], dtype: float32, init: {uniform: [0.5, 4.0]}, optional: true}`',
        (('TensorArg', None),)),
    FieldDoc(
        '`init`',
        'normal (with the drawn value scale), around_one, uniform, zeros, ones; `{uniform: [lo, hi]}`, '
        "`{integers: [lo, hi)}` with size expressions as bounds (at least two integers, within the tensor's "
        "dtype); `{cos_sin_cache: {base: B}}` (B above 1); from the example's batch: positions, seq_lens, "
        'query_start_loc, block_tables, slot_mapping',
        '`weight: {shape: [n, k], dtype: int8, init: {integers: [-127, 128]}}`',
        (('TensorArg', 'init'),)),
    FieldDoc(
        '`op.args.<name>` (scalar)',
        "a constant, `null` (passed to the kernel as None, and to the reference only where its signature names "
        "it: `k_scale: null` states an argument only the kernel takes; where the reference takes it too and the "
        "kernel's parameter defaults to None, the run warns that no cell passes the op a value, at its line), or "
        '`{value: <size expression>}`',
        '`eps: 1.0e-6`, `scale_ub: null`, `head_size: {value: head_size}`',
        (('SizeArg', None),)),
    FieldDoc(
        '`op.outputs`, `op.mutates`',
        'the outputs compared (argument names or names for returned values); inputs the op may write (compared '
        'where `op.outputs` lists them too, else a scratch buffer: warned)',
        '`mutates: [query, key]`',
        (('Op', 'outputs'), ('Op', 'mutates'))),
    FieldDoc(
        '`op.sizes.<symbol>`',
        'the sizes to draw (plus odd, awkward ones unless `awkward: false`), with constraints `divides`, '
        '`at_most` (another symbol: every size of either must meet it with some size of the other, so a '
        'relation written the wrong way round is an error), `multiple_of`, `even`. Built in: num_tokens (from '
        'the phase) and, from the batch, num_seqs, num_blocks, max_blocks_per_seq',
        '`num_kv_heads: {values: [8, 2], divides: num_heads}`',
        (('Op', 'sizes'),)),
    FieldDoc(
        '`op.contract`',
        "the kernel's preconditions: `contiguous` (tensors), `row_stride_multiple_of` (tensor: N elements "
        'between rows), `multiple_of`, `at_least`, `at_most` (size symbol: N), `dtypes` (cell dtypes it '
        "supports), `why`. Nothing outside it is drawn (layouts, row padding, the plan's and the awkward sizes "
        'narrow to it), cells of other dtypes are excluded, benchmark shapes outside it are not timed, the '
        "report lists it, and the generated vLLM plugin's `supports_args` rejects calls outside it, so vLLM "
        "falls back. Sizes are the plan's symbols, before tensor-parallel sharding",
        '`contract: {contiguous: [x], multiple_of: {hidden: 8}, at_most: {hidden: 16384}, dtypes: [bf16, '
        'fp16], why: "16-byte loads"}`',
        (('Op', 'contract'),)),
    FieldDoc(
        '`op.accumulation`',
        'fp32 (the default) or input. With fp32, every fp16 and bf16 example on a GPU is also checked against '
        "an fp64 run of the reference: the kernel's error must be consistent with accumulating in fp32, "
        "compared with the fp32-accumulating reference's on the same inputs, per element and as a shift of "
        "whole rows (a 16-bit accumulator's mark: RMSNorm's variance summed in bf16 stays inside bf16's "
        'tolerance and fails here as `accumulation: the kernel shifts whole rows …`). What it can tell depends '
        'on `op.reduction`; the limits were calibrated on an H200 over correct and broken kernels '
        "(docs/calibration.md). Between what the reference's rounding explains and what correct kernels of the "
        'op\'s kind show, a cell records "inconclusive for this op" and is decided on its values; each cell '
        'keeps its statistics (`readings` in the results). On a CPU machine only `row_scale` ops are checked '
        '(other kinds record "not checked on a CPU machine": the interpreter\'s capped sizes reduce over too '
        'few elements). Rows under 64 elements or fewer than 8 usable rows are left to the tolerance',
        '`accumulation: fp32`',
        (('Op', 'accumulation'),)),
    FieldDoc(
        '`op.reduction`',
        "the op's kind of reduction, which says what the accumulation check can tell from a correct kernel's "
        "own roundings: `row_scale` (a reduction's result scales each output row: norms, per-token scales; "
        "fails past 4 sigma or 4x), `dot` (each output a dot product: GEMMs; fails past 4x the reference's "
        'element error), `weighted_sum` (softmax-weighted sums: attention, whose rounded probabilities can '
        'show more than a 16-bit accumulator: recorded, never failed), `unknown` (the default: fails only past '
        'what no correct kernel of any kind showed)',
        '`reduction: row_scale`',
        (('Op', 'reduction'),)),
    FieldDoc(
        '`matrix`',
        'the five axes: phase, dtype, tp, graph_mode, sm (cpu, smXY, or AMD gfx90a / gfx942 / gfx950)',
        '`tp: [1, 2, 4, 8]`',
        ((None, 'matrix'),)),
    FieldDoc(
        '`exclude`, `expect`',
        'axis values and a `why`; expect is strict (`status: fail`, the only one: such a cell that passes '
        'fails the run)',
        '`exclude: [{sm: [sm80], why: "no fp8 before sm89"}]`',
        ((None, 'exclude'), (None, 'expect'))),
    FieldDoc(
        '`tolerance`',
        'per cell dtype (fp32, fp16, bf16, fp8_e4m3fn, fp8_e4m3fnuz, int8) `{atol, rtol}` (`atol_of: max`: '
        "atol as a fraction of the output's largest magnitude, for reductions); `outputs.<name>` for one "
        'output. One an all-zero output meets (rtol 1 or more; with `atol_of: max`, atol + rtol 1 or more) is '
        "an error; one over 100x vLLM's default for its dtype, an `atol_of: max` above 0.1, or a dtype's "
        "looser than a less precise dtype's is warned",
        '`tolerance: {outputs: {scales: {atol: 0, rtol: 1.0e-6}}}`',
        ((None, 'tolerance'),)),
    FieldDoc(
        '`quantization.outputs.<name>`',
        'a quantized output, compared in its quantized domain (at most one step apart, on at most '
        '`max_step_fraction` of elements): its `scale` tensor and `granularity` (per_tensor, per_token, '
        "per_channel, per_group: the scale tensor's shape must hold it, `[1]` per tensor, `[num_tokens, 1]` "
        'per token); `quantization.max_step_fraction` a fraction of at most 0.5 (0.01 is 1%). An fp8 or int8 '
        'output not listed is warned: it is compared as numbers',
        '`out: {scale: scales, granularity: per_token}`',
        (('Quantization', 'outputs'),)),
    FieldDoc(
        '`op.paths`',
        "the kernel's size-selected code paths, `name: condition` over the size symbols, `num_tokens` and "
        '`act_bytes` (comparisons, `and`/`or`/`not`): each cell whose token range reaches a path checks the '
        'cheapest example past it (fewest elements) before hypothesis draws any, so a bug in a path random '
        "draws miss (a two-pass loop taken from 192 MiB) still fails. A cell's token range is the scheduler's "
        "(`max_num_seqs` for decode, `max_num_batched_tokens` otherwise) or the plan's largest benchmark token "
        'count of that phase, whichever is larger: a size the plan times is a size it checks. Where a cell '
        "cannot reach a path (a CPU machine's element budget, decode's few tokens), its record's facts say so; "
        'memcheck cells leave path examples to the other graph modes',
        '`paths: {two_pass: "num_tokens * hidden * act_bytes >= 192 * 2**20"}`',
        (('Op', 'paths'),)),
    FieldDoc(
        '`numerics`',
        'examples, max_num_seqs, max_num_batched_tokens, prefill_tokens, max_model_len, timeout_s, '
        'cpu_element_budget, awkward_sizes, `cpu_sizes` (sizes a CPU machine draws instead; CPU sizes giving a '
        'tensor more than cpu_element_budget elements per token are warned), `int32_overflow` (on a GPU, each '
        'tp1 eager prefill cell also checks one example whose largest tensor holds more than 2**31 elements, '
        "at the plan's largest sizes, where the device has the memory; the record's facts say what it ran or "
        'why not), `batch_invariance` (required | report | off, default report: eager tp1 cells run the '
        'first rows of an example alone and at the front, middle and end of larger batches across the '
        "phase's token range, and record \"batch-invariant\" or \"varies from N tokens on\" with the first row "
        "that differs; required fails the cell where a row's bits depend on the batch, as vLLM's "
        'batch-invariant mode needs; only for ops whose token rows are independent: inputs built from the '
        "batch's sequences, or an output without a num_tokens dimension, leave it out, and `required` there is "
        'warned), `determinism` '
        '(required | report, default required: eager tp1 cells call the op twice on the same inputs, on a GPU '
        'again on a second CUDA stream, and a kernel whose bits differ fails the cell with where; report '
        'records it, for a kernel that reduces with atomics by design)',
        '`cpu_sizes: {in_features: [64, 136]}`, `batch_invariance: required`',
        ((None, 'numerics'),)),
    FieldDoc(
        '`tp`',
        '`trivial`, or `sharded`: per input `shard: dim`, `merged: k`, `units: <symbol>` (split between whole '
        'units, e.g. heads), `replicate: true` (with `units`: whole units replicated where there are fewer '
        "than ranks, as vLLM's KV heads below the TP size); per output `gather`, `sum`, `replicated`; "
        "`sequence_parallel`. `units` must be a symbol of the dimension split; a plan size that a TP size's "
        'cells never draw (not a multiple of ranks x merged parts) is warned',
        '`query: {shard: 1, units: num_heads}`',
        ((None, 'tp'),)),
    FieldDoc(
        '`cuda_graph.capture_sizes`',
        "the capture sizes (default: vLLM's)",
        '`capture_sizes: [1, 2, 4, 8]`',
        (('CudaGraph', 'capture_sizes'),)),
    FieldDoc(
        '`vllm`',
        "`target: v1` (vLLM's V1 engine, the default and only one); the route into vLLM for the op's kind: "
        '`route` `ir` (a vLLM IR provider) | `custom_op` (an out-of-tree CustomOp) | `quantization` (a '
        '`QuantizationConfig` + `LinearMethodBase`) | `attention_backend` (a vLLM attention backend registered as '
        "`CUSTOM`, its forward calling the kernel on vLLM's KV cache and metadata, mapped by `op.args`' shapes) | "
        '`attention` | `fusion` (the last two: stated, not proven here, with `why_not_proven`); `layer`, `ir_op`, '
        "`custom_op`, `provider`, `in_tree_provider` (vLLM's "
        "own IR provider, `vllm_c`), `fusion` (vLLM's pass that rewrites its layers into its own kernel, "
        '`implementations.vllm` with a `fusion_pass` switch: `layers`, `pass_path`, `layer_custom_op`, `ir_ops`, '
        "`residual`), `adapter` (the module with the op's vLLM side, default the kernel's: "
        'docs/adding-an-op.md; its functions are checked against how they are called, and warned); no section: '
        'no route, and the page names none (its fields without a `route` are warned)',
        '`vllm: {route: ir, layer: "vllm.model_executor.layers.layernorm:RMSNorm", ir_op: rms_norm}`; `fusion:` '
        'as in `kernels/plans/rms_norm_static_fp8_quant.yaml`',
        ((None, 'vllm'),)),
    FieldDoc(
        '`benchmark`',
        'token counts per phase (`decode`, `prefill`, `chunked_prefill`); `bytes` / `flops` models (the bound of '
        "each figure, below); `models`: which real model each size comes from; `sizes`: the size combinations "
        'timed, each naming every size of `op.sizes` (default: every combination their constraints allow; a '
        'stored record of sizes no longer listed is not shown); what is timed beside the kernel: '
        '`implementations`',
        '`decode: [1, 64, 256]`; `sizes: [{in_features: 4096, out_features: 14336}]`',
        ((None, 'benchmark'),)),
    FieldDoc(
        '`implementations`',
        "the op's implementations beside the kernel, by name (vLLM IR's `impls`: native is one of them). "
        '`native` and `compiled` (op.native, else the reference, eager and under Inductor) and `vllm` '
        "(vLLM's own compiled kernel for the op: `name`, its `torch.ops._C` name; `args`, the plan argument for "
        'each of its parameters in order; optional `signature`; `switch` `{kind: ir | custom_op | fusion_pass, '
        'name, runs_for, note, cpu_runs_native}`, how a deployment turns it on) are named by their kind; any '
        "other name is the plan's own, of a `kind`: " + "; ".join(
            f"`{name}` ({kind.describes}: `{'`, `'.join(kind.required)}`"
            + (f", optional `{'`, `'.join(kind.optional)}`" if kind.optional else "") + ")"
            for name, kind in KINDS.items() if name not in BUILTIN) + " (default: import). "
        "Each may state a `contract` like `op.contract`'s (shapes and dtypes "
        'outside it are not drawn or timed for it), a `max_step_fraction` (its own allowance of quantized '
        'elements one step from the reference), a `setting`, how a vLLM deployment runs it (where it beats '
        'the kernel and the profile\'s baseline the decision is "leave it to <name>" with that setting: '
        "docs/report.md), and a `title`, how a page and a decision name it (words only, default its name: "
        "`vLLM's TRITON_ATTN`). `role`: `baseline` (an entry's without a `role`: timed beside the kernel, "
        "weighed by the decision), `audited` (run through the numerics cells too, each cell again with its id "
        'ending `-<name>`: its failures are findings on the op\'s page, "What vLLM\'s kernel accepts", never the '
        "kernel's verdict), `default` beside `baseline` (on one of the plan's own at most: what vLLM runs in the "
        "kernel's place in every profile, as its own attention backend does; each profile's decision weighs the "
        'kernel against it instead of `compiled` and `native`, and where the kernel loses is "keep <title>" with '
        "its `setting`), or `[]`. Absent: `native` and `compiled`, timed. The keys plans wrote before "
        '(`benchmark.baselines`, `vllm.kernel`, `providers`) still load, with a warning that shows this form',
        '`vllm: {role: [baseline, audited], name: rms_norm, args: [out, x, weight, eps], switch: {kind: ir, '
        'name: rms_norm, runs_for: RMSNorm}}`; `cublas: {path: kernels.int8_linear:dequantized_linear, prepare: '
        'kernels.int8_linear:dequantize_weight, setting: "serve the unquantized checkpoint"}`',
        ((None, 'implementations'), ('Implementation', None))),
)


def fields_table() -> str:
    """The README's table of every field (Markdown; a `|` in a cell escaped)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| field | what it says | example |", "|---|---|---|"]
    rows += [f"| {cell(d.fields)} | {cell(d.says)} | {cell(d.example)} |" for d in FIELD_DOCS]
    return "\n".join(rows) + "\n"

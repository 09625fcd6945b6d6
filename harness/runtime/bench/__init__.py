"""Benchmarks: per regime and GPU, is the kernel faster than what vLLM runs without it: its native code eager
("native": op.native, what vLLM runs without the custom op in the activation dtype, else the reference), the same
under torch.compile ("compiled", Inductor), vLLM's in-tree kernel ("vllm") and any other kernel the plan names
as a baseline (`implementations: {liger: {path: liger_wrapper:rms_norm}}`, called like the kernel; with `prepare`,
its inputs mapped once per input set outside the timed region, e.g. weights dequantized for cuBLAS)?

One item per benchmark shape (the plan's benchmark token counts x its sizes) x dtype x graph mode on
this machine's SM, e.g. `bench[decode-bf16-eager-sm90-t64-hidden4096]`; a worker runs it as a `BenchTask`
(harness.runtime.tasks: the parsed plan and the shape). The flow, one module a step:

- specs: the shapes benchmarked (BenchSpec, bench_specs) and why this machine does not time one (skip_reason);
- models: the bytes one call must move and the flops it does (the plan's models, else its tensors as built);
- implementations: what is timed (the kernel, native, compiled, vllm, named baselines) and the inputs they rotate
  over;
- precompile: every shape's compiled reference and kernel compiled in a process pool before the first item;
- measure: one item timed, checked and set against its physical bound (run_benchmark);
- records: an item's record, and the record of one this machine does not run.

Nothing is imported here: import a name from the module that holds it. harness.runtime.tasks imports specs and
measure imports tasks, so a package that imported measure here would import itself in a circle.
"""

"""Templates of the vLLM general plugins the harness generates, one real Python module per vLLM op.

Each is importable as it stands (for the bundled kernel) and is linted and imported by the tests;
`harness.spec.vllm_ops.render_plugin` fills in a plan's kernel, op name, provider and route on the lines
marked `# harness: <what>`, and ends supports_args with the checks of the plan's op.contract (the line
marked `# harness: contract`, after the template's own checks).
"""

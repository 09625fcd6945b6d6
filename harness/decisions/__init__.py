"""Decisions from results, by the rules of docs/report.md: the kernel's speedups against its baselines
(speedups), the recommendation per SM, dtype, regime and vLLM profile (recommendations), the go / no-go
verdict per SM and for the plan (verdicts), stated in the reasons the cells give (reasons), what to fix, run or
benchmark next (open_items) and the trade-offs of the route into vLLM (tradeoffs). Typed results in plain Python,
no Markdown: harness.rendering words them."""

"""Decisions from results, by the rules of docs/report.md: the kernel's speedups against its baselines
(speedups), the recommendation per SM, dtype, regime and vLLM profile (recommendations), and the go / no-go
verdict per SM and for the plan (verdicts), stated in the reasons the cells give (reasons). Plain Python, no
Markdown."""

"""Decisions from results: verdicts per SM and TP size, and the recommendation per SM, dtype, regime and vLLM
profile (the rules of docs/report.md). Plain Python, no Markdown."""

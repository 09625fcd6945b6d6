"""Plan-driven test matrix for custom GPU ops headed into vLLM (a pytest plugin)."""

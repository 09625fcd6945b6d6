"""vLLM in the loop: integration routes, plugin loading and dispatch checks. Imports vLLM."""

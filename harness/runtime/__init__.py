"""Running cells: resolving user code, inputs, numerics, graph modes, the runner, TP, memcheck, benchmarks and worker
isolation. Imports torch."""

"""Imported once by the workers' fork server (workers.FORKSERVER_PRELOAD): what every worker and TP rank does at
its start, done before the fork so that each child inherits it instead (1.6 s of CPU a start on a 2-core CPU
machine, where a test run starts hundreds of them), and the imports of a torch_compile cell's first trace. The
children still run workers.start_up(); patched and imported already, it takes 0.2 s.

Only with a CPU build of torch: on a CUDA build any of these steps may initialise CUDA's driver, and a child forked
after that cannot use the GPU (there each child does them itself)."""

import contextlib

import torch

from harness.runtime import workers

# An exception here would end the fork server, and with it every worker; each child meets it again at its start.
if not torch.cuda._is_compiled():
    with contextlib.suppress(Exception):
        workers.start_up()
        # What a torch_compile cell's first trace imports (4.3 s of CPU).
        import torch._dynamo
        import torch._inductor.compile_fx

"""Imported once by the workers' fork server (workers.FORKSERVER_PRELOAD): what every worker and TP rank does at
its start, done before the fork so that each child inherits it instead (1.6 s of CPU a start on a 2-core CPU
machine, where a test run starts hundreds of them). The children still call both; patched and imported already,
they take 0.2 s.

Only with a CPU build of torch: on a CUDA build either step may initialise CUDA's driver, and a child forked after
that cannot use the GPU (there the children do it themselves, as before)."""

import contextlib

import torch

from harness.runtime import workers
from harness.runtime.interpreter import make_faithful

# An exception here would end the fork server, and with it every worker; each child meets it again at its start.
if not torch.cuda._is_compiled():
    with contextlib.suppress(Exception):
        make_faithful()
        workers._warm_up()

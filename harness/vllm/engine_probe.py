"""A vLLM general plugin that counts the kernel's calls inside a running engine (harness.vllm.engine).

vLLM loads it, like the op's own generated plugin, in every process it starts (the engine core, the
workers), through the `vllm.general_plugins` entry point of a temporary distribution. It wraps the
`kernel` global of each generated plugin module named in HARNESS_ENGINE_PROBE, so every call vLLM's
layers make into the kernel appends one line to a file of its process under the probe's folder:
the op, the forward step's kind (prefill, decode or mixed, from the attention metadata vLLM set for
that forward), its token count, and whether the call came from inside the model's forward. On a CPU
machine it also makes Triton's interpreter faithful there, as the harness's own workers do.

Nothing here runs in the harness's own processes; it imports vLLM only when vLLM calls it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch

from harness.interpreter import make_faithful

PROBE_ENV = "HARNESS_ENGINE_PROBE"  # JSON: {"dir": folder for the call files, "ops": {module: op name}}
MODEL_CODE = os.sep + os.path.join("vllm", "model_executor", "models") + os.sep


def step_kind() -> tuple[str, int | None]:
    """The current forward's kind and token count, from vLLM's forward context: "prefill" (every request
    in it brings more than one query token), "decode" (one each), "mixed", "dummy" (a forward without
    requests: start-up profiling and warm-up), "capture" (vLLM capturing a CUDA graph), or "outside forward"."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return "outside forward", None
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return "capture", None  # reading the batch's lengths would sync with the host, which a capture forbids
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # one dict per micro-batch
        metadata = metadata[0] if metadata else None
    first = next(iter(metadata.values()), None) if isinstance(metadata, dict) else None
    start_loc = getattr(first, "query_start_loc", None)
    if start_loc is None:
        return "dummy", None
    query_lens = (start_loc[1:] - start_loc[:-1]).tolist()
    # A request with one query token is decoding (the engine's prompts are longer than one token).
    decodes = sum(1 for n in query_lens if n == 1)
    kind = "decode" if decodes == len(query_lens) else "prefill" if decodes == 0 else "mixed"
    return kind, int(sum(query_lens))


def _inside_model_forward() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if MODEL_CODE in frame.f_code.co_filename and frame.f_code.co_name == "forward":
            return True
        frame = frame.f_back
    return False


class CountedKernel:
    """The plugin's kernel, with each call written down before it runs."""

    def __init__(self, fn, op: str, path: str):
        self.fn, self.op, self.path = fn, op, path

    def __call__(self, *args, **kwargs):
        kind, tokens = step_kind()
        line = json.dumps({"op": self.op, "step": kind, "tokens": tokens, "in_forward": _inside_model_forward()})
        with open(self.path, "a") as f:  # one line per call: a worker killed later loses nothing written
            f.write(line + "\n")
        return self.fn(*args, **kwargs)


def register() -> None:
    """The vllm.general_plugins entry point: wrap each plugin module's kernel once per process."""
    spec = json.loads(os.environ[PROBE_ENV])
    make_faithful()  # a no-op on a GPU machine; on a CPU one Triton's interpreter computes what a GPU does
    path = os.path.join(spec["dir"], f"calls-{os.getpid()}.jsonl")
    for module_name, op in spec["ops"].items():
        module = importlib.import_module(module_name)
        if not isinstance(module.kernel, CountedKernel):  # vLLM may call a general plugin more than once
            module.kernel = CountedKernel(module.kernel, op, path)

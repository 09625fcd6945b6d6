"""vLLM's Triton attention in Triton's interpreter on a CPU machine, run in a process of its own (`python -m
tests.vllm_triton_in_interpreter`, from tests/test_attention_backend.py). vLLM's CPU build replaces Triton with a
stand-in (vllm.triton_utils: Triton has no CPU backend there), so vLLM is told of a CPU backend before it is imported,
and its kernels run in the interpreter made faithful; its Triton cache writer asks for a GPU, so TRITON_ATTN's
writes are made in torch, as the plugin's are on a CPU.

At tiny sizes, against the plan's reference: the plan's triton_attn baseline (kernels/paged_attention_vllm.py) on a
decode batch (vLLM's split-softmax path) and a mixed one, and vLLM's TRITON_ATTN backend stepped as a full CUDA graph
replays it (harness.vllm.attention_backend.attend_graphed, its capture run eagerly). One JSON line per check.
"""

import contextlib
import json
import tempfile
import types
from pathlib import Path

from harness.interpreter import make_faithful, switch_on

switch_on()
make_faithful()
from triton.backends import backends  # noqa: E402  after the interpreter is switched on

backends.setdefault("cpu", types.SimpleNamespace(driver=None))  # what vllm.triton_utils looks for on a CPU build

import torch  # noqa: E402

from harness.cells.matrix import Cell  # noqa: E402
from harness.plan.load import load_plan  # noqa: E402
from harness.plan.tolerances import output_tolerance  # noqa: E402
from harness.runtime.calls import reference_outputs  # noqa: E402
from harness.runtime.implementations import loaded  # noqa: E402
from harness.runtime.inputs import Example, build_args  # noqa: E402
from harness.runtime.numerics import Mismatch, compare  # noqa: E402
from harness.runtime.resolve import resolve  # noqa: E402
from harness.vllm import attention_backend  # noqa: E402
from harness.vllm_facts.attention_layout import attention_args  # noqa: E402

PLAN = load_plan(Path(__file__).resolve().parents[1] / "kernels/plans/paged_attention.yaml")
SIZES = {"num_heads": 4, "num_kv_heads": 2, "head_size": 32, "block_size": 16}
TOKENS = {"decode": 4, "chunked_prefill": 20}


def inputs(phase: str, dtype: str) -> tuple[dict, torch.Tensor]:
    values = build_args(PLAN, Cell(phase, dtype, 1, "eager", "cpu"), Example(TOKENS[phase], SIZES, seed=7), "cpu")
    return values, reference_outputs(PLAN, resolve(PLAN).reference, values)["out"]


def said(check: str, phase: str, dtype: str, got: torch.Tensor, expected: torch.Tensor, **facts) -> None:
    try:
        compare("out", got, expected, output_tolerance(PLAN, dtype, "out", None), None)
        why = ""
    except Mismatch as exc:
        why = str(exc)
    print(json.dumps({"check": check, "phase": phase, "dtype": dtype, "why": why, **facts}), flush=True)


def the_baseline() -> None:
    from vllm.triton_utils import HAS_TRITON

    assert HAS_TRITON, "vLLM still replaces Triton with its stand-in"
    impl = loaded(PLAN, "triton_attn")
    for phase, dtype in (("decode", "bf16"), ("chunked_prefill", "fp32")):
        values, expected = inputs(phase, dtype)
        prepared = impl.prepare(**values)
        # vLLM's unified_attention takes its split-softmax (3D) path for a decode batch within the threshold
        split = prepared["max_seqlen_q"] == 1 and values["seq_lens"].shape[0] <= prepared["seq_threshold_3D"]
        impl.fn(**prepared)
        said("triton_attn", phase, dtype, values["out"], expected, split_softmax=split)


def torch_writes(self, layer, key, value, kv_cache, slot_mapping):
    key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
    real = slot_mapping >= 0
    slots, block_size = slot_mapping[real].long(), key_cache.shape[1]
    key_cache[slots // block_size, slots % block_size] = key[:slot_mapping.shape[0]][real]
    value_cache[slots // block_size, slots % block_size] = value[:slot_mapping.shape[0]][real]


def eager_capture(forward, device):
    """attention_backend.capture without CUDA: the capture runs the forward, and each replay runs it again."""
    out = forward()
    return (lambda: out.copy_(forward())), out


def triton_attn_replayed() -> None:
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backends import triton_attn

    triton_attn.TritonAttentionImpl.do_kv_cache_update = torch_writes
    attention_backend.capture = eager_capture
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for phase, dtype in (("decode", "fp32"), ("chunked_prefill", "fp16")):
            values, expected = inputs(phase, dtype)
            batch = attention_backend.step_of(values, attention_args(PLAN))
            configs = attention_backend.Configs(root, getattr(torch, {"fp32": "float32", "fp16": "float16"}[dtype]),
                                                PLAN.numerics.max_model_len)
            mode = attention_backend.GRAPH_MODES[phase]
            config = configs.config(batch.query.shape[1], batch.key.shape[1], batch.query.shape[2],
                                    batch.block_size, mode)
            # what vLLM's config holds on a GPU (a CPU platform resolves to no graphs): padding to the capture sizes
            config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
            config.compilation_config.cudagraph_capture_sizes = [8, 16, 32]
            layer = attention_backend.layer_for(configs, config, batch, triton_attn.TritonAttentionBackend)
            got = attention_backend.attend_graphed(layer, config, batch, 7, phase == "decode")
            tokens, requests = attention_backend.graph_size(config, batch, phase == "decode")
            said("TRITON_ATTN replayed", phase, dtype, got, expected, tokens=tokens, requests=requests,
                 real_tokens=batch.query.shape[0], real_requests=len(batch.lens))


if __name__ == "__main__":
    the_baseline()
    triton_attn_replayed()

"""Run third-party Triton kernels in Triton's interpreter against PyTorch, and say which fail and why.

    TRITON_INTERPRET=1 python -m tests.thirdparty.survey stock      # the interpreter as Triton ships it
    TRITON_INTERPRET=1 python -m tests.thirdparty.survey faithful   # after harness.interpreter.make_faithful()

One line per kernel: ok (max error against the reference), wrong (the error), raised (the exception) or
inconclusive (InterpreterUnfaithful: a construct the interpreter cannot compute as a GPU does). A case whose
package is not installed is skipped. The references are written from the packages' docstrings; the sizes are
small, so the whole survey takes about a minute on a CPU machine.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CASES = []
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def case(pkg, dtypes=(torch.bfloat16, torch.float16, torch.float32)):
    def register(fn):
        for dt in dtypes:
            CASES.append((pkg, fn.__name__, dt, fn))
        return fn
    return register


def _g(*shape, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed + len(shape))
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _qkv(B, T, H, K, dt):
    return (_g(B, T, H, K, dtype=dt, scale=0.5), _g(B, T, H, K, dtype=dt, scale=0.5, seed=1),
            _g(B, T, H, K, dtype=dt, seed=2))


def _rms_ref(x, w, eps, offset=0.0):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * (w + offset)


# ----------------------------------------------------------------------------- Liger-Kernel


@case("liger_kernel")
def liger_rms_norm_llama(dt):
    from liger_kernel.ops.rms_norm import rms_norm_forward
    x, w = _g(6, 200, dtype=dt), (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt)
    return rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)[0], _rms_ref(x, w, 1e-6)


@case("liger_kernel")
def liger_rms_norm_gemma(dt):
    from liger_kernel.ops.rms_norm import rms_norm_forward
    x, w = _g(6, 200, dtype=dt), (0.1 * _g(200, dtype=torch.float32)).to(dt)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())).to(dt)
    return rms_norm_forward(x, w, 1e-6, 1.0, "gemma", None)[0], ref


@case("liger_kernel")
def liger_rms_norm_none(dt):
    from liger_kernel.ops.rms_norm import rms_norm_forward
    x, w = _g(6, 200, dtype=dt), (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt)
    return rms_norm_forward(x, w, 1e-6, 0.0, "none", None)[0], _rms_ref(x, w, 1e-6)


@case("liger_kernel")
def liger_fused_add_rms_norm(dt):
    from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
    x, r = _g(6, 200, dtype=dt), _g(6, 200, dtype=dt, seed=1)
    w = (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt)
    y = fused_add_rms_norm_forward(x, r, w, 1e-6, 0.0, "llama")[0]
    return y, _rms_ref(x + r, w, 1e-6)


@case("liger_kernel")
def liger_layer_norm(dt):
    from liger_kernel.ops.layer_norm import layer_norm_forward
    x, w, b = _g(6, 200, dtype=dt), (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt), _g(200, dtype=dt, scale=0.1)
    return layer_norm_forward(x, w, b, 1e-5)[0], F.layer_norm(x.float(), (200,), w.float(), b.float(), 1e-5).to(dt)


@case("liger_kernel")
def liger_swiglu(dt):
    from liger_kernel.ops.swiglu import swiglu_forward
    a, b = _g(6, 300, dtype=dt), _g(6, 300, dtype=dt, seed=1)
    return swiglu_forward(a, b)[2], (F.silu(a.float()).to(dt) * b)


@case("liger_kernel")
def liger_geglu_tanh(dt):
    from liger_kernel.ops.geglu import geglu_forward
    a, b = _g(6, 300, dtype=dt), _g(6, 300, dtype=dt, seed=1)
    return geglu_forward(a, b)[2], (F.gelu(a.float(), approximate="tanh").to(dt) * b)


@case("liger_kernel")
def liger_rope(dt):
    from liger_kernel.ops.rope import rope_forward
    bsz, heads, kv_heads, seq, hd = 2, 4, 2, 5, 64
    q, k = _g(bsz, heads, seq, hd, dtype=dt), _g(bsz, kv_heads, seq, hd, dtype=dt, seed=1)
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(torch.arange(seq).float(), inv)
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos()[None].to(dt), emb.sin()[None].to(dt)

    def rot(t):
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([-t2, t1], -1)

    qf, cf, sf = q.float(), cos.float()[:, None], sin.float()[:, None]
    ref_q = (qf * cf + rot(qf) * sf).to(dt)
    return rope_forward(q.clone(), k.clone(), cos, sin)[0], ref_q


@case("liger_kernel")
def liger_softmax(dt):
    from liger_kernel.ops.softmax import _softmax_forward
    x = _g(6, 300, dtype=dt, scale=3)
    return _softmax_forward(x)[0], torch.softmax(x.float(), -1).to(dt)


@case("liger_kernel")
def liger_dyt(dt):
    from liger_kernel.ops.dyt import liger_dyt_fwd
    x = _g(6, 300, dtype=dt)
    alpha = torch.tensor([0.7], dtype=dt)
    gamma, beta = (1 + 0.1 * _g(300, dtype=torch.float32)).to(dt), _g(300, dtype=dt, scale=0.1)
    ref = (torch.tanh(alpha.float() * x.float()) * gamma.float() + beta.float()).to(dt)
    return liger_dyt_fwd(x, alpha, gamma, beta), ref


@case("liger_kernel")
def liger_poly_norm(dt):
    from liger_kernel.ops.poly_norm import poly_norm_forward
    x = _g(6, 200, dtype=dt)
    w, b = torch.tensor([0.3, 0.5, 0.2], dtype=torch.float32), torch.tensor([0.1], dtype=torch.float32)

    def norm(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    xf = x.float()
    # The kernel forms x^3 and x^2 in the input dtype (on a GPU too): so does the reference.
    ref = (w[0] * norm((x * x * x).float()) + w[1] * norm((x * x).float()) + w[2] * norm(xf) + b).to(dt)
    return poly_norm_forward(x, w, b, 1e-6)[0], ref


@case("liger_kernel")
def liger_relu_squared(dt):
    from liger_kernel.ops.relu_squared import relu_squared_forward
    x = _g(6, 300, dtype=dt)
    return relu_squared_forward(x)[0] if isinstance(relu_squared_forward(x), tuple) else relu_squared_forward(x), \
        torch.relu(x.float()).pow(2).to(dt)


@case("liger_kernel", dtypes=(torch.float32, torch.bfloat16))
def liger_cross_entropy_softcap(dt):
    from liger_kernel.ops.cross_entropy import cross_entropy_forward
    x = _g(6, 500, dtype=dt, scale=4)
    t = torch.randint(0, 500, (6,), generator=torch.Generator().manual_seed(0))
    loss = cross_entropy_forward(x.clone(), t, None, -100, 0.0, 0.0, "mean", 30.0, False)[0]
    xf = 30.0 * torch.tanh(x.float() / 30.0)
    return loss.float(), F.cross_entropy(xf, t)


@case("liger_kernel")
def liger_group_norm(dt):
    from liger_kernel.ops.group_norm import group_norm_forward
    x = _g(2, 8, 40, dtype=dt)
    w, b = (1 + 0.1 * _g(8, dtype=torch.float32)).to(dt), _g(8, dtype=dt, scale=0.1)
    ref = F.group_norm(x.float(), 4, w.float(), b.float(), 1e-5).to(dt)
    return group_norm_forward(x, 8, 4, w, b, 1e-5)[0].view(2, 8, 40), ref


@case("liger_kernel", dtypes=(torch.float32, torch.bfloat16))
def liger_kl_div(dt):
    from liger_kernel.ops.kl_div import kldiv_forward_triton
    p = torch.log_softmax(_g(6, 300, dtype=torch.float32, scale=2), -1).to(dt)
    q = torch.softmax(_g(6, 300, dtype=torch.float32, scale=2, seed=1), -1).to(dt)
    ref = F.kl_div(p.float(), q.float(), reduction="sum", log_target=False)
    return kldiv_forward_triton(p, q, False, "sum", 1e-10).float(), ref


@case("liger_kernel", dtypes=(torch.float32,))
def liger_sparsemax(dt):
    from liger_kernel.ops.sparsemax import _sparsemax_forward
    x = _g(6, 64, dtype=dt, scale=2)
    srt, _ = torch.sort(x, -1, descending=True)
    k = torch.arange(1, 65, dtype=dt)
    cs = srt.cumsum(-1)
    support = (1 + k * srt) > cs
    kz = support.sum(-1, keepdim=True)
    tau = (cs.gather(-1, kz - 1) - 1) / kz
    return _sparsemax_forward(x, -1)[0], torch.clamp(x - tau, min=0)


@case("liger_kernel", dtypes=(torch.float32, torch.bfloat16))
def liger_fused_linear_cross_entropy(dt):
    from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
    x, w = _g(8, 64, dtype=dt), _g(200, 64, dtype=dt, scale=0.2, seed=1)
    t = torch.randint(0, 200, (8,), generator=torch.Generator().manual_seed(0))
    loss = fused_linear_cross_entropy_forward(x, w, t)[0]
    return loss.float(), F.cross_entropy((x.float() @ w.float().T), t)


@case("liger_kernel", dtypes=(torch.float32,))
def liger_jsd(dt):
    from liger_kernel.ops.jsd import jsd_forward
    logq = torch.log_softmax(_g(6, 128, dtype=dt, scale=2), -1)
    logp = torch.log_softmax(_g(6, 128, dtype=dt, scale=2, seed=1), -1)
    m = 0.5 * (logp.exp() + logq.exp())
    ref = 0.5 * (F.kl_div(m.log(), logp, reduction="sum", log_target=True)
                 + F.kl_div(m.log(), logq, reduction="sum", log_target=True)) / 6
    return jsd_forward(logq, logp, None, 0.5, -100, False)[0].float(), ref


# ----------------------------------------------------------------------------- flash-linear-attention (fla)


@case("fla")
def fla_rms_norm(dt):
    from fla.modules.norm.layernorm import rms_norm
    x, w = _g(6, 200, dtype=dt), (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dt)
    return rms_norm(x, w, None, eps=1e-6), ref


@case("fla")
def fla_layer_norm(dt):
    from fla.modules.norm.layernorm import layer_norm
    x, w, b = _g(6, 200, dtype=dt), (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt), _g(200, dtype=dt, scale=0.1)
    return layer_norm(x, w, b, eps=1e-5), F.layer_norm(x.float(), (200,), w.float(), b.float(), 1e-5).to(dt)


@case("fla")
def fla_rms_norm_gated(dt):
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    x, g = _g(6, 200, dtype=dt), _g(6, 200, dtype=dt, seed=1)
    w = (1 + 0.1 * _g(200, dtype=torch.float32)).to(dt)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float() * F.silu(g.float())).to(dt)
    return rms_norm_gated(x, g, w, None, activation="swish", eps=1e-5), ref


@case("fla")
def fla_l2norm(dt):
    from fla.modules.norm.l2norm import l2norm_fwd
    x = _g(6, 128, dtype=dt)
    xf = x.float()
    return l2norm_fwd(x, 1e-6)[0], (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + 1e-6)).to(dt)


@case("fla")
def fla_swiglu(dt):
    from fla.modules.activations.ops import swiglu_fwd
    a, b = _g(6, 300, dtype=dt), _g(6, 300, dtype=dt, seed=1)
    return swiglu_fwd(a, b), (F.silu(a.float()) * b.float()).to(dt)


@case("fla")
def fla_logsigmoid_temperature(dt):
    from fla.modules.activations.ops import logsigmoid_fwd
    x = _g(6, 300, dtype=dt, scale=3)
    return logsigmoid_fwd(x, 2.0), (F.logsigmoid(x.float()) / 2.0).to(dt)


@case("fla")
def fla_elu_p1(dt):
    from fla.modules.activations.ops import elu_p1_fwd
    x = _g(6, 300, dtype=dt, scale=3)
    return elu_p1_fwd(x), (F.elu(x.float()) + 1).to(dt)


@case("fla")
def fla_powglu(dt):
    from fla.modules.activations.ops import powglu_fwd
    a, b = _g(6, 300, dtype=dt), _g(6, 300, dtype=dt, seed=1)
    af = a.float()
    xp = torch.where(af > 0, af, torch.ones_like(af))
    gate = torch.where(af > 0, xp.pow(3.0 / (xp.sqrt() + 1)), af) * torch.sigmoid(af)
    return powglu_fwd(a, b, 3.0), (gate * b.float()).to(dt)


@case("fla")
def fla_rotary(dt):
    from fla.modules.rotary.ops import rotary_embedding
    bsz, seq, heads, hd = 2, 5, 4, 64
    x = _g(bsz, seq, heads, hd, dtype=dt)
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(torch.arange(seq).float(), inv)
    cos, sin = freqs.cos().to(dt), freqs.sin().to(dt)
    xf, cf, sf = x.float(), cos.float()[None, :, None], sin.float()[None, :, None]
    x1, x2 = xf[..., : hd // 2], xf[..., hd // 2:]
    ref = torch.cat([x1 * cf - x2 * sf, x1 * sf + x2 * cf], -1).to(dt)
    return rotary_embedding(x, cos, sin), ref


@case("fla", dtypes=(torch.float32, torch.bfloat16))
def fla_softmax(dt):
    from fla.ops.utils.softmax import softmax_fwd
    x = _g(6, 100, dtype=dt, scale=3)
    return softmax_fwd(x), torch.softmax(x.float(), -1)


@case("fla", dtypes=(torch.float32, torch.bfloat16))
def fla_chunk_local_cumsum(dt):
    from fla.ops.utils.cumsum import chunk_local_cumsum
    g = _g(2, 40, 3, dtype=dt)
    gf = torch.nn.functional.pad(g.float(), (0, 0, 0, 24)).view(2, 4, 16, 3).cumsum(2).view(2, 64, 3)[:, :40]
    return chunk_local_cumsum(g, 16), gf


@case("fla", dtypes=(torch.float32, torch.bfloat16))
def fla_chunk_simple_gla(dt):
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.simple_gla.naive import naive_chunk_simple_gla
    B, T, H, K = 1, 40, 2, 32
    q, k, v = _qkv(B, T, H, K, dt)
    g = F.logsigmoid(_g(B, T, H, dtype=torch.float32, seed=3)).to(dt)
    o = chunk_simple_gla(q, k, v, g)[0]
    ref = naive_chunk_simple_gla(q, k, v, g, chunk_size=64)[0]
    return o, ref.to(dt)


@case("fla", dtypes=(torch.float32, torch.bfloat16))
def fla_fused_recurrent_simple_gla(dt):
    from fla.ops.simple_gla import fused_recurrent_simple_gla
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla
    B, T, H, K = 1, 12, 2, 16
    q, k, v = _qkv(B, T, H, K, dt)
    g = F.logsigmoid(_g(B, T, H, dtype=torch.float32, seed=3)).to(dt)
    return fused_recurrent_simple_gla(q, k, v, g)[0], naive_recurrent_simple_gla(q, k, v, g)[0].to(dt)


@case("fla", dtypes=(torch.float32, torch.bfloat16))
def fla_chunk_gla(dt):
    from fla.ops.gla import chunk_gla
    from fla.ops.gla.naive import naive_recurrent_gla
    B, T, H, K = 1, 20, 2, 16
    q, k, v = _qkv(B, T, H, K, dt)
    g = F.logsigmoid(_g(B, T, H, K, dtype=torch.float32, seed=3)).to(dt)
    return chunk_gla(q, k, v, g)[0], naive_recurrent_gla(q, k, v, g)[0].to(dt)


# ----------------------------------------------------------------------------- driver


def _importable(pkg) -> bool:
    try:
        __import__(pkg)
        return True
    except Exception:
        return False


def main(mode: str, only: str | None = None) -> int:
    if mode == "faithful":
        from harness.interpreter import make_faithful
        left = make_faithful()
        print("make_faithful: still unfaithful:", left or "nothing")
    unfaithful = ()
    try:
        from harness.interpreter import InterpreterUnfaithful
        unfaithful = (InterpreterUnfaithful,)
    except ImportError:
        pass
    counts: dict[str, int] = {}
    for pkg, name, dt, fn in CASES:
        if only and only not in name:
            continue
        tag = f"{name}[{str(dt).removeprefix('torch.')}]"
        if not _importable(pkg):
            print(f"{tag:48s} skipped: {pkg} not importable")
            continue
        t0 = time.perf_counter()
        try:
            got, want = fn(dt)
            if want is None:
                status, line = "ok", "ran (no reference)"
            else:
                atol, rtol = TOL[dt]
                err = (got.float() - want.float()).abs()
                bad = err > atol + rtol * want.float().abs()
                nan = got.float().isnan() & ~want.float().isnan()
                if bool(bad.any()) or bool(nan.any()):
                    status = "wrong"
                    line = f"{int(bad.sum())} of {bad.numel()} elements off, max error {float(err.max()):.3g}"
                else:
                    status, line = "ok", f"max error {float(err.max()):.3g}"
        except Exception as e:  # noqa: BLE001 - the survey reports whatever a kernel raises
            cause = e
            while cause.__cause__ is not None and not isinstance(cause, unfaithful):
                cause = cause.__cause__
            status = "inconclusive" if isinstance(cause, unfaithful) else "raised"
            line = f"{type(cause).__name__}: {str(cause).splitlines()[0][:160] if str(cause) else ''}"
            if os.environ.get("SURVEY_TRACEBACK"):
                traceback.print_exc()
        counts[status] = counts.get(status, 0) + 1
        print(f"{tag:48s} {status:12s} {line}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    print("summary:", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "faithful", sys.argv[2] if len(sys.argv) > 2 else None))

#!/usr/bin/env python3
"""Measured validation-mode CPU operator events per module, from the real PyTorch profiler
(NOT run in CI).

Writes program/tests/fixtures/validation_census_torch.toml, which
program/tests/validation_events.rs replays against the torch-level forward census of
program/src/strategy/validation/op_census.rs.

What it measures: the extra profiler CPU operator events a HyperParallel-style DTensor adds to
one module forward, against the same forward on plain tensors. The wrapper reproduces the
mechanism of mindspore-ai/hyper-parallel (`core/dtensor/_dtensor_base.py` DTensorBase and
`core/shard/_op_dispatch.py` OpDispatcher): a `torch.Tensor` subclass built with
`Tensor._make_subclass`, a `__torch_function__` that unwraps DTensor arguments to their local
tensors (an attribute read), runs the op and wraps every tensor output again, overridden
`to` / `float` methods that wrap their result, and `shape` / `dtype` / `size` answered from the
local tensor without dispatch. Layout inference is pure Python (no operator events), so it is
left out. Inputs and parameters are wrapped before profiling: only the module's own calls are
counted.

The module forwards follow the HuggingFace transformers code the census cites
(`Qwen3MoeRMSNorm.forward`, `Qwen3MoeAttention.forward` with `sdpa_attention_forward`,
`apply_rotary_pos_emb`, `Qwen3MoeMLP.forward`, `Qwen3MoeTopKRouter.forward`,
`ForCausalLMLoss`, `DeepseekV3Attention.forward` with `apply_rotary_pos_emb_interleave`),
written out here with small dimensions; the counts do not depend on the sizes.

Usage (CPU is enough; the CUDA wheel from PyPI works, the GPU is not used):
    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.15.0
    /tmp/torchenv/bin/python tools/validation_census_probe.py [--out plan/tests/fixtures]
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


class Wrapped(torch.Tensor):
    """A DTensor stand-in: the wrap, dispatch and override mechanism, no layouts."""

    def __new__(cls, local):
        t = torch.Tensor._make_subclass(cls, local, local.requires_grad)
        t._local_tensor = local
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in kwargs.items()})
        if isinstance(out, torch.Tensor):
            return Wrapped(out)
        if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
            return tuple(Wrapped(o) for o in out)
        return out

    def to(self, *args, **kwargs):
        return Wrapped(self._local_tensor.to(*args, **kwargs))

    def float(self):
        return Wrapped(self._local_tensor.float())

    @property
    def shape(self):
        return self._local_tensor.shape

    @property
    def dtype(self):
        return self._local_tensor.dtype

    def size(self, dim=None):
        return self._local_tensor.size() if dim is None else self._local_tensor.size(dim)


def unwrap(a):
    if isinstance(a, Wrapped):
        return a._local_tensor
    if isinstance(a, (tuple, list)):
        return type(a)(unwrap(x) for x in a)
    return a


def rms_norm(x, w, eps=1e-6):
    input_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return w * x.to(input_dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rope_interleave(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    b, h, s, d = q.shape
    q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    b, h, s, d = k.shape
    k = k.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def sdpa(q, k, v):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).contiguous()


def gqa_attention(h, p, cos, sin, hd):
    b, s = h.shape[:-1]
    q = rms_norm(F.linear(h, p["q"]).view(b, s, -1, hd), p["q_norm"]).transpose(1, 2)
    k = rms_norm(F.linear(h, p["k"]).view(b, s, -1, hd), p["k_norm"]).transpose(1, 2)
    v = F.linear(h, p["v"]).view(b, s, -1, hd).transpose(1, 2)
    q, k = rope(q, k, cos, sin)
    o = sdpa(q, k, v)
    o = o.reshape(b, s, -1).contiguous()
    return F.linear(o, p["o"])


def mla_attention(h, p, cos, sin, dims):
    nope, rot, vd, kvr = dims
    b, s = h.shape[:-1]
    q = F.linear(rms_norm(F.linear(h, p["q_a"]), p["q_a_norm"]), p["q_b"])
    q = q.view(b, s, -1, nope + rot).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rot], dim=-1)
    ckv = F.linear(h, p["kv_a"])
    k_pass, k_rot = torch.split(ckv, [kvr, rot], dim=-1)
    k_pass = F.linear(rms_norm(k_pass, p["kv_a_norm"]), p["kv_b"]).view(b, s, -1, nope + vd)
    k_pass = k_pass.transpose(1, 2)
    k_pass, v = torch.split(k_pass, [nope, vd], dim=-1)
    k_rot = k_rot.view(b, 1, s, rot)
    q_rot, k_rot = rope_interleave(q_rot, k_rot, cos, sin)
    k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
    q = torch.cat((q_pass, q_rot), dim=-1)
    k = torch.cat((k_pass, k_rot), dim=-1)
    o = sdpa(q, k, v)
    o = o.reshape(b, s, -1).contiguous()
    return F.linear(o, p["o"])


def swiglu(gate, up):
    return F.silu(gate) * up


def router(h, w, top_k):
    hidden = h.shape[-1]
    h = h.view(-1, hidden)
    h = h.reshape(-1, hidden)
    logits = F.linear(h, w)
    logits = F.softmax(logits, dtype=torch.float, dim=-1)
    value, index = torch.topk(logits, top_k, dim=-1)
    value /= value.sum(dim=-1, keepdim=True)
    return value.to(logits.dtype), index


def causal_lm_loss(h, w, labels, vocab):
    logits = F.linear(h[:, slice(0, None), :], w)
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, vocab), labels.view(-1), ignore_index=-100)


def events(fn):
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return len(prof.events())


def extra(fn, plain, wrapped):
    """Extra events of fn on wrapped arguments against plain ones (arguments built outside)."""
    return events(lambda: fn(*wrapped)) - events(lambda: fn(*plain))


def wrap_all(args):
    return [
        {k: Wrapped(v) for k, v in a.items()}
        if isinstance(a, dict)
        else Wrapped(a)
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 1 and not getattr(a, "_plain", False)
        else a
        for a in args
    ]


def plain(t):
    t._plain = True
    return t


def measure():
    torch.manual_seed(0)
    b, s, hidden, heads, kv, hd, vocab = 1, 8, 64, 4, 2, 16, 32
    r = lambda *shape: torch.randn(*shape)
    cos, sin = plain(r(b, s, hd)), plain(r(b, s, hd))
    gqa = {"q": r(heads * hd, hidden), "k": r(kv * hd, hidden), "v": r(kv * hd, hidden),
           "o": r(hidden, heads * hd), "q_norm": r(hd), "k_norm": r(hd)}
    nope, rot, vd, kvr, qr = 8, 8, 8, 16, 24
    mla = {"q_a": r(qr, hidden), "q_a_norm": r(qr), "q_b": r(heads * (nope + rot), qr),
           "kv_a": r(kvr + rot, hidden), "kv_a_norm": r(kvr),
           "kv_b": r(heads * (nope + vd), kvr), "o": r(hidden, heads * vd)}
    mla_cos, mla_sin = plain(r(b, s, rot)), plain(r(b, s, rot))
    x = r(b, s, hidden)
    labels = torch.randint(0, vocab, (b, s))
    ids = torch.randint(0, vocab, (b, s))
    cases = {
        "wrap": (lambda t: Wrapped(t), [plain(r(4))], None),
        "rms_norm": (rms_norm, [x, r(hidden)], None),
        "linear": (F.linear, [x, r(hidden, hidden)], None),
        "residual": (lambda a, c: a + c, [x, r(b, s, hidden)], None),
        "rope_qk": (rope, [r(b, heads, s, hd), r(b, kv, s, hd), cos, sin], None),
        "gqa_self_attn": (lambda h, p: gqa_attention(h, p, cos, sin, hd), [x, gqa], None),
        "swiglu": (swiglu, [r(b, s, hidden), r(b, s, hidden)], None),
        "embedding": (lambda i, w: F.embedding(i, w), [ids, r(vocab, hidden)], None),
        "causal_lm_loss_with_lm_head": (
            lambda h, w: causal_lm_loss(h, w, labels, vocab), [x, r(vocab, hidden)], None),
        "qwen3_moe_router": (lambda h, w: router(h, w, 2), [x, r(8, hidden)], None),
        "mla_self_attn": (
            lambda h, p: mla_attention(h, p, mla_cos, mla_sin, (nope, rot, vd, kvr)), [x, mla], None),
    }
    out = {}
    for name, (fn, args, _) in cases.items():
        if name == "wrap":
            out[name] = events(lambda: fn(args[0]))
            continue
        out[name] = extra(fn, args, wrap_all(args))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="plan/tests/fixtures")
    a = ap.parse_args()
    m = measure()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "validation_census_torch.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Generated by tools/validation_census_probe.py: extra profiler CPU operator events\n")
        f.write("# of one module forward on HyperParallel-style DTensors against plain tensors.\n")
        f.write(f'torch = "{torch.__version__}"\n\n[extra_events]\n')
        for k, v in m.items():
            f.write(f"{k} = {v}\n")
    print(open(path, encoding="utf-8").read())


if __name__ == "__main__":
    main()

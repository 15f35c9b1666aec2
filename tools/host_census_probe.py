#!/usr/bin/env python3
"""Measured production-mode host CPU operator events per module and pass, from the real
PyTorch profiler running the real HuggingFace modules (NOT run in CI).

Writes program/tests/fixtures/host_census_torch.toml, which program/tests/host_events.rs replays
against the production host-event census of program/src/strategy/host_events.rs.

What it measures, for each module the step programs cost as an op (the classes of
program/src/strategy/validation/op_census.rs), on plain tensors (production mode: HyperParallel
runs local tensors, no DTensor dispatch):
- `fwd`: every profiler CPU operator event of one forward with autograd recording (aten ops
  including views, `empty`, `as_strided`, `t`, `detach`, and their nested calls);
- `bwd`: every event of the backward of that forward: the autograd engine's
  `autograd::engine::evaluate_function: *Backward*` nodes, the formula's aten calls nested in
  them, and `torch::autograd::AccumulateGrad` of the module's parameters. The input is a
  non-leaf (`x0 * 1` built outside the profiled region) so the input's own gradient path is
  measured once (`input_stub`) and subtracted;
- `recompute`: the events a checkpointed module (`torch.utils.checkpoint.checkpoint`,
  `use_reentrant=False`, as transformers' `GradientCheckpointingLayer` runs it) adds to its
  backward: the re-run forward plus the checkpoint machinery;
- `*_kernels`: how many of those events are leaf compute ops, i.e. would launch a device
  kernel on an accelerator: an `aten::` event with no nested event that is not a view,
  allocation or metadata op (`VIEW_OR_META`) and calls nothing but such ops. Caveat: this
  follows the CPU backend's decompositions (a CPU `mean` is `sum` into a `fill_`-initialised
  output, slice backward `zero_`s a buffer, casts are `copy_`), so it bounds, not counts, the
  kernels an NPU launches for the same module.
Plus the optimizer step (`torch.optim.AdamW(foreach=True)` and `torch.optim.Muon`, the
per-matrix Muon of the matrixfsdp baseline) at two parameter counts, giving a fixed and a
per-parameter part.

Every case runs twice at two sizes (hidden 64 and 128, sequence 8 and 16) and the script
fails unless both give the same counts: the counts depend on the code path, not the sizes.

Modules: transformers' `Qwen3MoeRMSNorm`, `Qwen3MoeAttention` (sdpa, no mask: SDPA with
`enable_gqa`), `Qwen3MoeMLP` (dense SwiGLU), `Qwen3MoeTopKRouter`, `nn.Linear`,
`nn.Embedding`, `ForCausalLMLoss`, `Qwen3MoeDecoderLayer` with a dense MLP (whole layer, for
the composition check) and `Qwen3DecoderLayer` (dense Qwen3).

Usage (CPU is enough; the CUDA wheel from PyPI works, the GPU is not used):
    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch transformers
    /tmp/torchenv/bin/python tools/host_census_probe.py [--out plan/tests/fixtures]
"""

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

import transformers
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer
from transformers.models.qwen3_moe import modeling_qwen3_moe as qm
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

# aten ops that launch no device kernel when they are leaves: views, allocations, metadata.
VIEW_OR_META = {
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::expand_as", "aten::slice", "aten::select",
    "aten::unsqueeze", "aten::squeeze", "aten::detach", "aten::alias", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::narrow", "aten::reshape", "aten::_reshape_alias", "aten::lift_fresh",
    "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::view_as",
    "aten::unbind", "aten::numpy_T", "aten::contiguous", "aten::to", "aten::detach_",
    "aten::set_", "aten::resize_", "aten::_has_compatible_shallow_copy_type", "aten::lift",
    "aten::flatten", "aten::is_same_size", "aten::_local_scalar_dense", "aten::item",
    "aten::size", "aten::stride", "aten::is_nonzero", "aten::broadcast_tensors",
}
DT = torch.bfloat16


def meta_only(e):
    """True when `e` and everything nested in it is a view, allocation or metadata op."""
    return e.name in VIEW_OR_META and all(meta_only(c) for c in e.cpu_children)


def launches_kernel(e):
    """A compute op that would launch a device kernel: an `aten::` event that is not a view,
    allocation or metadata op and calls nothing but such ops (CPU kernels often allocate
    their output through nested `empty` / `resize_` calls)."""
    return (
        e.name.startswith("aten::")
        and e.name not in VIEW_OR_META
        and all(meta_only(c) for c in e.cpu_children)
    )


def count(prof):
    """(all events, compute events that would launch a kernel) of one profiled region."""
    evs = prof.events()
    return len(evs), sum(1 for e in evs if launches_kernel(e))


def device_path(prof):
    """Events a device backend with fused foreach kernels records: everything but what the
    CPU fallback of `aten::_foreach_*` nests inside it (its per-tensor loop; on CUDA / NPU a
    `_foreach_*` call launches its multi-tensor kernels without nested aten calls)."""

    def inside_foreach(e):
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::_foreach_"):
                return True
            p = p.cpu_parent
        return False

    return sum(1 for e in prof.events() if not inside_foreach(e))


def profiled(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    return count(prof), out


def stub_input(shape, dtype=DT):
    """A non-leaf input, as a module inside a model receives it."""
    x0 = torch.randn(*shape, dtype=dtype, requires_grad=True)
    return x0 * 1


def zero_grads(params):
    for p in params:
        p.grad = None


def outputs_and_grads(out, grad_like):
    """The differentiable outputs of a forward and their incoming gradients (ones)."""
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    grads = [torch.ones_like(o) if grad_like is None else grad_like(o) for o in outs]
    return outs, grads


def passes(fwd, params, in_shapes, grad_like=None, ckpt=True):
    """fwd/bwd/recompute events and leaf kernels of `fwd(*inputs)` (inputs non-leaf)."""
    res = {}
    for rep in range(2):  # the first run initialises lazily; keep the second
        zero_grads(params)
        xs = [stub_input(s) for s in in_shapes]
        (fe, fk), out = profiled(lambda: fwd(*xs))
        out, g = outputs_and_grads(out, grad_like)
        (be, bk), _ = profiled(lambda: torch.autograd.backward(out, g))
        res = {"inputs": len(in_shapes), "fwd": fe, "fwd_kernels": fk, "bwd": be,
               "bwd_kernels": bk}
    if ckpt:
        for rep in range(2):
            zero_grads(params)
            xs = [stub_input(s) for s in in_shapes]
            (cfe, _), out = profiled(lambda: checkpoint(fwd, *xs, use_reentrant=False))
            out, g = outputs_and_grads(out, grad_like)
            (cbe, cbk), _ = profiled(lambda: torch.autograd.backward(out, g))
        res["ckpt_fwd"] = cfe
        res["recompute"] = cbe - res["bwd"]
        res["recompute_kernels"] = cbk - res["bwd_kernels"]
    return res


def rotary(cfg, b, s):
    rot = qm.Qwen3MoeRotaryEmbedding(cfg)
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    cos, sin = rot(torch.zeros(1, dtype=DT), pos)
    return cos.to(DT), sin.to(DT)


def moe_config(hidden, mlp_only):
    cfg = Qwen3MoeConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=hidden // 4, num_experts=8, num_experts_per_tok=2,
        mlp_only_layers=[0] if mlp_only else [],
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def measure(hidden, seq):
    torch.manual_seed(0)
    b = 2
    cfg = moe_config(hidden, True)
    cos, sin = rotary(cfg, b, seq)
    h = (b, seq, hidden)
    out = {}

    out["input_stub"] = passes(lambda x: x, [], [h], ckpt=False)

    lin = nn.Linear(hidden, 3 * hidden, bias=False).to(DT)
    out["linear"] = passes(lin, list(lin.parameters()), [h])

    norm = qm.Qwen3MoeRMSNorm(hidden).to(DT)
    out["rms_norm"] = passes(norm, list(norm.parameters()), [h])

    out["residual"] = passes(lambda x, y: x + y, [], [h, h])

    attn = qm.Qwen3MoeAttention(cfg, 0).to(DT)
    ap = list(attn.parameters())
    out["gqa_self_attn"] = passes(lambda x: attn(x, (cos, sin), None)[0], ap, [h])

    heads, kvh, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qs, ks = (b, heads, seq, hd), (b, kvh, seq, hd)
    out["rope_qk"] = passes(
        lambda q, k: qm.apply_rotary_pos_emb(q, k, cos, sin), [], [qs, ks])

    def core(q, k, v):
        o, _ = qm.ALL_ATTENTION_FUNCTIONS["sdpa"](attn, q, k, v, None, scaling=attn.scaling)
        return o.reshape(b, seq, -1).contiguous()

    out["attention_core"] = passes(core, [], [qs, ks, ks])

    mlp = qm.Qwen3MoeMLP(cfg).to(DT)
    out["dense_mlp"] = passes(mlp, list(mlp.parameters()), [h])
    out["swiglu"] = passes(lambda g, u: F.silu(g) * u, [], [(b, seq, 2 * hidden)] * 2)

    mcfg = moe_config(hidden, False)
    router = qm.Qwen3MoeTopKRouter(mcfg).to(DT)
    nn.init.normal_(router.weight)
    out["qwen3_moe_router"] = passes(
        lambda x: router(x.view(-1, hidden))[1], list(router.parameters()), [h])

    emb = nn.Embedding(64, hidden).to(DT)
    ids = torch.randint(0, 64, (b, seq))
    out["embedding"] = passes(lambda: emb(ids), list(emb.parameters()), [])

    labels = torch.randint(0, 64, (b, seq))
    out["causal_lm_loss"] = passes(
        lambda lg: ForCausalLMLoss(lg, labels, 64), [], [(b, seq, 64)],
        grad_like=lambda o: torch.ones_like(o), ckpt=False)

    layer = qm.Qwen3MoeDecoderLayer(cfg, 0).to(DT)
    lp = list(layer.parameters())
    out["qwen3_moe_layer_dense_mlp"] = passes(
        lambda x: layer(x, position_embeddings=(cos, sin)), lp, [h])

    dcfg = Qwen3Config(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=hidden // 4)
    dcfg._attn_implementation = "sdpa"
    dlayer = Qwen3DecoderLayer(dcfg, 0).to(DT)
    out["qwen3_layer"] = passes(
        lambda x: dlayer(x, position_embeddings=(cos, sin)), list(dlayer.parameters()), [h])

    out.update(optimizers(hidden))
    return out


def opt_step_events(make, n, hidden):
    ps = [nn.Parameter(torch.randn(hidden + i, hidden, dtype=torch.float32)) for i in range(n)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = make(ps)
    opt.step()  # state initialisation
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt.step()
    e, k = count(prof)
    return e, k, device_path(prof)


def optimizers(hidden):
    """AdamW (foreach) and per-matrix Muon step events: fixed + per parameter."""
    out = {}
    makes = {
        "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
        "muon_per_matrix": lambda ps: torch.optim.Muon(ps, lr=1e-3, ns_steps=5),
    }
    for name, make in makes.items():
        e4, k4, t4 = opt_step_events(make, 4, hidden)
        e8, k8, t8 = opt_step_events(make, 8, hidden)
        e12, k12, t12 = opt_step_events(make, 12, hidden)
        per, perk, pert = (e8 - e4) // 4, (k8 - k4) // 4, (t8 - t4) // 4
        if (e12 - e8, k12 - k8, t12 - t8) != (e8 - e4, k8 - k4, t8 - t4) or (e8 - e4) % 4:
            raise SystemExit(f"{name}: events not linear in the parameter count")
        out[name] = {"fixed": e4 - 4 * per, "per_param": per,
                     "fixed_kernels": k4 - 4 * perk, "per_param_kernels": perk,
                     "fixed_device_path": t4 - 4 * pert, "per_param_device_path": pert}
    return out


def host_us_per_event():
    """Host time per event on this CPU, like for like: the validation probe's hand-written
    GQA attention forward (tools/validation_census_probe.py) on plain tensors (production:
    time / events) and on its DTensor stand-in (validation: extra time / extra events), at
    tiny sizes so the host dominates, autograd recording as in training. Evidence for (not a
    calibration of) whether production and validation events cost the host alike: the ratio
    carries over to another host CPU, the absolute values do not."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "vprobe", os.path.join(here, "validation_census_probe.py"))
    vp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vp)
    torch.manual_seed(0)
    b, s, hidden, heads, kv, hd = 1, 4, 64, 4, 2, 16
    r = lambda *shape: torch.randn(*shape, requires_grad=True)
    cos, sin = vp.plain(torch.randn(b, s, hd)), vp.plain(torch.randn(b, s, hd))
    p = {"q": r(heads * hd, hidden), "k": r(kv * hd, hidden), "v": r(kv * hd, hidden),
         "o": r(hidden, heads * hd), "q_norm": r(hd), "k_norm": r(hd)}
    x = r(b, s, hidden)
    plain_args = [x, p]
    wrapped_args = vp.wrap_all(plain_args)
    fn = lambda h, pp: vp.gqa_attention(h, pp, cos, sin, hd)

    def per_call(args, reps=3000):
        for _ in range(100):
            fn(*args)
        t = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        return (time.perf_counter() - t) / reps * 1e6

    plain_events = vp.events(lambda: fn(*plain_args))
    wrapped_events = vp.events(lambda: fn(*wrapped_args))
    runs = []
    for _ in range(9):  # the median of nine: robust to a disturbed run on a shared host
        t_plain, t_wrapped = per_call(plain_args), per_call(wrapped_args)
        runs.append((t_plain / plain_events,
                     (t_wrapped - t_plain) / (wrapped_events - plain_events)))
    runs.sort(key=lambda r: r[1] / r[0])
    best = runs[len(runs) // 2]
    return {"production_us_per_event": round(best[0], 3),
            "validation_us_per_extra_event": round(best[1], 3),
            "validation_over_production": round(best[1] / best[0], 3),
            "production_events": plain_events,
            "validation_extra_events": wrapped_events - plain_events}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="plan/tests/fixtures")
    a = ap.parse_args()
    torch.set_num_threads(1)
    small, large = measure(64, 8), measure(128, 16)
    if small != large:
        diff = {k: (small[k], large.get(k)) for k in small if small[k] != large.get(k)}
        raise SystemExit(f"counts depend on the sizes: {diff}")
    timing = host_us_per_event()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "host_census_torch.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Generated by tools/host_census_probe.py: production-mode profiler CPU operator\n")
        f.write("# events per module and pass (fwd, bwd, recompute) of the real HF modules on plain\n")
        f.write("# tensors, and how many are leaf compute ops (would launch a device kernel).\n")
        f.write("# Identical at hidden 64 / seq 8 and hidden 128 / seq 16 (checked by the probe).\n")
        f.write(f'torch = "{torch.__version__}"\ntransformers = "{transformers.__version__}"\n\n')
        for k, v in small.items():
            f.write(f"[{k}]\n")
            for kk, vv in v.items():
                f.write(f"{kk} = {vv}\n")
            f.write("\n")
        f.write("# Host time per event on the probe's CPU (x86, torch CPU build): evidence, not a\n")
        f.write("# calibration; the A3's host CPU differs.\n[timing]\n")
        for k, v in timing.items():
            f.write(f"{k} = {v}\n")
    print(open(path, encoding="utf-8").read())


if __name__ == "__main__":
    main()

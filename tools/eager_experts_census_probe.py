#!/usr/bin/env python3
"""Census of transformers' `eager` routed-experts loop (`Qwen3MoeExperts.forward`,
`experts_implementation="eager"`) under the PyTorch profiler (NOT run in CI): what is per
expert hit, what is per layer, and which tensors scale with the tokens or with the whole
3-D expert parameter. program/src/strategy/eager_experts.rs carries these figures.

It runs the real module (fused 3-D parameters `gate_up_proj [E, 2I, H]`, `down_proj
[E, H, I]`, bf16) on plain CPU tensors, with the hidden states and the routing weights
non-leaf inputs that require grad (as the router hands them over in a model), every expert
hit (token t routes to experts t mod E and t+1 mod E), for E = 4 and 8 experts at two sizes
(hidden 128 / 256, 32 / 64 tokens). Per expert = (E=8 - E=4) / 4, per layer = E=4 - 4 x per
expert. It fails unless both sizes give the same counts (the counts follow the code path,
not the sizes).

Counted like tools/host_census_probe.py: `events` = every profiler CPU operator event (aten
ops with their nested calls; in backward the autograd engine's `evaluate_function` nodes and
`AccumulateGrad`); `kernel ops` = leaf compute ops (`launches_kernel`: not a view, allocation
or metadata op, calling only such ops; GEMMs (`aten::mm`) count); `syncs` =
`aten::_local_scalar_dense` (a device -> host read-back on an accelerator) and `aten::nonzero`
(on CUDA it copies its count to the host and waits for it: a sync without a
`_local_scalar_dense` event).

Forward events are cut into the ops the simulator emits by the code order of one loop
iteration: `gate_up` (the `expert_idx == num_experts` test, `torch.where`, the hidden-state
gather, `gate_up_proj[e]`, `linear`, `chunk`), `act` (`silu`, `* up`), `down`
(`down_proj[e]`, `linear`), `combine` (the routing-weight gather, `*`, `.to`,
`index_add_`); backward events by the autograd node that records them (the accumulation of
a gradient used by several experts is recorded under the node that produces it).

Measured output (transformers 5.17.0, torch 2.15.0 CPU backend, x86; hidden 128 / 32 tokens
and hidden 256 / 64 tokens give identical counts):

    fwd events: per expert 76 = gate_up 46 (44 + the 2 of `expert_hit`'s unbind) + act 2
      + down 12 + combine 16; per layer 30
    fwd syncs: per expert 4 `_local_scalar_dense` (`expert_idx == num_experts` as a bool;
      `expert_mask[e]`, `gate_up_proj[e]`, `down_proj[e]`: a 0-d tensor index is read back as
      an int) + 1 `nonzero` (`torch.where`); per layer 1 `nonzero` (`expert_hit`) + 2
      `_local_scalar_dense` of `one_hot`'s range check, which is CPU-only (ATen Onehot.cpp: on
      CUDA "rely on device assert thrown by scatter")
    fwd kernel ops per expert: eq 1, mm 2, index 2, silu 1, mul 2, plus CPU-only zero_ 1
      (`index_add_`'s `scatter_add_` decomposition) and as_strided_ 1 (`nonzero`'s resize);
      per layer: zero_ 2 (`zeros_like`, `one_hot`'s zeros), scatter_ 1, gt 1, fill_ 3
      (`sum`'s init and `one_hot`'s CPU-only `aminmax`), as_strided_ 1
    bwd events: per expert 123 = gate_up 48 + act 7 + down 34 + combine 34; per layer 30
    bwd syncs: 0
    bwd kernel ops per expert: mm 4, fill_ 3 (two select_backward zeros, `sum`'s init),
      zero_ 2 (the two index backwards' zeros), copy_ 2, add_ 4, mul 4, silu_backward 1,
      index_select 1, _index_put_impl_ 2, cat 1 (new_empty 2 allocate only); per layer
      add_ -5 and add +1 (the first gradient of each accumulated tensor is stored, not added)
    bwd shapes at E=8, hidden 256, 64 tokens, top-2 (I = 128):
      fill_/zero_ [8, 256, 256] x8 and [8, 256, 128] x8   select_backward's full zeros
      copy_ [256, 256] x8 and [256, 128] x8                the expert's slice into them
      add_ [8, 256, 256] x7 and [8, 256, 128] x7           full-size accumulation
      zero_ [64, 256] x8, add_ [64, 256] x7                hidden-state index backward
      zero_ [64, 2, 1] x8, add_ [64, 2] x6                 routing-weight index backward

The GEMMs' shapes: forward `[n_e, H] x [H, 2I]` and `[n_e, I] x [I, H]` (n_e the expert's
tokens); backward each one's data and weight gradient.

Usage (CPU is enough):
    /tmp/memenv/bin/python tools/eager_experts_census_probe.py
"""

import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_census_probe import launches_kernel  # noqa: E402

import transformers  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe as qm  # noqa: E402
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig  # noqa: E402

DT = torch.bfloat16
TOP_K = 2
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")


def experts_module(n_experts, hidden, implementation="eager"):
    """The real `Qwen3MoeExperts` (bf16, small random weights) on `implementation`'s path."""
    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=hidden // 2,
                         num_experts=n_experts, num_experts_per_tok=TOP_K)
    cfg._experts_implementation = implementation
    m = qm.Qwen3MoeExperts(cfg).to(DT)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return m


def inputs(n_experts, hidden, tokens):
    """Non-leaf hidden states and routing weights; every expert hit."""
    h = (torch.randn(tokens, hidden, dtype=DT, requires_grad=True) * 1)
    w = (torch.rand(tokens, TOP_K, dtype=DT, requires_grad=True) * 1)
    t = torch.arange(tokens)
    idx = torch.stack([(t + j) % n_experts for j in range(TOP_K)], 1)
    return h, idx, w


def nested(e):
    """`e` and every event nested in it."""
    out = [e]
    for c in e.cpu_children:
        out.extend(nested(c))
    return out


def tops(prof):
    return [e for e in prof.events() if e.cpu_parent is None]


def fwd_parts(top):
    """Forward top-level events cut into (`layer`, `gate_up`, `act`, `down`, `combine`) by
    one loop iteration's code order; returns event counts per part."""
    parts = collections.Counter()
    part = "layer"
    for e in top:
        n = e.name
        if n == "aten::select" and part in ("layer", "combine") and _is_loop_start(e):
            part = "gate_up"
        elif n == "aten::silu":
            part = "act"
        elif n == "aten::item" and part == "act":
            part = "down"
        elif n == "aten::unsqueeze" and part == "down":
            part = "combine"
        parts[part] += len(nested(e))
    return parts


def _is_loop_start(e):
    # `expert_idx = expert_idx[0]`: a select of the one-element row of `expert_hit`.
    return bool(e.input_shapes) and e.input_shapes[0] == [1]


BWD_PART = {
    "IndexAddBackward0": "combine", "MulBackward0#1": "combine", "UnsqueezeBackward0": "combine",
    "IndexBackward0#1": "combine", "ToCopyBackward0": "combine",
    "MmBackward0#1": "down", "TBackward0#1": "down", "SelectBackward0#1": "down",
    "MulBackward0#2": "act", "SiluBackward0": "act", "SplitBackward0": "gate_up",
    "MmBackward0#2": "gate_up", "TBackward0#2": "gate_up", "SelectBackward0#2": "gate_up",
    "IndexBackward0#2": "gate_up",
}


def bwd_parts(top):
    """Backward top-level events by the autograd node that records them. Nodes run expert
    by expert (descending sequence numbers: the last expert's chain first); within one
    expert the n-th node of a name is `name#n`. `AccumulateGrad` and anything outside a
    node go to `layer`."""
    parts = collections.Counter()
    seen = collections.Counter()
    for e in top:
        n = e.name
        key = "layer"
        if "evaluate_function: " in n:
            node = n.split("evaluate_function: ")[1]
            if node == "IndexAddBackward0":
                seen.clear()
            seen[node] += 1
            key = BWD_PART.get(node, BWD_PART.get(f"{node}#{seen[node]}", "layer"))
        parts[key] += len(nested(e))
    return parts


def shapes(events, names):
    return collections.Counter(
        (e.name, tuple(e.input_shapes[0]) if e.input_shapes and e.input_shapes[0] else ())
        for e in events if e.name in names)


def census(n_experts, hidden, tokens):
    m = experts_module(n_experts, hidden)
    res = {}
    for rep in range(2):  # the first run initialises lazily; keep the second
        m.zero_grad(set_to_none=True)
        h, idx, w = inputs(n_experts, hidden, tokens)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as pf:
            out = m(h, idx, w)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as pb:
            out.backward(torch.ones_like(out))
        for name, prof, parts in (("fwd", pf, fwd_parts), ("bwd", pb, bwd_parts)):
            evs = list(prof.events())
            res[name] = {
                "events": len(evs),
                "parts": parts(tops(prof)),
                "kernels": collections.Counter(e.name for e in evs if launches_kernel(e)),
                "syncs": collections.Counter(e.name for e in evs if e.name in SYNC_OPS),
                "big": shapes(evs, {"aten::fill_", "aten::zero_", "aten::copy_", "aten::add_"}),
            }
    return res


def split(a, b):
    """(per expert, per layer) of counters measured at 4 and 8 experts."""
    keys = set(a) | set(b)
    per = {k: (b[k] - a[k]) / 4 for k in keys}
    fixed = {k: a[k] - 4 * per[k] for k in keys}
    return ({k: v for k, v in sorted(per.items()) if v},
            {k: v for k, v in sorted(fixed.items()) if v})


def summary(hidden, tokens):
    a, b = census(4, hidden, tokens), census(8, hidden, tokens)
    out = {}
    for ph in ("fwd", "bwd"):
        out[ph] = {
            "events": split({"all": a[ph]["events"]}, {"all": b[ph]["events"]}),
            "parts": split(a[ph]["parts"], b[ph]["parts"]),
            "kernels": split(a[ph]["kernels"], b[ph]["kernels"]),
            "syncs": split(a[ph]["syncs"], b[ph]["syncs"]),
        }
    return out, b


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    small, _ = summary(128, 32)
    large, b = summary(256, 64)
    for ph in ("fwd", "bwd"):
        for what in ("events", "parts", "kernels", "syncs"):
            per, fixed = large[ph][what]
            print(f"{ph} {what}: per expert {per}; per layer {fixed}")
    print("bwd fill_/zero_/copy_/add_ shapes at E=8, hidden 256, 64 tokens, top-2:")
    for (name, shape), n in sorted(b["bwd"]["big"].items()):
        print(f"    {name} {list(shape)} x{n}")
    if small != large:
        sys.exit(f"counts differ between sizes:\n{small}\n{large}")
    print("both sizes give identical counts")


if __name__ == "__main__":
    main()

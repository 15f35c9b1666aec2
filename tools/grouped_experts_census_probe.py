#!/usr/bin/env python3
"""Census of transformers' `grouped_mm` routed-experts path (`Qwen3MoeExperts.forward` with
`experts_implementation="grouped_mm"`: `grouped_mm_experts_forward` in
transformers/integrations/moe.py) under the PyTorch profiler (NOT run in CI).
program/src/strategy/host_events.rs carries the result as GROUPED_MM_EXPERTS_PER_LAYER.

It runs the real module (fused 3-D parameters, bf16) on plain CPU tensors with non-leaf
hidden states and routing weights, every expert hit, at 4 and 8 experts and two sizes
(hidden 128 / 32 tokens, hidden 256 / 64 tokens), and counts every profiler CPU operator
event of the forward and of the backward (the autograd engine's nodes, their aten calls,
`AccumulateGrad`), counted like tools/host_census_probe.py.

On the CPU backend `grouped_mm` loops over the experts (per-group `mm`, `select`, `slice`,
`as_strided`, `resolve_conj` and a read-back of the offsets), so the counts grow with the
experts; on CUDA `grouped_mm` is one kernel. The census is the count at 4 experts minus 4 x the
per-expert growth (8 experts - 4 experts) / 4. The script prints the names that grow, so
that one can check they are the CPU loop's and nothing else.

Measured output (transformers 5.17.0, torch 2.15.0 CPU backend, x86):

    hidden 128: fwd per expert 26, per layer 117; bwd per expert 54, per layer 174
    hidden 256: fwd per expert 26, per layer 117; bwd per expert 54, per layer 178
    growing per expert, fwd: as_strided 8, select 4, slice 4, resolve_conj 4, mm 2, item 2,
      _local_scalar_dense 2 (bwd: twice as many, resolve_conj 10)

Usage (CPU is enough):
    /tmp/memenv/bin/python tools/grouped_experts_census_probe.py
"""

import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eager_experts_census_probe import DT, TOP_K, experts_module  # noqa: E402


def census(n_experts, hidden, tokens):
    """(forward, backward) event counters of one grouped_mm experts module call."""
    m = experts_module(n_experts, hidden, "grouped_mm")
    for _ in range(2):  # the first run initialises lazily; keep the second
        m.zero_grad(set_to_none=True)
        h = torch.randn(tokens, hidden, dtype=DT, requires_grad=True) * 1
        w = torch.rand(tokens, TOP_K, dtype=DT, requires_grad=True) * 1
        t = torch.arange(tokens)
        idx = torch.stack([(t + j) % n_experts for j in range(TOP_K)], 1)
        with profile(activities=[ProfilerActivity.CPU]) as pf:
            out = m(h, idx, w)
        with profile(activities=[ProfilerActivity.CPU]) as pb:
            out.backward(torch.ones_like(out))
    return (collections.Counter(e.name for e in pf.events()),
            collections.Counter(e.name for e in pb.events()))


def main():
    for hidden, tokens in ((128, 32), (256, 64)):
        four, eight = census(4, hidden, tokens), census(8, hidden, tokens)
        for name, a, b in (("fwd", four[0], eight[0]), ("bwd", four[1], eight[1])):
            per = (sum(b.values()) - sum(a.values())) / 4
            fixed = sum(a.values()) - 4 * per
            growing = {k: (b[k] - a[k]) / 4 for k in set(a) | set(b) if b[k] != a[k]}
            print(f"hidden {hidden}: {name} per expert {per:g}, per layer {fixed:g}; "
                  f"growing per expert: {dict(sorted(growing.items()))}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Measured bytes autograd saves for backward in the real HuggingFace modules (NOT run in CI).

Writes program/tests/fixtures/saved_activations_torch.toml, which program/tests/saved_activations.rs
replays against the formulas of program/src/strategy/saved_activations.rs.

What it measures: every tensor autograd keeps for backward during one training forward of
transformers' `Qwen3MoeForCausalLM` and `Qwen3ForCausalLM` (tiny configurations, bf16, SDPA
attention, grouped-mm experts, labels given so `ForCausalLMLoss` runs), caught with
`torch.autograd.graph.saved_tensors_hooks`. A tensor's bytes are those of its storage, and a
storage is counted once however often it is saved (views share storage; the same tensor saved
by two ops counts once). Parameters are not activations and are left out. Each saved storage is
attributed to the module whose forward first saved it: `embed` (the embedding), `layer<i>`
(decoder layer i: its input, norms, attention, MLP or MoE block), `shared` (the rotary
cos/sin computed once per forward and saved by every layer's RoPE) and `head` (final norm,
`lm_head`, the f32 upcast and cross entropy of `ForCausalLMLoss`).

It also measures a layer under `torch.utils.checkpoint` (non-reentrant, what
`gradient_checkpointing_enable(use_reentrant=False)` uses): what the checkpointed layer keeps
from forward to backward.

Two sizes per model let the Rust side check its formula in hidden, heads, kv heads, head_dim,
intermediate, moe_intermediate, experts, top_k and tokens, not one fitted number.

Usage (CPU is enough):
    /tmp/torchenv/bin/python tools/saved_activations_probe.py [--out plan/tests/fixtures]
"""

import argparse
import os

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

SIZES = {
    # name: (hidden, heads, kv_heads, head_dim, intermediate, moe_intermediate, experts, top_k,
    #        vocab, batch, seq)
    "moe_small": (64, 4, 2, 16, 96, 32, 8, 2, 256, 2, 32),
    "moe_large": (96, 6, 2, 32, 160, 48, 16, 4, 384, 2, 48),
    "dense_small": (64, 4, 2, 16, 96, 0, 0, 0, 256, 2, 32),
    "dense_large": (96, 6, 3, 32, 224, 0, 0, 0, 384, 2, 48),
}


def build(name):
    """A two-layer model of size `name`, bf16, SDPA attention, grouped-mm experts."""
    hidden, heads, kv, hd, inter, moe_inter, experts, top_k, vocab, _, _ = SIZES[name]
    common = dict(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        intermediate_size=inter,
        num_hidden_layers=2,
        vocab_size=vocab,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="sdpa",
    )
    if experts:
        cfg = Qwen3MoeConfig(
            moe_intermediate_size=moe_inter,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            output_router_logits=False,
            experts_implementation="grouped_mm",
            **common,
        )
        model = Qwen3MoeForCausalLM(cfg)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    return model.to(torch.bfloat16).train()


class SavedCensus:
    """Storages autograd saves, deduplicated, attributed to the current scope."""

    def __init__(self, model):
        self.scope = "pre"
        self.first_scope = {}
        self.bytes = {}
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.params or key in self.first_scope:
            return t
        self.first_scope[key] = self.scope
        self.bytes[self.scope] = self.bytes.get(self.scope, 0) + storage.nbytes()
        return t

    def set_scope(self, scope):
        def hook(*_):
            self.scope = scope

        return hook


def census(name, checkpoint):
    """Saved bytes per scope of one forward with labels (the loss included)."""
    torch.manual_seed(0)
    model = build(name)
    if checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    c = SavedCensus(model)
    inner = model.model
    inner.embed_tokens.register_forward_pre_hook(c.set_scope("embed"))
    inner.embed_tokens.register_forward_hook(c.set_scope("shared"))
    for i, layer in enumerate(inner.layers):
        layer.register_forward_pre_hook(c.set_scope(f"layer{i}"))
        layer.register_forward_hook(c.set_scope("shared"))
    inner.norm.register_forward_pre_hook(c.set_scope("head"))
    *_, vocab, batch, seq = SIZES[name]
    ids = torch.randint(0, vocab, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(c.pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return c.bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="plan/tests/fixtures")
    args = ap.parse_args()
    lines = [
        "# Generated by tools/saved_activations_probe.py: bytes autograd saves for backward",
        "# (storages deduplicated, parameters excluded) in one training forward of the real",
        "# HF modules, bf16, SDPA attention, grouped-mm experts, micro batch `batch` x `seq`.",
        f'torch = "{torch.__version__}"',
        f'transformers = "{transformers.__version__}"',
        "",
    ]
    keys = "hidden heads kv_heads head_dim intermediate moe_intermediate experts top_k vocab".split()
    for name in SIZES:
        dims = SIZES[name]
        plain = census(name, checkpoint=False)
        ckpt = census(name, checkpoint=True)
        lines.append(f"[{name}]")
        for k, v in zip(keys + ["batch", "seq"], dims):
            lines.append(f"{k} = {v}")
        for scope in ("embed", "shared", "layer0", "layer1", "head"):
            lines.append(f"saved_{scope}_bytes = {plain.get(scope, 0)}")
        lines.append(f"checkpointed_layer0_bytes = {ckpt.get('layer0', 0)}")
        lines.append(f"checkpointed_layer1_bytes = {ckpt.get('layer1', 0)}")
        lines.append("")
        print(name, "plain", plain, "checkpointed", ckpt)
    path = os.path.join(args.out, "saved_activations_torch.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print("wrote", path)


if __name__ == "__main__":
    main()

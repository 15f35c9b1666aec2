"""CPU replica of the H200 harness step (shared/calibration/h200/harness/train.py): PyTorch
FSDP2 on a one-rank gloo group, fp32 master weights, bf16 params, fp32 reduce, AdamW foreach,
HF transformers model from the harness's config. Prints the forward / backward / optimizer
peaks of live bytes above the step's start, from the profiler's memory events, to check the
simulator's memory model (activations, the HF loss's working memory, FSDP2 buffers) without a
GPU. Usage: python3 tools/fsdp2_memory_replica_probe.py qwen3-1.7b.json LAYERS SEQ [experts]
(VOCAB=n shrinks the vocabulary, THREADS=n sets torch threads). Measured 2026-11-28 with
torch 2.15.0 and transformers 5.17.0 (qwen3-1.7b.json, peaks above the start, GB):
L1 T512 bwd 5.18; L2 T512 bwd 5.38; L1 T1024 fwd 2.93 bwd 5.18; VOCAB=8192 L2 T4096 bwd
1.463; VOCAB=8192 L4 T4096 bwd 2.387; L1 T4096 fwd 8.00 bwd 9.24. The simulator gives the
same figures for the same scenarios."""
import json, os, sys, time
import torch, torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
torch.set_num_threads(int(os.environ.get("THREADS", 2)))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29531")
dist.init_process_group("gloo", rank=0, world_size=1)
model_file, layers, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
experts = sys.argv[4] if len(sys.argv) > 4 else None
here = os.path.dirname(os.path.abspath(__file__))
d = json.load(open(os.path.join(here, "..", "scenarios", "models", model_file)))
d["num_hidden_layers"] = layers; d["tie_word_embeddings"] = False; d.pop("torch_dtype", None); d.pop("dtype", None)
if os.environ.get("VOCAB"): d["vocab_size"] = int(os.environ["VOCAB"])
cfg = AutoConfig.for_model(d.pop("model_type"), **d)
kw = dict(attn_implementation="sdpa")
if experts: kw["experts_implementation"] = experts
m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kw).float().train()
n = sum(p.numel() for p in m.parameters())
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in m.model.layers: fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
fully_shard(m, mp_policy=mp)
opt = torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.1)
ids = torch.randint(0, cfg.vocab_size, (1, seq))
def step():
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
step()
from torch.profiler import profile, ProfilerActivity, record_function
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    with record_function("FWD"):
        loss = m(input_ids=ids, labels=ids).loss
    with record_function("BWD"):
        loss.backward()
    with record_function("OPT"):
        opt.step(); opt.zero_grad(set_to_none=True)
prof.export_chrome_trace("/tmp/memtrace.json")
t = json.load(open("/tmp/memtrace.json"))
ev = t["traceEvents"]
mem = sorted([e for e in ev if e.get("name") == "[memory]"], key=lambda e: e["ts"])
ann = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") in ("FWD", "BWD", "OPT") and e.get("ph") == "X"}
live = 0; peak = {"FWD": 0, "BWD": 0, "OPT": 0}; start_total = None
for e in mem:
    a = e["args"]; live += a.get("Bytes", 0)
    tot = a.get("Total Allocated")
    if start_total is None and tot is not None: start_total = tot - a.get("Bytes", 0)
    for k, (s, f) in ann.items():
        if s <= e["ts"] <= f: peak[k] = max(peak[k], live)
print(json.dumps(dict(model=model_file, layers=layers, seq=seq, params=n, start_total_bytes=start_total,
    peak_above_start=peak, params_x12=12 * n)))

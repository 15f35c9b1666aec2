"""Which earlier run's tensors are still allocated while a run of the H200 harness is measured?

Runs shared/calibration/h200/harness/train.py's `run()` unmodified, in its plan order and in one
process as train.py does, on CPU with QUICK=1 (the same modules, hooks and layer counts, tiny
widths: the Python object graph, and so the cyclic garbage collector's timing, is the real
one's). Logs every full (generation 2) collection and the moment each run's model is freed,
and for each run which earlier models are alive at the start and end of its timed steps.

Why it matters: run() ends with gc.collect() while its own model and optimizer are still
referenced; FSDP2's module hooks put the model in reference cycles, so when run() returns its
fp32 parameters (4 B per parameter; the optimizer's moments are freed by reference counting)
survive until the next full collection. The peak memory the next run reports then includes
them. Measured 2026-11-28 (torch 2.15.0 CPU, transformers 5.17.0, Python 3.11.7), all nine
tags: every run's timed steps ran with the previous run's model alive, and only it; the
previous model was freed during the next run's profiled step (after its peak was read); the
first run carried nothing. With the three held-in tags only (`harness_gc_probe.py
dense14b-8l-mbs1 dense1p7b-28l-mbs1 moe30b-4l-mbs1-grouped`): the 1.7B run's timed steps
carried the 14B model, the MoE run's the 1.7B model. A 2-layer quick run left 6,822,156 B allocated after run()
returned: its 1,705,472 parameters x 4 B plus 268 B of buffers.

Usage: python3 tools/harness_gc_probe.py [TAG ...]   (needs torch and transformers; HARNESS=dir
overrides the harness location; not run in CI)."""
import os, sys, gc, json, weakref, time
HARNESS = os.environ.get("HARNESS", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "..", "..", "shared", "calibration", "h200", "harness"))
os.environ.update(DEVICE="cpu", QUICK="1", OUT=os.environ.get("OUT", "/tmp/harness-gc-probe"))
sys.path.insert(0, HARNESS)
ONLY = sys.argv[1:]
sys.argv = ["train.py", "all"]
import torch
import train
log = []
state = {"run": None, "phase": "import"}
def cb(phase, info):
    if phase == "stop" and info["generation"] == 2:
        log.append(("gen2", state["run"], state["phase"], info["collected"]))
gc.callbacks.append(cb)
alive = {}
orig_build = train.build
def build(cfg, experts):
    m = orig_build(cfg, experts)
    tag = state["run"]
    alive[tag] = True
    weakref.finalize(m, lambda t=tag: (alive.__setitem__(t, False), log.append(("freed", t, state["run"], state["phase"]))))
    state["phase"] = "built"
    return m
train.build = build
def reset(*a, **k):  # the harness resets the peak at a run's start and before its timed steps
    if state["phase"] == "build":
        return
    state["phase"] = "timed"
    log.append(("timed-start", state["run"], [t for t, v in alive.items() if v and t != state["run"]]))
torch.cuda.reset_peak_memory_stats = reset
def maxmem(*a, **k):
    if state["phase"] == "timed":
        log.append(("timed-end", state["run"], [t for t, v in alive.items() if v and t != state["run"]]))
        state["phase"] = "profiled"
    return 0
torch.cuda.max_memory_allocated = torch.cuda.max_memory_reserved = maxmem
orig_run = train.run
def run(tag, *a, **k):
    state["run"] = tag; state["phase"] = "build"
    return orig_run(tag, *a, **k)
train.run = run
seq = 256
order = [("dense14b-8l-mbs1", "qwen3-14b.json", 8, 1, 1, seq, False, None),
        ("dense14b-8l-mbs2", "qwen3-14b.json", 8, 2, 1, seq, False, None),
        ("dense14b-8l-mbs2-recompute", "qwen3-14b.json", 8, 2, 1, seq, True, None),
        ("dense14b-8l-mbs1-accum2", "qwen3-14b.json", 8, 1, 2, seq, False, None),
        ("dense1p7b-28l-mbs1", "qwen3-1.7b.json", 28, 1, 1, seq, False, None),
        ("dense1p7b-28l-mbs4", "qwen3-1.7b.json", 28, 4, 1, seq, False, None),
        ("dense4b-36l-mbs1", "qwen3-4b.json", 36, 1, 1, seq, False, None),
        ("moe30b-4l-mbs1-grouped", "qwen3-30b-a3b.json", 4, 1, 1, seq, False, "grouped_mm"),
        ("moe30b-4l-mbs1-eager", "qwen3-30b-a3b.json", 4, 1, 1, seq, False, "eager")]
only = ONLY or [p[0] for p in order]  # tags to run, always in plan order (as train.py)
for p in order:
    if p[0] in only:
        train.run(*p)
for e in log:
    print(e)

#!/usr/bin/env python3
"""One profiled FSDP2 step of one harness run, alone in its process, with its Chrome trace:
what the next GPU lease needs to settle what the H200 calibration leaves open
(docs/calibration.md "The H200 calibration": the MoE step's host-bound forward on machine A,
its 231 us q/o-projection casts). NOT run in CI; needs the GPU harness of
shared/calibration/h200/harness (its train.py builds the model exactly as the measured runs).

shared/calibration/h200/harness/profile_ops.py profiles three runs in one process and keeps
only the first one's trace; the harness's `run()` also leaves each model allocated into the
next run (tools/harness_gc_probe.py). This script runs one case per process and writes, into
$OUT (default ./out): ops-<tag>.csv and kernels-<tag>.csv in profile_ops.py's format,
trace-<tag>.json.gz, and host-<tag>.txt with the forward and backward host spans
(tools/h200_trace_host_phases.py on the trace).

    OUT=out python3 tools/h200_profile_one.py HARNESS_DIR moe30b-4l-mbs1-grouped
    (tags: dense14b-8l-mbs1, dense1p7b-28l-mbs1, moe30b-4l-mbs1-grouped)

A dry run on CPU (QUICK=1 DEVICE=cpu) checks the plumbing: small models, CPU activity only.
"""
import csv
import gzip
import os
import shutil
import subprocess
import sys

CASES = {
    "dense14b-8l-mbs1": ("qwen3-14b.json", 8, None),
    "dense1p7b-28l-mbs1": ("qwen3-1.7b.json", 28, None),
    "moe30b-4l-mbs1-grouped": ("qwen3-30b-a3b.json", 4, "grouped_mm"),
}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} HARNESS_DIR TAG   (TAG one of {', '.join(CASES)})")
    harness, tag = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.abspath(harness))
    sys.argv = sys.argv[:1]
    import torch
    import train  # the harness: model build, device, process group, OUT
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.profiler import ProfilerActivity, profile

    model_file, layers, experts = CASES[tag]
    cfg = train.load_cfg(model_file, layers)
    model = train.build(cfg, experts)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)
    seq = 256 if train.quick else 4096
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=train.dev)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([] if train.CPU else [ProfilerActivity.CUDA])
    with profile(activities=acts, record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    out = train.OUT
    write_tables(prof, torch, f"{out}/ops-{tag}.csv", f"{out}/kernels-{tag}.csv")
    raw = f"{out}/trace-{tag}.json"
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as a, gzip.open(raw + ".gz", "wb") as b:
        shutil.copyfileobj(a, b)
    os.remove(raw)
    phases = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h200_trace_host_phases.py")
    with open(f"{out}/host-{tag}.txt", "w") as f:
        subprocess.run([sys.executable, phases, raw + ".gz"], stdout=f, stderr=subprocess.STDOUT)
    print(tag, "ok:", out, flush=True)


def write_tables(prof, torch, ops_path, kernels_path):
    """profile_ops.py's two tables: ops by input shapes, kernels by name."""
    with open(ops_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "input_shapes", "calls", "self_cpu_us", "cpu_total_us",
                    "self_device_us", "device_total_us"])
        for e in prof.key_averages(group_by_input_shape=True):
            w.writerow([e.key, str(e.input_shapes)[:300], e.count, round(e.self_cpu_time_total, 1),
                        round(e.cpu_time_total, 1),
                        round(getattr(e, "self_device_time_total", 0.0), 1),
                        round(getattr(e, "device_time_total", 0.0), 1)])
    kern = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kern.setdefault(e.name[:200], [0, 0.0])
            k[0] += 1
            k[1] += e.device_time if hasattr(e, "device_time") else e.cuda_time
    with open(kernels_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "calls", "total_us", "mean_us"])
        for n, (c, t) in sorted(kern.items(), key=lambda x: -x[1][1]):
            w.writerow([n, c, round(t, 2), round(t / c, 3)])


if __name__ == "__main__":
    main()

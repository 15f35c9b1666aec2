#!/usr/bin/env python3
"""Host time of the forward and the backward in the dense 14B-shaped H200 step's trace.

Reads shared/calibration/h200/profiles/trace-dense14b-8l-mbs1.json.gz (a torch.profiler
Chrome trace of one FSDP2 step) and prints, per phase, the host thread's busy time and its
CPU operator events: the forward on the training thread (from its first event to the first
event of the autograd engine's thread), the backward on the engine's thread minus the time
it was blocked on a full launch queue ("Command Buffer Full") and minus `aten::_chunk_cat`'s
self time (charged per element by the cost model, `compute.chunk_cat_host_ps_per_element`).
These are the inputs of `calibration.host_backward_event_cost_ratio` in
scenarios/hardware/nvidia-h200-hgx.toml. Usage: tools/h200_trace_host_phases.py [TRACE]
"""
import collections
import gzip
import json
import sys

TRACE = "../shared/calibration/h200/profiles/trace-dense14b-8l-mbs1.json.gz"


def self_times(events):
    """Self time per event name (a parent's time minus its children's) on one thread."""
    events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    stack, out = [], collections.Counter()
    for e in events:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            out[stack[-1]["name"]] -= e["dur"]
        out[e["name"]] += e["dur"]
        stack.append(e)
    return out


def main():
    trace = json.load(gzip.open(sys.argv[1] if len(sys.argv) > 1 else TRACE))
    host = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in
            ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "overhead")]
    threads = collections.Counter(e["tid"] for e in host if e["cat"] == "cpu_op")
    # The training thread issues the step's first op; the engine's thread has the most ops.
    first = min((e for e in host if e["cat"] == "cpu_op"), key=lambda e: e["ts"])
    main_tid = first["tid"]
    others = [t for t in threads if t != main_tid]
    if not others:
        # CPU tensors: the autograd engine runs the backward on the calling thread.
        sys.exit("no autograd-engine thread in this trace (a CPU run backpropagates on the "
                 "training thread); the phases cannot be told apart by thread")
    engine_tid = max(others, key=lambda t: threads[t])
    blocked = [(e["ts"], e["ts"] + e["dur"]) for e in host if e["name"] == "Command Buffer Full"]
    engine = [e for e in host if e["tid"] == engine_tid]
    b0 = min(e["ts"] for e in engine)
    b1 = max(e["ts"] + e["dur"] for e in engine)
    m0 = min(e["ts"] for e in host if e["tid"] == main_tid)
    fwd = [e for e in host if e["tid"] == main_tid and e["ts"] < b0]

    def blocked_in(a, b):
        return sum(max(0, min(b, t1) - max(a, t0)) for t0, t1 in blocked)

    def launches(events):
        return sum(1 for e in events if e["cat"] in ("cuda_runtime", "cuda_driver")
                   and "Launch" in e["name"])

    chunk_cat = self_times(engine)["aten::_chunk_cat"]
    fwd_ms = (b0 - m0 - blocked_in(m0, b0)) / 1e3
    bwd_span = (b1 - b0) / 1e3
    bwd_blocked = blocked_in(b0, b1) / 1e3
    print(f"forward:  host span {fwd_ms:.2f} ms, {sum(e['cat'] == 'cpu_op' for e in fwd)} CPU ops, "
          f"{launches(fwd)} launches")
    print(f"backward: host span {bwd_span:.2f} ms, blocked on a full launch queue {bwd_blocked:.2f} ms, "
          f"_chunk_cat self {chunk_cat / 1e3:.2f} ms, busy otherwise "
          f"{bwd_span - bwd_blocked - chunk_cat / 1e3:.2f} ms, "
          f"{sum(e['cat'] == 'cpu_op' for e in engine)} CPU ops, {launches(engine)} launches")


if __name__ == "__main__":
    main()

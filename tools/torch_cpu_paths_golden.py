#!/usr/bin/env python3
"""Golden vectors from real PyTorch for torch's two x86 CPU bf16 GEMM paths (NOT run in CI).

Writes, beside the goldens of tools/torch_golden.py, under reference/tests/data/torch/:

  ns_cpu_paths.toml     torch.optim._muon._zeropower_via_newtonschulz (5 steps, and 1 step on
                        the small shapes) on shared seeded inputs, once per CPU path:
                          cpublas-avx2    ATEN_CPU_CAPABILITY=avx2, oneDNN off: what a CPU
                                          without AVX-512 runs (torch's native kernels)
                          cpublas-avx512  AVX-512 kernels, oneDNN off
                          onednn          this machine's defaults: oneDNN for bf16 GEMMs of more
                                          than 4096 multiply-adds when torch reports oneDNN bf16
                                          support (skipped, and said so, where it does not)
  muon_cpu_paths.toml   torch.optim.Muon, 3 chained steps, non-default hyper-parameters, per path.
  adamw_cancel.toml     torch.optim.AdamW (single-tensor; the foreach path is checked equal) on
                        parameters set before every step so that weight decay and the update
                        nearly cancel, with torch's own square root of the second moment.

Arrays are packed hex strings of IEEE bit patterns (bf16: 4 digits per value, f32: 8, f64: 16),
so nothing is lost to decimal printing. Every path runs in a subprocess because the CPU
capability is read when torch is imported.

Usage (CPU only; the CUDA wheel from PyPI works, the GPU is not used):
    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.15.0 numpy
    /tmp/torchenv/bin/python tools/torch_cpu_paths_golden.py [--out reference/tests/data/torch]
"""

import argparse
import json
import os
import platform
import struct
import subprocess
import sys

SEED = 20261124
PATHS = [
    ("cpublas-avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, False),
    ("cpublas-avx512", {"ATEN_CPU_CAPABILITY": "avx512"}, False),
    ("onednn", {}, True),
]
NS_SHAPES = [(12, 24), (20, 8), (5, 5), (1, 40), (40, 1), (64, 96), (128, 40), (257, 33), (33, 257)]
ONE_STEP_MAX = 400
MUON_SHAPES = [((24, 40), "original"), ((40, 24), "match_rms_adamw")]
MUON_HP = dict(lr=3e-2, weight_decay=0.05, momentum=0.9, nesterov=True, ns_steps=5, eps=1e-7)


def packed(t, dtype_name):
    import torch
    flat = t.detach().reshape(-1).contiguous()
    if dtype_name == "bf16":
        return "".join(format(b & 0xFFFF, "04x") for b in flat.view(torch.int16).tolist())
    if dtype_name == "f32":
        return "".join(format(struct.unpack("<I", struct.pack("<f", x))[0], "08x") for x in flat.tolist())
    return "".join(format(struct.unpack("<Q", struct.pack("<d", x))[0], "016x") for x in flat.tolist())


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def describe(torch, mkldnn_on):
    flags = cpu_flags()
    return {
        "torch_version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_enabled": mkldnn_on,
        "onednn_bf16_supported": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "cpu_avx512_bf16": "avx512_bf16" in flags,
        "cpu_avx512bw": "avx512bw" in flags,
        "machine": platform.machine(),
    }


def ns_inputs(torch):
    gen = torch.Generator().manual_seed(SEED)
    return [torch.randn(s, generator=gen, dtype=torch.float32).to(torch.bfloat16) for s in NS_SHAPES]


def worker(path, mkldnn_on):
    """Runs in the subprocess: every torch computation of one path, as JSON on stdout."""
    import torch
    import torch.optim._muon as muon_mod
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = mkldnn_on
    out = {"meta": describe(torch, mkldnn_on), "ns": [], "muon": []}
    coeffs = (3.4445, -4.7750, 2.0315)
    for g in ns_inputs(torch):
        entry = {"out5": packed(muon_mod._zeropower_via_newtonschulz(g, coeffs, 5, 1e-7), "bf16")}
        if g.numel() <= ONE_STEP_MAX:
            entry["out1"] = packed(muon_mod._zeropower_via_newtonschulz(g, coeffs, 1, 1e-7), "bf16")
        out["ns"].append(entry)
    gen = torch.Generator().manual_seed(SEED + 1)
    captured = []
    original = muon_mod._zeropower_via_newtonschulz

    def recording(grad, c, steps, eps):
        result = original(grad, c, steps, eps)
        captured.append(result)
        return result

    muon_mod._zeropower_via_newtonschulz = recording
    try:
        for shape, adjust in MUON_SHAPES:
            p = torch.randn(shape, generator=gen, dtype=torch.float32)
            grads = [torch.randn(shape, generator=gen, dtype=torch.float32) for _ in range(3)]
            param = torch.nn.Parameter(p.clone())
            opt = torch.optim.Muon([param], adjust_lr_fn=adjust, **MUON_HP)
            case = {"param": packed(p, "f32"), "grads": [packed(x, "f32") for x in grads], "steps": []}
            for x in grads:
                captured.clear()
                param.grad = x.clone()
                opt.step()
                case["steps"].append({
                    "param": packed(param, "f32"),
                    "momentum_buffer": packed(opt.state[param]["momentum_buffer"], "f32"),
                    "ns_out": packed(captured[0], "bf16"),
                })
            out["muon"].append(case)
    finally:
        muon_mod._zeropower_via_newtonschulz = original
    json.dump(out, sys.stdout)


def run_path(name, env_extra, mkldnn_on):
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--mkldnn", "1" if mkldnn_on else "0"]
    res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(res.stdout)


def meta_lines(meta):
    lines = []
    for k, v in meta.items():
        lines.append(f"{k} = {json.dumps(v) if isinstance(v, str) else str(v).lower()}")
    return lines


def write_ns(out_dir, results, torch):
    lines = ["# torch.optim._muon._zeropower_via_newtonschulz per x86 CPU path (bf16, packed hex)",
             "# Generated by tools/torch_cpu_paths_golden.py; do not edit by hand.",
             f"seed = {SEED}", "coefficients = [3.4445, -4.775, 2.0315]", "eps = 1e-07", ""]
    for name, res in results.items():
        lines.append(f"[path.{name}]")
        lines += meta_lines(res["meta"])
        lines.append("")
    for i, g in enumerate(ns_inputs(torch)):
        lines.append("[[case]]")
        lines.append(f"shape = {list(g.shape)}")
        lines.append(f'input = "{packed(g, "bf16")}"')
        for name, res in results.items():
            lines.append(f'out5.{name.replace("-", "_")} = "{res["ns"][i]["out5"]}"')
            if "out1" in res["ns"][i]:
                lines.append(f'out1.{name.replace("-", "_")} = "{res["ns"][i]["out1"]}"')
        lines.append("")
    return write(out_dir, "ns_cpu_paths.toml", lines)


def write_muon(out_dir, results):
    lines = ["# torch.optim.Muon, 3 chained steps per x86 CPU path (f32 parameters, packed hex)",
             "# Generated by tools/torch_cpu_paths_golden.py; do not edit by hand.",
             f"seed = {SEED + 1}"]
    for k, v in MUON_HP.items():
        lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}")
    lines.append("")
    first = next(iter(results.values()))
    for i, (shape, adjust) in enumerate(MUON_SHAPES):
        base = first["muon"][i]
        lines += ["[[case]]", f"shape = {list(shape)}", f'adjust_lr_fn = "{adjust}"',
                  f'param = "{base["param"]}"', "grads = [" + ", ".join(f'"{x}"' for x in base["grads"]) + "]"]
        lines.append("momentum_buffer = [" + ", ".join(f'"{s["momentum_buffer"]}"' for s in base["steps"]) + "]")
        for name, res in results.items():
            key = name.replace("-", "_")
            steps = res["muon"][i]["steps"]
            lines.append(f"param_after.{key} = [" + ", ".join(f'"{s["param"]}"' for s in steps) + "]")
            lines.append(f"ns_out.{key} = [" + ", ".join(f'"{s["ns_out"]}"' for s in steps) + "]")
        lines.append("")
    return write(out_dir, "muon_cpu_paths.toml", lines)


def adamw_cancel(out_dir, torch):
    """Parameters set before each step to -update/(1 - lr*wd) (times 1 + a tiny offset)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    lines = ["# torch.optim.AdamW where weight decay and the update nearly cancel (packed hex)",
             "# Generated by tools/torch_cpu_paths_golden.py; do not edit by hand.",
             f'torch_version = "{torch.__version__}"',
             f'cpu_capability = "{torch.backends.cpu.get_cpu_capability()}"',
             f"seed = {SEED + 2}", f"lr = {hp['lr']!r}", f"betas = [{hp['betas'][0]!r}, {hp['betas'][1]!r}]",
             f"eps = {hp['eps']!r}", f"weight_decay = {hp['weight_decay']!r}", ""]
    n, steps = 512, 3
    for dtype, name in [(torch.float32, "f32"), (torch.float64, "f64")]:
        grads = [torch.randn(n, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-3, 2, (n,), generator=gen) for _ in range(steps)]
        grads = [g.to(dtype) for g in grads]
        offsets = torch.randint(-30, 31, (steps, n), generator=gen).double() * 2.0 ** -torch.randint(8, 30, (steps, n), generator=gen).double()
        results = {}
        for foreach in (False, True):
            param = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
            opt = torch.optim.AdamW([param], foreach=foreach, fused=False, **hp)
            m = torch.zeros(n, dtype=torch.float64)
            v = torch.zeros(n, dtype=torch.float64)
            rec = []
            for t in range(1, steps + 1):
                g64 = grads[t - 1].double()
                m = m + (1 - hp["betas"][0]) * (g64 - m)
                v = hp["betas"][1] * v + (1 - hp["betas"][1]) * g64 * g64
                u = -hp["lr"] / (1 - hp["betas"][0] ** t) * m / (v.sqrt() / (1 - hp["betas"][1] ** t) ** 0.5 + hp["eps"])
                target = -u / (1 - hp["lr"] * hp["weight_decay"]) * (1 + offsets[t - 1])
                with torch.no_grad():
                    param.copy_(target.to(dtype))
                p_in = param.detach().clone()
                param.grad = grads[t - 1].clone()
                opt.step()
                st = opt.state[param]
                rec.append((p_in, param.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone()))
            results[foreach] = rec
        same = all(torch.equal(a, b) for ra, rb in zip(results[False], results[True]) for a, b in zip(ra, rb))
        lines += ["[[case]]", f'dtype = "{name}"', f"elements = {n}", f"foreach_bitwise_equal = {str(same).lower()}",
                  "grads = [" + ", ".join(f'"{packed(g, name)}"' for g in grads) + "]"]
        for p_in, p, ea, eas in results[False]:
            lines += ["[[case.step]]", f'param_in = "{packed(p_in, name)}"', f'param = "{packed(p, name)}"',
                      f'exp_avg = "{packed(ea, name)}"', f'exp_avg_sq = "{packed(eas, name)}"',
                      f'sqrt_exp_avg_sq = "{packed(eas.sqrt(), name)}"']
        lines.append("")
    return write(out_dir, "adamw_cancel.toml", lines)


def write(out_dir, fname, lines):
    path = os.path.join(out_dir, fname)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference", "tests", "data", "torch"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--mkldnn", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.mkldnn == "1")
        return
    import torch
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for name, env, mkldnn_on in PATHS:
        res = run_path(name, env, mkldnn_on)
        if mkldnn_on and not res["meta"]["onednn_bf16_supported"]:
            print(f"{name}: torch reports no oneDNN bf16 support on this CPU; path skipped")
            continue
        results[name] = res
        print(f"{name}: {res['meta']}")
    write_ns(args.out, results, torch)
    write_muon(args.out, results)
    adamw_cancel(args.out, torch)


if __name__ == "__main__":
    main()

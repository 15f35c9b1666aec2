#!/usr/bin/env bash
# One-GPU check of the NCCL backend as GPU users run it: nccl_smoke, collbench and replay
# (device compute, busy and real) on one rank, then on two ranks sharing the GPU (each
# process its own NCCL_HOSTID so NCCL connects them as two hosts over its socket transport
# on loopback: NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1). Writes every log and CSV into the
# output directory and one summary, summary.md, with the figures that matter.
#
#   tools/gpu-check.sh [OUT_DIR]            (default: gpu-check-out; $OUT when set)
#
# Needs an NVIDIA GPU with its driver (libcuda.so.1), NCCL 2.x, the CUDA runtime and cuBLAS.
# Libraries are found through HPFSDP_NCCL_LIB / HPFSDP_CUDART_LIB / HPFSDP_CUBLAS_LIB /
# HPFSDP_CUDA_DRIVER_LIB when set, else in the dynamic loader's cache, else in a Python
# environment's nvidia-* wheels (PyTorch's). Builds hpfsdp and nccl_smoke with
# `--features nccl` unless HPFSDP_BIN and SMOKE_BIN name prebuilt ones. Each step is bounded
# (STEP_TIMEOUT_S, default 300 s); the script always writes the summary and exits 1 when a
# step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu-check-out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
SUMMARY="$OUT_DIR/summary.md"
STEP_TIMEOUT_S="${STEP_TIMEOUT_S:-300}"
SCENARIO="${SCENARIO:-scenarios/verify/dense-fsdp4.toml}"
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }
: > "$SUMMARY"
say "# hpfsdp GPU check ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
say ""

# --- Libraries --------------------------------------------------------------------------
# find_lib VAR pattern...: keep VAR if set, else the first match in ldconfig's cache, else in
# the nvidia-* wheels of python3's site-packages.
PY_SITE="$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)"
find_lib() {
  local var="$1"; shift
  if [ -n "${!var:-}" ]; then return; fi
  local pat hit
  for pat in "$@"; do
    hit="$(ldconfig -p 2>/dev/null | awk -v p="$pat" '$1 ~ "^"p"$" {print $NF; exit}')"
    if [ -z "$hit" ] && [ -n "$PY_SITE" ]; then
      # shellcheck disable=SC2086
      hit="$(find $PY_SITE -path '*nvidia*' -name "$pat" 2>/dev/null | sort | head -1)"
    fi
    if [ -n "$hit" ]; then export "$var=$hit"; return; fi
  done
}
find_lib HPFSDP_NCCL_LIB 'libnccl.so.2' 'libnccl.so'
find_lib HPFSDP_CUDART_LIB 'libcudart.so.13' 'libcudart.so.12' 'libcudart.so'
find_lib HPFSDP_CUBLAS_LIB 'libcublas.so.13' 'libcublas.so.12' 'libcublas.so'
find_lib HPFSDP_CUDA_DRIVER_LIB 'libcuda.so.1' 'libcuda.so'
# cuBLAS needs cublasLt from its own directory.
if [ -n "${HPFSDP_CUBLAS_LIB:-}" ]; then
  export LD_LIBRARY_PATH="$(dirname "$HPFSDP_CUBLAS_LIB"):${LD_LIBRARY_PATH:-}"
fi
say "## Machine"
say ""
say "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi not found')"
for v in HPFSDP_NCCL_LIB HPFSDP_CUDART_LIB HPFSDP_CUBLAS_LIB HPFSDP_CUDA_DRIVER_LIB; do
  say "- $v=${!v:-(not found: the default search list is used)}"
done

# --- Binaries ---------------------------------------------------------------------------
if [ -z "${HPFSDP_BIN:-}" ] || [ -z "${SMOKE_BIN:-}" ]; then
  echo "building hpfsdp and nccl_smoke with --features nccl ..."
  if ! cargo build --release --features nccl --bin hpfsdp > "$OUT_DIR/build.log" 2>&1 \
    || ! cargo build --release -p hpfsdp-backends --features nccl --example nccl_smoke >> "$OUT_DIR/build.log" 2>&1; then
    say "- build: FAILED (see build.log)"
    tail -20 "$OUT_DIR/build.log"
    exit 1
  fi
fi
HPFSDP_BIN="${HPFSDP_BIN:-target/release/hpfsdp}"
SMOKE_BIN="${SMOKE_BIN:-target/release/examples/nccl_smoke}"
say ""

# --- Steps ------------------------------------------------------------------------------
# run_ranks NAME N CMD...: runs CMD as N processes of one NCCL world (file rendezvous, one
# GPU, per-process NCCL_HOSTID when N > 1); rank r's output goes to NAME.rank<r>.log.
run_ranks() {
  local name="$1" n="$2"; shift 2
  local rdv="$OUT_DIR/rdv-$name"; rm -rf "$rdv"; mkdir -p "$rdv"
  local start end pids=() r rc=0
  start=$(date +%s.%N)
  for ((r = 0; r < n; r++)); do
    (
      export RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 HPFSDP_DEVICE=0 HPFSDP_RENDEZVOUS="file:$rdv"
      if [ "$n" -gt 1 ]; then
        export NCCL_HOSTID="hpfsdp-gpu-check-$r" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
      fi
      exec timeout "$STEP_TIMEOUT_S" "$@"
    ) > "$OUT_DIR/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || rc=$?
  done
  end=$(date +%s.%N)
  local secs; secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
  if [ "$rc" -eq 0 ]; then
    say "- $name: ok in ${secs} s"
  else
    say "- $name: FAILED (exit $rc after ${secs} s; see $name.rank*.log)"
    FAILED=1
  fi
  return 0
}

# collbench_figures NAME: the 64 MiB all-gather (or the largest) and the average bus bandwidth.
collbench_figures() {
  local log="$OUT_DIR/$1.rank0.log"
  [ -f "$log" ] || return 0
  awk '$1 == "all-gather" {last = $0; if ($2 == 67108864) big = $0}
       END {row = big != "" ? big : last
            if (row != "") { split(row, c)
              printf "  - all-gather %s B: out-of-place %s us, algbw %s GB/s; in-place %s us, algbw %s GB/s; #wrong %s/%s\n", c[2], c[7], c[8], c[11], c[12], c[10], c[14] } }' "$log" | tee -a "$SUMMARY"
  grep -E '^# (Avg bus bandwidth|tier)' "$log" | sed 's/^# /  - /' | tee -a "$SUMMARY"
}

# replay_figures NAME: measured vs predicted step, where compute ran, the profile and why.
replay_figures() {
  local log="$OUT_DIR/$1.rank0.log"
  [ -f "$log" ] || return 0
  python3 - "$log" <<'PY' | tee -a "$SUMMARY"
import json, sys
text = open(sys.argv[1]).read()
start = text.find("{")
try:
    d = json.loads(text[start:text.rfind("}") + 1])
except ValueError:
    sys.exit(0)
p, m, s = d["predicted"], d["measured"], d["step_spread"]
print(f"  - step: measured {m['step_ns'] / 1e6:.3f} ms (median of {len(d['measured_steps_ns'])}, "
      f"spread {s['spread_pct']:.1f}%) vs predicted {p['step_ns'] / 1e6:.3f} ms on {d['hardware']}")
print(f"  - exposed communication: measured {m['exposed_comm_ns'] / 1e6:.3f} ms vs predicted {p['exposed_comm_ns'] / 1e6:.3f} ms")
print(f"  - profile: {d['hardware_reason']}")
print(f"  - compute ran as: {d['compute_on']}")
print(f"  - dependency violations: {d['dependency_violations']}")
PY
}

say "## One rank"
say ""
run_ranks smoke-1rank 1 "$SMOKE_BIN"
grep -E 'calls timed' "$OUT_DIR/smoke-1rank.rank0.log" | sed 's/^/  - /' | tee -a "$SUMMARY"
run_ranks collbench-1rank 1 "$HPFSDP_BIN" collbench --backend nccl --out "$OUT_DIR/collbench-1rank.csv"
collbench_figures collbench-1rank
for compute in busy real; do
  run_ranks "replay-1rank-$compute" 1 "$HPFSDP_BIN" replay "$SCENARIO" --backend nccl --ranks 1 \
    --compute "$compute" --json --out "$OUT_DIR/replay-1rank-$compute"
  replay_figures "replay-1rank-$compute"
done

say ""
say "## Two ranks sharing the GPU (NCCL sockets over loopback)"
say ""
run_ranks smoke-2ranks 2 "$SMOKE_BIN"
grep -E 'calls timed' "$OUT_DIR/smoke-2ranks.rank0.log" | sed 's/^/  - /' | tee -a "$SUMMARY"
run_ranks collbench-2ranks 2 "$HPFSDP_BIN" collbench --backend nccl -e 16M -n 5 -w 2 \
  --out "$OUT_DIR/collbench-2ranks.csv"
collbench_figures collbench-2ranks
for compute in busy real; do
  run_ranks "replay-2ranks-$compute" 2 "$HPFSDP_BIN" replay "$SCENARIO" --backend nccl --ranks 2 \
    --compute "$compute" --json --out "$OUT_DIR/replay-2ranks-$compute"
  replay_figures "replay-2ranks-$compute"
done

say ""
if [ "$FAILED" -eq 0 ]; then say "All steps passed."; else say "Some steps FAILED."; fi
echo "summary: $SUMMARY"
exit "$FAILED"

#!/usr/bin/env bash
# Regenerates the command outputs pasted in README.md and docs/*.md, so the docs cannot drift
# from the tool, and checks every relative link and every repository path the docs name.
#
#   tools/regen-docs.sh            rewrite every stale block in place
#   tools/regen-docs.sh --check    change nothing; exit 1 when a block is stale or a link is
#                                  broken (for a CI step), 0 when everything is current
#   tools/regen-docs.sh --fresh    rewrite every block, measured (volatile) ones included
#   tools/regen-docs.sh --list     list the blocks (file, id, command) and the hand-made ones
#
# A generated block sits between two marker comments; everything between them is this
# script's output (fences included), so edit the generator below, never the block:
#
#   <!-- regen:simulate-exp-b -->
#   ```text
#   $ hpfsdp simulate scenarios/paper/exp-b.toml
#   ...
#   ```
#   <!-- /regen -->
#
# Each block's first line is the command as a user types it; the script runs the same arguments
# with the release binary ($HPFSDP_BIN, default target/release/hpfsdp: build it first with
# `cargo build --release`). "hpfsdp" in a block is that binary, "cargo run --release --" runs it
# too. Outputs that contain measured times (replay, collbench, verify's wall times) are
# "volatile": --check compares them with every number masked, so only a change of format or
# wording makes them stale, and a plain run keeps their recorded measurements (--fresh
# replaces them). Outputs that take longer than ~30 s (calibrate --fit --loo,
# bench, muon on exp-d, the MPI replay) are not rerun here: the docs mark them
# `<!-- regen-by-hand: COMMAND -->`, and --list prints them.
#
# Needs bash, python3 (splicing and link check) and a built binary; takes about 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=write
FRESH=0
case "${1:-}" in
  "") ;;
  --check) MODE=check ;;
  --fresh) MODE=write; FRESH=1 ;;
  --list) MODE=list ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "regen-docs: unknown argument '$1' (use --check, --list or no argument)" >&2; exit 2 ;;
esac

DOCS=(README.md docs/*.md)
BIN=${HPFSDP_BIN:-$ROOT/target/release/hpfsdp}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Blocks whose output holds measured wall-clock times: --check masks their numbers.
VOLATILE=" tour-replay verify-moe-muon collbench-inproc "

# ---------------------------------------------------------------------------------------------
# Helpers for the generators. `cmd PROMPT ARGS...` prints "$ PROMPT ARGS" and then the binary's
# stdout for ARGS (run from the current directory); an exit status outside OK_RC (a list,
# default "0"; set it as a prefix, `OK_RC="0 1" run ...`) marks the generator failed.
OK_RC=0
cmd() {
  local prompt=$1; shift
  echo "\$ $prompt $*"
  run "$@"
}
run() {
  local rc=0
  # Into a file first: a filter that stops reading early must not kill the binary (SIGPIPE).
  "$BIN" "$@" >"$WORK/stdout" 2>"$WORK/stderr" || rc=$?
  if [[ " $OK_RC " != *" $rc "* ]]; then
    echo "regen-docs: 'hpfsdp $*' exited $rc (expected $OK_RC):" >&2
    sed 's/^/    /' "$WORK/stderr" >&2
    touch "$WORK/failed"
    return 1
  fi
  cat "$WORK/stdout"
}
fence_open() { echo '```text'; }
fence_close() { echo '```'; }
# Replace the lines of stdin between the Nth and Mth (1-based, inclusive) with one "...".
elide() { awk -v a="$1" -v b="$2" 'NR==a{print "..."} NR<a||NR>b{print}'; }

# ---------------------------------------------------------------------------------------------
# Generators: gen_<id with - as _>. Each prints the whole Markdown of its block.

# README tour ----------------------------------------------------------------------------------
gen_tour_plan() {
  fence_open
  cmd "cargo run --release --" plan scenarios/paper/exp-b.toml |
    awk '/^PARAMETERS/{skip=1; print "..."} /^LINT/{skip=0} !skip{print}' | sed '/^$/d'
  fence_close
}
gen_tour_simulate() {
  fence_open
  cmd "cargo run --release --" simulate scenarios/paper/exp-b.toml |
    grep -E '^\$|^scenario|^figure|^---|^step time|^tokens/s|^MFU|^exposed comm|^  exposed fsdp|^overlap rate|^peak memory \(|^simulated ranks'
  fence_close
}
gen_tour_verify() {
  fence_open
  cmd "cargo run --release --" verify scenarios/verify/dense-fsdp4.toml |
    awk 'NR<=2{print; next} /^check/{on=1; print "..."} on{print}'
  fence_close
}
gen_tour_replay() {
  fence_open
  cmd "cargo run --release --" replay scenarios/verify/dense-fsdp4.toml --backend inproc --steps 3 --warmup 1 --out out/replay |
    grep -vE '^collective'
  fence_close
}
gen_tour_gate() {
  fence_open
  cmd "cargo run --release --" gate scenarios/paper/exp-b.toml --lock hpfsdp.lock
  fence_close
}

gen_tour_calibrate() {
  fence_open
  OK_RC="0 1" cmd "cargo run --release --" calibrate --hardware nvidia-h200-hgx \
    --from scenarios/hardware/measured/h200-gemm.csv --write-profile out/my-h200.toml --out out/calibration |
    grep -E '^\$|^wrote profile'
  OK_RC="0 1" cmd "cargo run --release --" calibrate --hardware out/my-h200.toml --any-hardware \
    --runs scenarios/runs/h200-fsdp2.toml --fit --loo --write-profile out/my-h200-fitted.toml --out out/calibration |
    grep -E '^\$|^\| experiment \| run \| figure|^\| --- \| --- \| --- \| --- \| --- \| --- \| --- \| --- \| --- \| --- \| --- \|$|\| (step time|peak allocated memory|device kernels)|left out: .*step time|^(FAIL|PASS)|^wrote profile' |
    awk '!(/^\| experiment/ && seen++) && !(/^\| ---/ && dash++)' |
    awk -F' [|] ' -v OFS=' | ' '/^[|]/{ $2 = $1; $1 = ""; $4 = ""; $0 = $0; gsub(/ [|]  [|] /, " | "); sub(/^ [|] /, "") } 1'
  OK_RC="0" cmd "cargo run --release --" simulate scenarios/gpu/dense14b-8l-mbs1.toml --hardware out/my-h200-fitted.toml |
    grep -E '^\$|^scenario|^step time|^peak memory \('
  fence_close
}

# docs/cli.md: every command's --help ------------------------------------------------------------
help_block() { fence_open; cmd hpfsdp "$@" --help; fence_close; }
gen_help() { help_block; }
gen_help_plan() { help_block plan; }
gen_help_simulate() { help_block simulate; }
gen_help_calibrate() { help_block calibrate; }
gen_help_verify() { help_block verify; }
gen_help_muon() { help_block muon; }
gen_help_bench() { help_block bench; }
gen_help_replay() { help_block replay; }
gen_help_collbench() { help_block collbench; }
gen_help_gate() { help_block gate; }
gen_help_sweep() { help_block sweep; }
gen_help_export() { help_block export; }

# docs/outputs.md, docs/planner.md ---------------------------------------------------------------
gen_simulate_exp_b() { fence_open; cmd hpfsdp simulate scenarios/paper/exp-b.toml; fence_close; }
gen_plan_exp_b() { fence_open; cmd hpfsdp plan scenarios/paper/exp-b.toml; fence_close; }
gen_lint_tp3() {
  # Llama-3-8B with tp = 3: a scenario written on the fly (no shipped scenario is wrong).
  cat >"$WORK/llama-tp3.toml" <<EOF
name = "llama-tp3"
hardware = "nvidia-h100-hgx"
[model]
hf_config = "$ROOT/scenarios/models/llama-3-8b.json"
[mesh]
dp_shard = 2
tp = 3
[topology]
dies_per_machine = 6
machines_per_supernode = 1
supernodes = 1
[train]
seq_len = 4096
global_batch = 8
micro_batch = 1
EOF
  fence_open
  OK_RC=1 run plan "$WORK/llama-tp3.toml" | grep -A1 -m1 '^error\['
  fence_close
}
gen_gate_regression() {
  # A copy of a tiny verify scenario, locked, then changed to full recompute: a slower step.
  local d=$WORK/gate
  mkdir -p "$d/models"
  cp scenarios/verify/dense-fsdp4.toml "$d/"
  cp scenarios/verify/models/tiny-dense.toml "$d/models/"
  (cd "$d" && "$BIN" gate dense-fsdp4.toml --lock hpfsdp.lock --update >/dev/null 2>&1)
  sed -i 's/recompute = "off"/recompute = "full"/' "$d/dense-fsdp4.toml"
  fence_open
  echo '$ hpfsdp gate dense-fsdp4.toml --lock hpfsdp.lock --junit junit.xml --markdown gate.md'
  (cd "$d" && OK_RC=1 run gate dense-fsdp4.toml --lock hpfsdp.lock --junit junit.xml --markdown gate.md)
  fence_close
  echo
  echo '`gate.md`, the Markdown summary written beside it:'
  echo
  echo '```markdown'
  cat "$d/gate.md"
  echo '```'
}

# docs/verification.md ---------------------------------------------------------------------------
gen_verify_moe_muon() { fence_open; cmd hpfsdp verify scenarios/verify/moe-ep2-fsdp2-muon.toml; fence_close; }
gen_verify_mutate() {
  fence_open
  echo '$ hpfsdp verify scenarios/verify/dense-tp2-fsdp2.toml --mutate model.layers.0.mlp'
  echo '...'
  run verify scenarios/verify/dense-tp2-fsdp2.toml --mutate model.layers.0.mlp | tail -n 6
  fence_close
}

# docs/calibration.md ----------------------------------------------------------------------------
# calibrate exits 1 while a gating figure is out of tolerance (see docs/calibration.md).
calibrate_once() {
  [ -f "$WORK/calibrate.txt" ] || OK_RC="0 1" run calibrate --out "$WORK/calibration" >"$WORK/calibrate.txt"
}
gen_calibrate_comparison() {
  calibrate_once
  awk '/^$/{exit} {print}' "$WORK/calibrate.txt"
}
gen_calibrate_host_model() {
  calibrate_once
  awk '/^host model/{on=1; next} on&&/^$/{exit} on{print}' "$WORK/calibrate.txt"
}
gen_calibrate_verdict() {
  calibrate_once
  fence_open
  grep -E '^(PASS|FAIL|WARN)' "$WORK/calibrate.txt"
  fence_close
}

gen_calibrate_h200() {
  # The H200 runs file (scenarios/runs/h200-fsdp2.toml) against the shipped, fitted profile.
  OK_RC="0 1" run calibrate --hardware nvidia-h200-hgx --out "$WORK/calibration-h200" >"$WORK/calibrate-h200.txt"
  awk '/^$/{exit} {print}' "$WORK/calibrate-h200.txt"
  echo
  fence_open
  grep -E '^(PASS|FAIL|WARN)' "$WORK/calibrate-h200.txt"
  fence_close
}

# docs/strategies.md: the three Muon comparisons, one row per simulated run ---------------------
gen_muon_comparisons() {
  echo '| scenario | run | step | optimizer range | optimizer exposed | exposed comm | overlap | peak memory (max) | memory spread | optimizer bytes per tier |'
  echo '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |'
  local s
  for s in muon-vs-dmuon muon-vs-matrixfsdp muon-vs-flexshard; do
    run simulate "scenarios/paper/$s.toml" --json >"$WORK/$s.json"
    python3 - "$s" "$WORK/$s.json" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
gib = float(1 << 30)
for r in json.load(open(path))["results"]:
    run = r["strategy"]  # a Muon baseline's run is already named <strategy>+<baseline>
    o, m = r["optimizer_figures"], r["memory_spread"]
    tiers = ", ".join(f"{t} {b / gib:.2f}" for t, b in o["tier_bytes"].items() if b) or "-"
    print(f"| {name} | {run} | {r['step_time_s']:.3f} | {o['range_s']:.3f} | {o['exposed_comm_s']:.3f} "
          f"| {r['exposed_comm_total_s']:.3f} | {100 * r['overlap_rate']:.1f}% | {m['max_bytes'] / gib:.1f} "
          f"| {(m['max_bytes'] - m['min_bytes']) / gib:.2f} | {tiers} |")
EOF
  done
}

# docs/cli.md: sweep; docs/whatif.md ----------------------------------------------------------------
gen_sweep_exp_b() {
  fence_open
  cmd hpfsdp sweep scenarios/paper/exp-b.toml --vary fsdp.prefetch_depth=0,1,2 --vary train.micro_batch=1,2,4 --strategy hyperparallel --out out/sweep
  fence_close
}
gen_whatif_exp_c() {
  fence_open
  cmd hpfsdp simulate scenarios/fixtures/exp-c-whatif.toml | awk 'NR==1{print} /^What-if faults/{on=1; print "..."} on{print}'
  fence_close
}

gen_export_exp_b() { fence_open; cmd hpfsdp export scenarios/paper/exp-b.toml --chakra out/exp-b; fence_close; }

gen_whatif_jitter_sweep() {
  fence_open
  cmd hpfsdp sweep scenarios/fixtures/exp-c-whatif.toml --vary whatif.straggler_jitter_pct=0,5,10 --out out/sweep-jitter
  fence_close
}

# docs/backends.md --------------------------------------------------------------------------------
gen_collbench_inproc() {
  fence_open
  cmd hpfsdp collbench --backend inproc --kinds all-reduce,all-gather --min-bytes 1K --max-bytes 1M --factor 32
  fence_close
}

# ---------------------------------------------------------------------------------------------
# Splice, check and list: the Markdown side, in Python.
PY=$(cat <<'EOF'
import os, re, sys, difflib
mode, work = sys.argv[1], sys.argv[2]
files = sys.argv[3:]
volatile = set(os.environ.get("VOLATILE", "").split())
OPEN = re.compile(r"^<!-- regen:([a-z0-9-]+) -->$")
CLOSE = "<!-- /regen -->"
HAND = re.compile(r"<!-- regen-by-hand: (.*?) -->")

def blocks(path):
    """(id, start, end) line indices of each block's content; raises on malformed markers."""
    lines = open(path).read().split("\n")
    out, cur = [], None
    for i, line in enumerate(lines):
        m = OPEN.match(line.strip())
        if m:
            if cur: sys.exit(f"{path}:{i+1}: regen block '{m.group(1)}' opens inside block '{cur[0]}' (line {cur[1]}); close it with {CLOSE}")
            cur = (m.group(1), i + 1)
        elif line.strip() == CLOSE:
            if not cur: sys.exit(f"{path}:{i+1}: {CLOSE} without an opening <!-- regen:ID -->")
            out.append((cur[0], cur[1], i)); cur = None
        elif line.lstrip().startswith("<!-- regen:"):
            sys.exit(f"{path}:{i+1}: malformed marker '{line.strip()}': write <!-- regen:ID --> with ID in [a-z0-9-]")
    if cur: sys.exit(f"{path}:{cur[1]}: regen block '{cur[0]}' is never closed with {CLOSE}")
    return lines, out

def mask(text):
    return re.sub(r"\s+", " ", re.sub(r"[0-9][0-9.,]*", "#", text))

if mode == "ids":
    for f in files:
        for bid, _, _ in blocks(f)[1]: print(bid)
    sys.exit(0)
if mode == "list":
    for f in files:
        lines, bl = blocks(f)
        for bid, s, _ in bl:
            first = next((l for l in lines[s:] if l.startswith("$ ")), "(no command line)")
            print(f"{f}: {bid}{' (volatile)' if bid in volatile else ''}: {first[2:] if first.startswith('$ ') else first}")
        for i, l in enumerate(lines):
            for m in HAND.finditer(l): print(f"{f}:{i+1}: by hand: {m.group(1)}")
    sys.exit(0)
stale = 0
for f in files:
    lines, bl = blocks(f)
    new = list(lines)
    for bid, s, e in reversed(bl):
        gen = open(os.path.join(work, bid + ".md")).read().rstrip("\n").split("\n")
        old = lines[s:e]
        same = mask("\n".join(old)) == mask("\n".join(gen)) if bid in volatile else old == gen
        if same: continue
        stale += 1
        if mode == "check":
            print(f"{f}: block '{bid}' is stale:")
            for d in list(difflib.unified_diff(old, gen, "docs", "tool", lineterm="", n=0))[2:14]: print("    " + d)
        else:
            new[s:e] = gen
    if mode == "write" and new != lines:
        open(f, "w").write("\n".join(new)); print(f"regen-docs: rewrote {f}")
if mode == "check" and stale:
    print(f"regen-docs: {stale} stale block(s); run tools/regen-docs.sh to rewrite them"); sys.exit(1)
EOF
)

LINKS=$(cat <<'EOF'
import os, re, sys
files = sys.argv[1:]
bad = 0
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
# `path` mentions of repository files and folders (e.g. `sim/src/cost.rs`, `scenarios/paper/`)
TOP = tuple(d + "/" for d in ("backends", "docs", "export", "plan", "program", "reference",
                              "reports", "scenarios", "sim", "src", "tests", "tools", ".ci"))
# folders the tools write by default (absent in a clean checkout)
OUTPUTS = {"reports/sweep", "reports/replay", "out/sweep", "out/replay"}
PATH = re.compile(r"`([A-Za-z0-9_.\-/]+)(?:::[A-Za-z0-9_:]+)?`")

def slug(h):
    h = re.sub(r"[`*_]|<[^>]+>", "", h.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")

anchors = {}
def anchors_of(path):
    if path not in anchors:
        seen, out, fence = {}, set(), False
        for line in open(path):
            if line.startswith("```"): fence = not fence
            if fence or not line.startswith("#"): continue
            s = slug(line.lstrip("#"))
            n = seen.get(s, 0); seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        anchors[path] = out
    return anchors[path]

for f in files:
    text = open(f).read()
    body = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for i, line in enumerate(body.split("\n"), 1):
        for m in LINK.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"[a-z]+:", target): continue
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(dest):
                print(f"{f}:{i}: broken link '{target}': {dest} does not exist"); bad += 1
            elif frag and dest.endswith(".md") and frag not in anchors_of(dest):
                print(f"{f}:{i}: broken link '{target}': no heading '#{frag}' in {dest}"); bad += 1
        for m in PATH.finditer(line):
            p = m.group(1)
            if not p.startswith(TOP) or "*" in p or "<" in p or p.rstrip("/") in OUTPUTS: continue
            if not os.path.exists(p.rstrip("/")):
                print(f"{f}:{i}: names `{p}`, which does not exist in the repository"); bad += 1
sys.exit(1 if bad else 0)
EOF
)

if [ "$MODE" = list ]; then
  VOLATILE=$VOLATILE python3 -c "$PY" list "$WORK" "${DOCS[@]}"
  exit 0
fi
command -v python3 >/dev/null || { echo "regen-docs: python3 is needed (splicing and link check)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "regen-docs: $BIN not found: build it with 'cargo build --release' or set HPFSDP_BIN" >&2; exit 2; }

ids=$(python3 -c "$PY" ids "$WORK" "${DOCS[@]}" | sort -u)
for id in $ids; do
  fn=gen_${id//-/_}
  if ! declare -F "$fn" >/dev/null; then
    echo "regen-docs: the docs use block '$id' but this script has no generator $fn" >&2; exit 2
  fi
  "$fn" >"$WORK/$id.md" || true
  if [ -e "$WORK/failed" ] || [ "$(grep -c . "$WORK/$id.md")" -lt 3 ]; then
    echo "regen-docs: generator $fn failed or printed almost nothing; nothing was rewritten" >&2
    exit 2
  fi
done
for fn in $(declare -F | awk '{print $3}' | grep '^gen_'); do
  id=${fn#gen_}; id=${id//_/-}
  grep -qx "$id" <<<"$ids" || echo "regen-docs: note: generator $fn is not used by any block" >&2
done

rc=0
[ "$FRESH" = 1 ] && VOLATILE=""
VOLATILE=$VOLATILE python3 -c "$PY" "$MODE" "$WORK" "${DOCS[@]}" || rc=1
python3 -c "$LINKS" "${DOCS[@]}" || rc=1
[ "$rc" -eq 0 ] && [ "$MODE" = check ] && echo "regen-docs: every block current, every link and path resolves"
exit "$rc"

"""Achieved bandwidth of vectorized vs strided element-wise kernels in the H200 dense-14B trace
(shared/calibration/h200/profiles/trace-dense14b-8l-mbs1.json.gz): each kernel is joined to
the aten op that launched it (External id), its bytes are the op's tensor inputs plus its
output (shapes and dtypes from the trace), kernels under 1M elements and the optimizer's
multi_tensor_apply are left out. `vectorized_elementwise_kernel` is TensorIterator's
vectorized path; `elementwise_kernel` / `unrolled_elementwise_kernel` its strided one
(broadcast, non-contiguous or dtype-converting operands). Source of the H200 profile's
`[compute] strided_relative_bandwidth` (strided TB/s over micro.json's 4.35 TB/s add).
Usage: python3 tools/h200_elementwise_bandwidth.py [TRACE]"""
import sys
import json,gzip,collections,math
t=json.load(gzip.open(sys.argv[1] if len(sys.argv) > 1 else "../shared/calibration/h200/profiles/trace-dense14b-8l-mbs1.json.gz"))
ev=t["traceEvents"]
ops=collections.defaultdict(list)
for e in ev:
    if e.get("cat")=="cpu_op": ops[e["args"].get("External id")].append(e)
sz={"float":4,"c10::BFloat16":2,"long int":8,"int":4,"bool":1}
agg=collections.defaultdict(lambda:[0.0,0.0,0]); per=collections.defaultdict(lambda:[0.0,0.0,0])
for e in ev:
    if e.get("cat")!="kernel": continue
    n=e["name"]
    if "multi_tensor" in n: continue
    if n.startswith("void at::native::vectorized_elementwise_kernel"): kind="vec"
    elif n.startswith(("void at::native::elementwise_kernel","void at::native::unrolled_elementwise_kernel")): kind="strided"
    else: continue
    cand=ops.get(e["args"].get("External id"),[])
    if not cand: continue
    op=min(cand,key=lambda o:o["dur"]); a=op["args"]
    ts=[(d,ty) for d,ty in zip(a.get("Input Dims",[]),a.get("Input type",[])) if d and ty in sz]
    if not ts: continue
    numel=lambda d: math.prod(d)
    big=max(numel(d) for d,ty in ts)
    if big<1e6: continue
    name=op["name"]
    if name=="aten::copy_" and len(ts)>=2:
        b=numel(ts[0][0])*sz[ts[0][1]]+numel(ts[1][0])*sz[ts[1][1]]
    elif name=="aten::fill_":
        b=numel(ts[0][0])*sz[ts[0][1]]
    else:
        rd=sum(numel(d)*sz[ty] for d,ty in ts)
        outsz=max(sz[ty] for d,ty in ts if numel(d)==big)
        wr=0 if name.endswith("_") else big*outsz
        b=rd+wr
    agg[kind][0]+=b; agg[kind][1]+=e["dur"]; agg[kind][2]+=1
    per[(kind,name)][0]+=b; per[(kind,name)][1]+=e["dur"]; per[(kind,name)][2]+=1
for k,(b,t,c) in agg.items(): print(k,c,"kernels", f"{b/1e9:.1f} GB in {t/1e3:.1f} ms = {b/t/1e6:.2f} TB/s")
for (k,n),(b,t,c) in sorted(per.items(),key=lambda x:-x[1][1])[:16]: print(f"  {k:7s} {n:22s} {c:4d} {b/t/1e6:.2f} TB/s  {t/1e3:.1f} ms")

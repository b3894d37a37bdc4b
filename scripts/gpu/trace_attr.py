# Which ops launched a profile's kernels: for each kernel whose name matches REGEX in a trace saved
# by `deltadeck bench train --profile --profile-trace T.json` (which records input shapes), the CPU op
# that launched it (by the CUDA runtime call's correlation id and time containment on its thread),
# its input shapes and the autograd node around it, summed over the trace. Usage:
#   python3 scripts/gpu/trace_attr.py T.json 'CUDAFunctor_add<float>|direct_copy' [TOP [by-op]]
# TOP rows (40 unless given); `by-op` sums over kernel names, one row per launching op and node.
import json, sys, re, collections, bisect
trace, pat = sys.argv[1], re.compile(sys.argv[2])
top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
by_op = len(sys.argv) > 4 and sys.argv[4] == "by-op"
ev = json.load(open(trace))["traceEvents"]
kern = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel" and pat.search(e.get("name", ""))]
rt = {e["args"]["correlation"]: e for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
ops = collections.defaultdict(list)
for e in ev:
    if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
        ops[(e["pid"], e["tid"])].append(e)
for k in ops: ops[k].sort(key=lambda e: e["ts"])
agg = collections.defaultdict(lambda: [0.0, 0])
for k in kern:
    r = rt.get(k["args"].get("correlation"))
    if r is None: continue
    stack = [o for o in ops[(r["pid"], r["tid"])] if o["ts"] <= r["ts"] and o["ts"] + o["dur"] >= r["ts"] + r["dur"]]
    stack.sort(key=lambda o: o["ts"])
    names = [o["name"] for o in stack]
    inner = stack[-1] if stack else None
    dims = str(inner["args"].get("Input Dims", ""))[:80] if inner else ""
    auto = [n for n in names if "evaluate_function" in n or "Backward" in n]
    key = ("" if by_op else k["name"][:50], " > ".join(names[-3:])[:160], dims, auto[-1][:70] if auto else "")
    agg[key][0] += k["dur"] / 1000.0
    agg[key][1] += 1
for key, (ms, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"{ms:7.2f} ms {n:4d}x | {key[0]} | {key[1]} | {key[2]} | {key[3]}")

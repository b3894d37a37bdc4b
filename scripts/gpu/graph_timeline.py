#!/usr/bin/env python3
"""One captured step's kernels in time order, from the trace of
`deltadeck bench train --profile --profile-trace T.json` (graph captured: its replays' kernels).

usage: graph_timeline.py TRACE.json OUT.txt
The trace's steps are split at the embedding's gather, each step's first kernel; the middle one is
listed.
Per kernel: start (µs from the step's first kernel), duration, stream, the idle time before it on
the whole GPU, and which other streams' kernels overlap it. Then totals: busy, idle, one stream only,
several streams at once, and idle gaps by the kernel they precede.
"""
import json, sys, collections

tr = json.load(open(sys.argv[1]))
ev = [e for e in tr["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and e.get("ph") == "X"]
ev.sort(key=lambda e: e["ts"])
# Steps: split at the embedding's gather, the step's first kernel.
starts = [i for i, e in enumerate(ev) if "vectorized_gather_kernel" in e["name"]]
steps = [ev[a:b] for a, b in zip(starts, starts[1:] + [len(ev)])]
out = open(sys.argv[2], "w")
out.write(f"{len(steps)} steps of {[len(s) for s in steps]} kernels\n")
step = steps[len(steps) // 2]
t0 = step[0]["ts"]
span = max(e["ts"] + e["dur"] for e in step) - t0
# sweep for idle / one / several
pts = sorted([(e["ts"], 1) for e in step] + [(e["ts"] + e["dur"], -1) for e in step])
cnt, last, acc = 0, t0, collections.Counter()
for t, d in pts:
    acc[min(cnt, 2)] += t - last; cnt += d; last = t
out.write(f"span {span:.1f} µs: idle {acc[0]:.1f}, one kernel {acc[1]:.1f}, several {acc[2]:.1f}\n")
streams = collections.Counter()
for e in step: streams[e["args"].get("stream")] += e["dur"]
out.write(f"busy by stream: {dict((k, round(v, 1)) for k, v in streams.items())}\n\n")
gap_by = collections.Counter()
busy_end = t0
for i, e in enumerate(step):
    gap = max(0.0, e["ts"] - busy_end)
    busy_end = max(busy_end, e["ts"] + e["dur"])
    s, f = e["ts"], e["ts"] + e["dur"]
    ov = [o for o in step if o is not e and o["args"].get("stream") != e["args"].get("stream") and o["ts"] < f and o["ts"] + o["dur"] > s]
    name = e["name"].replace("void ", "")[:70]
    gap_by[name[:40]] += gap
    ovs = "; ".join(sorted(set(o["name"].replace("void ", "")[:30] for o in ov)))[:90]
    out.write(f"{s - t0:9.1f} {e['dur']:7.1f} s{e['args'].get('stream')} gap {gap:5.1f} | {name} | {ovs}\n")
out.write("\nidle before, by kernel (µs a step):\n")
for k, v in gap_by.most_common(30):
    out.write(f"  {v:7.1f} {k}\n")

#!/usr/bin/env python3
"""Mean time a launch of the kernels matching each pattern, from graph_timeline.py's output.

usage: kernel_means.py TIMELINE.txt PATTERN...
Prints the timeline's span line, then for each pattern (a Python regex on the kernel's name): the
launches in the listed step and their mean duration in µs.
"""
import collections
import re
import sys

lines = open(sys.argv[1]).read().splitlines()
span = next((l for l in lines if l.startswith("span")), "")
total, count = collections.Counter(), collections.Counter()
for line in lines:
    m = re.match(r"\s*([\d.]+)\s+([\d.]+)\s+s(\d+)\s+gap\s+([\d.]+)\s+\|\s*(.*?)\s*\|", line)
    if not m:
        continue
    for p in sys.argv[2:]:
        if re.search(p, m.group(5)):
            total[p] += float(m.group(2))
            count[p] += 1
print(span, " | ".join(f"{p}: {count[p]} x {total[p] / max(count[p], 1):.1f}" for p in sys.argv[2:]))

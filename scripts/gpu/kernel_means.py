#!/usr/bin/env python3
"""Mean time a launch of the kernels matching each pattern, from graph_timeline.py's output.

usage: kernel_means.py TIMELINE.txt PATTERN...
Prints the timeline's span line, then for each pattern (a Python regex on the kernel's name): the
launches in the listed step and their mean duration in µs.
"""
import collections
import re
import sys

import timeline_rows

span = next((l.rstrip("\n") for l in open(sys.argv[1]) if l.startswith("span")), "")
total, count = collections.Counter(), collections.Counter()
for _, duration, _, _, name in timeline_rows.read(sys.argv[1]):
    for p in sys.argv[2:]:
        if re.search(p, name):
            total[p] += duration
            count[p] += 1
print(span, " | ".join(f"{p}: {count[p]} x {total[p] / max(count[p], 1):.1f}" for p in sys.argv[2:]))

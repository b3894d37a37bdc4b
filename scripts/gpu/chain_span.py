#!/usr/bin/env python3
"""The time from each launch of one kernel to the end of the next launch of another, from
graph_timeline.py's output: how long a chain of kernels takes, whatever overlaps inside it.

usage: chain_span.py TIMELINE.txt FIRST_PATTERN LAST_PATTERN
For each kernel matching FIRST_PATTERN (a Python regex on the name), the first later one matching
LAST_PATTERN; prints their count and the mean, least and most of (its end − the first's start), µs.
"""
import re
import sys

import timeline_rows

rows = sorted((start, duration, name) for start, duration, _, _, name in timeline_rows.read(sys.argv[1]))
spans = []
for i, (start, _, name) in enumerate(rows):
    if not re.search(sys.argv[2], name):
        continue
    for start2, dur2, name2 in rows[i + 1:]:
        if re.search(sys.argv[3], name2):
            spans.append(start2 + dur2 - start)
            break
if spans:
    print(f"{sys.argv[2]} .. {sys.argv[3]}: {len(spans)} x mean {sum(spans) / len(spans):.1f} "
          f"min {min(spans):.1f} max {max(spans):.1f}")
else:
    print(f"{sys.argv[2]} .. {sys.argv[3]}: no such launches")

#!/usr/bin/env python3
"""Mean time a launch of the kernels matching each pattern, from graph_timeline.py's output.

usage: kernel_means.py TIMELINE.txt [--ref REF_PATTERN] PATTERN...
Prints the timeline's span line, then for each pattern (a Python regex on the kernel's name): the
launches in the listed step and their mean duration in µs. With --ref, each mean is also given as
a multiple of the mean of the kernels matching REF_PATTERN in the same step: a kernel the compared
change does not touch, so that two traces taken at different clocks (runs of one call drift by
several percent) compare by their ratios.
"""
import collections
import re
import sys

import timeline_rows


def means(path, patterns):
    total, count = collections.Counter(), collections.Counter()
    for _, duration, _, _, name in timeline_rows.read(path):
        for p in patterns:
            if re.search(p, name):
                total[p] += duration
                count[p] += 1
    return {p: (count[p], total[p] / max(count[p], 1)) for p in patterns}


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    path, rest = argv[1], argv[2:]
    ref = None
    if rest[0] == "--ref":
        if len(rest) < 3:
            sys.exit("kernel_means.py: --ref takes a pattern, and at least one pattern follows it")
        ref, rest = rest[1], rest[2:]
    span = next((l.rstrip("\n") for l in open(path) if l.startswith("span")), "")
    found = means(path, rest + ([ref] if ref is not None else []))
    ref_mean = found[ref][1] if ref is not None and found[ref][0] > 0 else None
    if ref is not None and ref_mean is None:
        sys.exit(f"kernel_means.py: no kernel in {path} matches the reference pattern {ref!r}")

    def cell(p):
        n, mean = found[p]
        return f"{p}: {n} x {mean:.1f}" + (f" ({mean / ref_mean:.3f} x ref)" if ref_mean else "")

    print(span, " | ".join(cell(p) for p in rest))


if __name__ == "__main__":
    main(sys.argv)

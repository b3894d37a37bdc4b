"""The kernel rows of graph_timeline.py's output, for the scripts that read it (kernel_means.py,
chain_span.py): (start µs, duration µs, stream, idle gap µs, kernel name) in the listed order."""
import re

ROW = re.compile(r"\s*([\d.]+)\s+([\d.]+)\s+s(\d+)\s+gap\s+([\d.]+)\s+\|\s*(.*?)\s*\|")


def read(path):
    rows = []
    for line in open(path):
        m = ROW.match(line)
        if m:
            rows.append((float(m.group(1)), float(m.group(2)), m.group(3), float(m.group(4)), m.group(5)))
    return rows

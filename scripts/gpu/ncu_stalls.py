#!/usr/bin/env python3
"""Where a kernel's warps wait: ncu's stall samples by source line or by SASS instruction.

Reads the CSV of ncu's source page for one profiled kernel (a report collected with at least
`--section SourceCounters --section WarpStateStats`, and `-lineinfo` in the build for lines):

  ncu -i K.ncu-rep --page source --csv --print-source cuda,sass > lines.csv   (per source line)
  ncu -i K.ncu-rep --page source --csv --print-source sass > sass.csv         (per instruction)

(`--print-source cuda` alone prints the source text without any metric.) Prints the stall reasons'
shares over the whole kernel, then the rows with the most samples, each with its share of all
samples and its two largest reasons; for a per-instruction CSV also the samples and executed
instructions by opcode.

  python3 scripts/gpu/ncu_stalls.py FILE.csv [--top N]
"""
import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def as_int(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def read_rows(path):
    """(header, rows, per_line): rows are (samples, label, stall counts, executed)."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    header = next((r for r in table if r and r[0] in ("Line No", "Address")), None)
    if header is None or SAMPLES not in header:
        sys.exit(f"{path}: no '{SAMPLES}' column; print the page with --print-source cuda,sass or sass "
                 "from a report with SourceCounters and WarpStateStats")
    per_line = header[0] == "Line No"
    # In the per-line form the header names "Source" twice (the line's, then the instruction's):
    # the metrics follow the second, so columns are found by position from the samples' column.
    at = header.index(SAMPLES)
    executed = header.index(EXECUTED, at)
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    rows = []
    source_file = ""
    for r in table:
        if not r:
            continue
        if r[0] == "File Path":
            source_file = r[1].rsplit("/", 1)[-1]
            continue
        if len(r) <= max(reasons):
            continue
        if per_line and r[0].isdigit():
            label = f"{source_file}:{r[0]} {r[1].strip()}"
        elif not per_line and r[0].startswith("0x"):
            label = f"{r[0][-5:]} {r[1].strip()}"
        else:
            continue
        rows.append((as_int(r[at]), label, [as_int(r[i]) for i in reasons], as_int(r[executed])))
    return header, reasons, rows, per_line


def opcode(sass):
    # "@!P1  BRA 0x..." -> BRA; "HMMA.16816.F32.BF16 R1, ..." -> HMMA
    text = re.sub(r"^@!?U?P\w+\s+", "", sass.strip())
    return text.split()[0].split(".")[0] if text else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    header, reasons, rows, per_line = read_rows(args.csv)
    total = sum(r[0] for r in rows)
    if total == 0:
        sys.exit(f"{args.csv}: no stall samples in {len(rows)} rows")
    sums = [sum(r[2][k] for r in rows) for k in range(len(reasons))]
    print(f"{len(rows)} {'lines' if per_line else 'instructions'}, {total} samples, "
          f"{sum(r[3] for r in rows)} instructions executed")
    print("reasons: " + ", ".join(f"{header[i][6:]} {s / total * 100:.1f}%"
                                  for s, i in sorted(zip(sums, reasons), reverse=True) if s / total >= 0.01))
    if not per_line:
        samples, executed = collections.Counter(), collections.Counter()
        for s, label, _, ex in rows:
            op = opcode(label.split(" ", 1)[1])
            samples[op] += s
            executed[op] += ex
        print("by opcode (samples, instructions executed): " +
              ", ".join(f"{op} {s / total * 100:.1f}% {executed[op]}" for op, s in samples.most_common(12)))
    for s, label, counts, _ in sorted(rows, key=lambda r: -r[0])[:args.top]:
        top = sorted(zip(counts, reasons), reverse=True)[:2]
        why = ", ".join(f"{header[i][6:]} {c / s * 100:.0f}%" for c, i in top if c > 0)
        print(f"{s / total * 100:5.1f}%  {label[:90]:90s}  {why}")


if __name__ == "__main__":
    main()

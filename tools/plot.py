#!/usr/bin/env python3
"""Draw one CSV table of kvlab (a file of `kvlab tour --csv-dir DIR`, any file with one header
row, or a bench's `--json FILE`) as a line chart, PNG, with matplotlib:

    kvlab tour --quick --csv-dir out && tools/plot.py out/ch02-1-mode.csv --x position --y seconds

A column is numeric when every value it has parses as a number (empty values are gaps). The x
axis is --x, else the first numeric column whose values are not all the same; the y axis holds
--y's columns, else every other numeric column that varies (a table with fewer than two that
vary, a metric,value list or a single row, is drawn as bars). The rows split into one line per
value of --by, else of the first text column with more than one value (mode: naive and cached).
Reads with the csv module of the standard library; only the drawing needs matplotlib.
"""
import argparse
import csv
import json
import os
import sys


def number(s):
    try:
        float(s)
        return True
    except ValueError:
        return False


def read_json(path, table):
    """A bench's --json file: its results' table number @p table (columns, rows of objects)."""
    with open(path) as f:
        doc = json.load(f)
    tables = doc.get("results") if isinstance(doc, dict) else None
    if not tables:
        sys.exit(f"plot.py: {path} holds no results (a kvlab --json file has a results list)")
    if not 0 <= table < len(tables):
        sys.exit(f"plot.py: {path} has tables 0..{len(tables) - 1}, not {table}")
    header = tables[table]["columns"]
    rows = [["" if r.get(h) is None else str(r.get(h)) for h in header] for r in tables[table]["rows"]]
    return header, rows


def read(path, table=0):
    if path.endswith(".json"):
        return read_json(path, table)
    with open(path, newline="") as f:
        rows = list(csv.reader(f, strict=True))
    if not rows:
        sys.exit(f"plot.py: {path} is empty")
    header, rows = rows[0], rows[1:]
    for i, r in enumerate(rows):
        if len(r) != len(header):
            sys.exit(f"plot.py: {path}: row {i + 2} has {len(r)} fields, the header {len(header)}")
    return header, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("csv", metavar="FILE", help="a CSV file (one header row, then rows), or a "
                    "bench's --json file (FILE.json)")
    ap.add_argument("--table", type=int, default=0, metavar="N", help="of a --json file: the "
                    "results' table N (default 0)")
    ap.add_argument("--x", metavar="COL", help="the x column (default: the first numeric one "
                    "that varies)")
    ap.add_argument("--y", metavar="COL[,COL]", help="the y columns (default: every other "
                    "numeric one that varies)")
    ap.add_argument("--by", metavar="COL", help="one line per value of this column (default: "
                    "the first text column with several values)")
    ap.add_argument("--log-y", action="store_true", help="a logarithmic y axis")
    ap.add_argument("--out", metavar="PNG", help="where to write (default: FILE.png)")
    a = ap.parse_args()

    header, rows = read(a.csv, a.table)
    col = {name: [r[i] for r in rows] for i, name in enumerate(header)}
    numeric = [h for h in header if any(col[h]) and all(number(v) for v in col[h] if v)]
    varies = [h for h in numeric if len(set(col[h])) > 1]
    for name in [a.x, a.by] + (a.y.split(",") if a.y else []):
        if name is not None and name not in col:
            sys.exit(f"plot.py: {a.csv} has no column {name!r} (it has {', '.join(header)})")
    for y in a.y.split(",") if a.y else []:
        if y not in numeric:
            sys.exit(f"plot.py: {a.csv}: the column {y} is not numeric")
    if not a.x and len(varies) < 2:  # nothing to draw against: bars
        return bars(a, header, rows, col, numeric, varies)
    x = a.x or (varies or numeric or [None])[0]
    if x not in numeric:
        sys.exit(f"plot.py: {a.csv}: the x column {x} is not numeric")
    ys = a.y.split(",") if a.y else [h for h in varies if h != x]
    if not ys:
        sys.exit(f"plot.py: {a.csv}: no numeric column to draw against {x}")
    by = a.by or next((h for h in header if h not in numeric and len(set(col[h])) > 1), None)

    plt = pyplot()
    groups = {}
    for r in rows:
        groups.setdefault(r[header.index(by)] if by else "", []).append(r)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for g, grows in groups.items():
        for y in ys:
            pts = [(float(r[header.index(x)]), float(r[header.index(y)])) for r in grows
                   if r[header.index(x)] and r[header.index(y)]]
            if not pts:
                continue
            label = ", ".join(s for s in (g, y if len(ys) > 1 or not g else "") if s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label or y)
    ax.set_xlabel(x)
    ax.set_ylabel(ys[0] if len(ys) == 1 else "value")
    return finish(a, fig, ax, os.path.basename(a.csv) + (f" (lines by {by})" if by else ""),
                  len(groups) > 1 or len(ys) > 1)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # a file, no window
    import matplotlib.pyplot as plt
    return plt


def bars(a, header, rows, col, numeric, varies):
    """A table with fewer than two numeric columns that vary (a metric,value list, one row):
    one bar per row named by its first text column that varies, or one bar per numeric column
    of a single row."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(rows) == 1:
        names = a.y.split(",") if a.y else [h for h in numeric if rows[0][header.index(h)]]
        labels, heights = names, [float(rows[0][header.index(h)]) for h in names]
    else:
        y = a.y.split(",")[0] if a.y else (varies or numeric or [None])[0]
        if y is None:
            sys.exit(f"plot.py: {a.csv}: no numeric column to draw")
        by = a.by or next((h for h in header if h not in numeric and len(set(col[h])) > 1), None)
        kept = [r for r in rows if r[header.index(y)]]
        labels = [r[header.index(by)] if by else str(i + 1) for i, r in enumerate(kept)]
        heights = [float(r[header.index(y)]) for r in kept]
        ax.set_ylabel(y)
    ax.bar(range(len(heights)), heights)
    ax.set_xticks(range(len(heights)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize="small")
    return finish(a, fig, ax, os.path.basename(a.csv), False)


def finish(a, fig, ax, title, legend):
    if a.log_y:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize="small")
    out = a.out or os.path.splitext(a.csv)[0] + ".png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

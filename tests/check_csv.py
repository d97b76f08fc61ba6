#!/usr/bin/env python3
"""Every CSV kvlab writes, read back by a real CSV parser (Python's csv module, RFC 4180).

Each command that prints or writes CSV runs at small sizes, with user-chosen strings that hold
commas where it takes them (a cache spec int8/l0,1, a text file named a,b.txt, output and trace
files named with commas); every row must have its header's column count, and the fields that
carry those strings must read back as the strings themselves. A stream may hold several tables
(kvlab tour): a '#' comment line or a blank line ends one, and a header starts the next.
kvlab tour --csv-dir writes those tables one per file: each file must be one header and rows of
its width, and the files together the stream's tables, in order.

Every bench's --json FILE, read back by Python's json module: the build (version, commit), the
machine (CPU, threads, device, read bandwidth), the options as given, and the same tables as
its --csv FILE of the same run, row for row; tools/plot.py draws one of them.

usage: check_csv.py <kvlab> <datasets folder>     (exit 0: all passed, 1: a failure)
"""
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []
checks = 0


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def is_header(row):
    # a header names its columns: words, none of them a number
    return all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", f) for f in row)


def tables(text, what):
    """The tables of @p text: [(header, rows)], checking that each row has the header's width."""
    out = []
    header, rows = None, []
    lines = text.splitlines(keepends=True)
    # comment lines and blank lines end a table; the csv module reads the rest
    chunk = []

    def flush():
        global checks
        nonlocal header, rows, chunk
        for row in csv.reader(io.StringIO("".join(chunk)), strict=True):
            if header is None or (is_header(row) and rows):
                if header is not None:
                    out.append((header, rows))
                if not is_header(row):
                    fail(f"{what}: a table starts with a row that is not a header: {row}")
                header, rows = row, []
                continue
            checks += 1
            if len(row) != len(header):
                fail(f"{what}: a row of {len(row)} fields under a header of {len(header)}: "
                     f"{row} (header {header})")
            rows.append(row)
        if header is not None:
            out.append((header, rows))
        header, rows, chunk = None, [], []

    for line in lines:
        if line.startswith("#") or not line.strip():
            flush()
        else:
            chunk.append(line)
    flush()
    if not any(rows for _, rows in out):
        fail(f"{what}: no CSV rows in: {text[:300]!r}")
    return out


def column(tbls, name):
    return [r[h.index(name)] for h, rows in tbls if name in h for r in rows]


def run(kvlab, cwd, args):
    r = subprocess.run([kvlab] + args, cwd=cwd, capture_output=True, text=True, timeout=300)
    what = "kvlab " + " ".join(args)
    if r.returncode != 0:
        fail(f"{what}: exit {r.returncode}: {r.stderr[-600:]}")
    return what, r.stdout


def expect(tbls, what, name, want):
    got = column(tbls, name)
    if not got or any(g != want for g in got):
        fail(f"{what}: column {name} reads {sorted(set(got))}, expected {want!r}")


def number(s):
    # a measured value: a decimal number, or inf/nan
    return re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|nan)", s) is not None


def plot_some(out, names):
    """tools/plot.py: --help always; where matplotlib is installed, a line chart and a bar
    chart (a table with one numeric column that varies) drawn as PNG files."""
    plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "plot.py")
    r = subprocess.run([sys.executable, plot, "--help"], capture_output=True, text=True)
    if r.returncode != 0 or "--csv-dir" not in r.stdout:
        fail(f"tools/plot.py --help: exit {r.returncode}: {r.stderr[-300:]}")
    try:
        import matplotlib  # noqa: F401 (only whether it is there)
    except ImportError:
        print("matplotlib not installed: tools/plot.py draws nothing here")
        return
    for name in [n for n in names if n.startswith(("ch02-1-", "ch05-4-"))]:
        png = os.path.join(out, name + ".png")
        r = subprocess.run([sys.executable, plot, os.path.join(out, name), "--out", png],
                           capture_output=True, text=True)
        with open(png, "rb") if os.path.exists(png) else io.BytesIO() as f:
            if r.returncode != 0 or f.read(8) != b"\x89PNG\r\n\x1a\n":
                fail(f"tools/plot.py {name}: exit {r.returncode}, no PNG: {r.stderr[-300:]}")


def check_json(kvlab, d, args):
    """One bench with --json and --csv together: the JSON's tables are the CSV's, value for
    value (numbers as numbers, empty fields as null), beside the build, machine and options."""
    global checks
    what, out = run(kvlab, d, args + ["--json", "j,1.json", "--csv", "j,1.csv"])
    if out.strip():
        fail(f"{what}: printed {out[:80]!r} though the rows went to files")
    try:
        with open(os.path.join(d, "j,1.json")) as f:
            doc = json.load(f)
        with open(os.path.join(d, "j,1.csv"), newline="") as f:
            want = tables(f.read(), what)
    except (OSError, ValueError) as e:
        fail(f"{what}: {e}")
        return None
    checks += 1
    for key in ("kvlab", "commit", "command", "argv", "options", "machine", "results"):
        if key not in doc:
            fail(f"{what}: the JSON lacks {key}")
            return None
    m = doc["machine"]
    if not (m.get("cpu") and m.get("threads", 0) >= 1 and m.get("device")
            and (m.get("read_bandwidth_gbps") or 0) > 0):
        fail(f"{what}: machine reads {m}")
    if doc["options"].get("json") != "j,1.json" or doc["command"] != "kvlab " + " ".join(args[:2]):
        fail(f"{what}: command {doc['command']!r}, options {doc['options']}")
    got = doc["results"]
    if [t["columns"] for t in got] != [h for h, _ in want]:
        fail(f"{what}: the JSON's columns {[t['columns'] for t in got]} are not the CSV's")
        return None
    for t, (h, rows) in zip(got, want):
        checks += 1
        if len(t["rows"]) != len(rows):
            fail(f"{what}: {len(t['rows'])} JSON rows, {len(rows)} CSV rows")
        for jr, cr in zip(t["rows"], rows):
            for name, v in zip(h, cr):
                j = jr.get(name)
                same = (j is None and v == "") or (isinstance(j, str) and j == v) or \
                    (isinstance(j, (int, float)) and number(v) and float(v) == float(j))
                if not same:
                    fail(f"{what}: column {name}: JSON {j!r}, CSV {v!r}")
                    return None
    return os.path.join(d, "j,1.json")


def plot_json(path):
    """tools/plot.py reads a --json file as it reads a CSV (where matplotlib is installed)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    if not path:
        return
    plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "plot.py")
    png = path + ".png"
    r = subprocess.run([sys.executable, plot, path, "--x", "n", "--y", "swap_s,gpu_s", "--out", png],
                       capture_output=True, text=True)
    with open(png, "rb") if os.path.exists(png) else io.BytesIO() as f:
        if r.returncode != 0 or f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail(f"tools/plot.py {path}: exit {r.returncode}, no PNG: {r.stderr[-300:]}")


def check_csv_dir(kvlab, d, stream):
    """tour --csv-dir: one file per table of the --csv stream @p stream, each one header and
    rows of its width (what pandas reads); the same headers in the same order, the same row
    counts, and in each row the same text where it is not a number (numbers are measured)."""
    global checks
    out = os.path.join(d, "tour,dir")
    os.mkdir(out)
    r = subprocess.run([kvlab, "tour", "--csv-dir", out + "-absent"], capture_output=True, text=True)
    if r.returncode != 2 or "-absent" not in r.stderr or os.path.exists(out + "-absent"):
        fail(f"tour --csv-dir into a missing folder: exit {r.returncode}, {r.stderr!r}")
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine")
    what, listing = run(kvlab, d, ["tour", "--quick", "--csv-dir", out])
    with open(os.path.join(out, "notes.txt")) as f:
        if f.read() != "mine":
            fail(f"{what}: a file it did not write changed")
    names = sorted((n for n in os.listdir(out) if n != "notes.txt"), key=lambda n: [int(x) if x.isdigit() else x
                                                   for x in re.split(r"(\d+)", n)])
    got = []
    for name in names:
        m = re.fullmatch(r"ch(\d\d)-(\d+)-([a-z_][a-z0-9_]*)\.csv", name)
        if not m:
            fail(f"{what}: a file not named chNN-T-name.csv: {name}")
            continue
        if os.path.join(out, name) not in listing:
            fail(f"{what}: {name} is not in what it printed: {listing[:300]!r}")
        with open(os.path.join(out, name), newline="") as f:
            rows = list(csv.reader(f, strict=True))
        if not rows or not is_header(rows[0]):
            fail(f"{what}: {name} does not start with a header: {rows[:1]}")
            continue
        named = [c for c in rows[0] if c not in ("part", "chapter")] or rows[0]
        if m.group(3) != named[0].lower():
            fail(f"{what}: {name} is not named by its header's column {named[0]}")
        for r in rows[1:]:
            checks += 1
            if len(r) != len(rows[0]) or is_header(r):
                fail(f"{what}: {name}: a row {r} under the header {rows[0]}")
        got.append((name, rows[0], rows[1:]))
    plot_some(out, [n for n, _, _ in got])
    want = tables(stream, "kvlab tour --quick --csv -")
    if [h for _, h, _ in got] != [h for h, _ in want]:
        fail(f"{what}: the files' headers {[n for n, _, _ in got]} are not the stream's tables "
             f"{[h[:3] for h, _ in want]}")
        return
    for (name, _, rows), (_, want_rows) in zip(got, want):
        checks += 1
        if len(rows) != len(want_rows):
            fail(f"{what}: {name} holds {len(rows)} rows, the stream's table {len(want_rows)}")
        for r, w in zip(rows, want_rows):
            if any(a != b and not (number(a) and number(b)) for a, b in zip(r, w)):
                fail(f"{what}: {name}: the row {r} differs from the stream's {w}")
                break


def main():
    global checks
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    kvlab, datasets = os.path.abspath(sys.argv[1]), sys.argv[2]
    d = tempfile.mkdtemp(prefix="kvlab_csv_")
    try:
        shutil.copy(os.path.join(datasets, "models", "kjv-heldout.txt"), os.path.join(d, "a,b.txt"))
        shutil.copy(os.path.join(datasets, "traces", "alpaca.csv"), os.path.join(d, "tr,ace.csv"))
        cache = "int8/l0,1"

        # eval: the text's name, the cache spec and the layout name (which holds commas) as fields
        for extra in ([], ["--layout", "paged"], ["--recent", "32", "--kl"]):
            what, out = run(kvlab, d, ["eval", "ppl", "--text", "a,b.txt", "--limit", "60",
                                       "--cache", cache, "--csv", "-"] + extra)
            t = tables(out, what)
            expect(t, what, "text", "a,b.txt")
            if not extra:
                expect(t, what, "cache", cache)
            if extra and extra[0] == "--layout":
                got = column(t, "layout")
                if len(got) != 1 or not got[0].startswith("paged, blocks of"):
                    fail(f"{what}: layout reads {got}")
            if extra and extra[0] == "--recent":
                got = column(t, "cache")
                if len(got) != 1 or not got[0].startswith(cache + "/recent32"):
                    fail(f"{what}: cache reads {got}")
        for sub in ("keys", "mass"):
            what, out = run(kvlab, d, ["eval", sub, "--text", "a,b.txt", "--tokens", "16", "--csv", "-"])
            tables(out, what)

        # needle and serve: files named with commas, the cache spec in a column
        what, _ = run(kvlab, d, ["needle", "--models", "direct", "--lengths", "64", "--depths",
                                 "0,50", "--cache", cache, "--csv", "n,1.csv"])
        with open(os.path.join(d, "n,1.csv"), newline="") as f:
            expect(tables(f.read(), what), what, "cache", cache)
        what, _ = run(kvlab, d, ["serve", "--trace", "tr,ace.csv", "--max-requests", "4",
                                 "--csv", "l,1.csv", "--timeline", "t,1.csv"])
        for name in ("l,1.csv", "t,1.csv"):
            with open(os.path.join(d, name), newline="") as f:
                tables(f.read(), what + " (" + name + ")")

        # every other command's --csv, at small sizes
        for args in (["stream", "--tokens", "400", "--full-tokens", "200", "--csv", "-"],
                     ["spec", "--default", "tiny", "--tokens", "16", "--max-k", "2", "--csv", "-"],
                     ["spec", "--default", "tiny", "--tokens", "16", "--max-k", "2", "--window",
                      "32", "--csv", "-"],
                     ["bench", "attention-gqa", "--seq", "256", "--repeats", "1", "--csv", "-"],
                     ["bench", "swap", "--max", "64", "--measure-max", "32", "--repeats", "1",
                      "--csv", "-"],
                     ["bench", "paged", "--lengths", "64", "--repeats", "1", "--heads", "4",
                      "--kv-heads", "2", "--head-dim", "32", "--csv", "-"],
                     ["bench", "attention", "--decode", "64", "--prefill", "64", "--repeats", "1",
                      "--prefill-repeats", "1", "--heads", "4", "--kv-heads", "2", "--csv", "-"],
                     ["bench", "quant", "--quick", "--no-needles", "--seq", "256", "--repeats",
                      "1", "--csv", "-"],
                     ["bench", "decode", "--steps", "8", "--repeats", "1", "--csv", "-"],
                     ["bench", "bandwidth", "--mib", "8", "--repeats", "1", "--csv", "-"],
                     ["bench", "engine", "--tokens", "8", "--repeats", "1", "--dim", "64",
                      "--layers", "1", "--heads", "2", "--hidden", "64", "--vocab", "64",
                      "--csv", "-"],
                     ["calc", "--csv", "-"],
                     ["calc", "--preset", "llama-3-8b", "--seq", "4096", "--tp", "4", "--csv", "-"],
                     ["tp", "--default", "tiny", "--tokens", "8", "--repeats", "1", "--csv", "-"],
                     ["tour", "--quick", "--csv", "-"]):
            what, out = run(kvlab, d, args)
            tables(out, what)
        out_tour = out

        # --csv FILE writes what --csv - prints (a name with a comma); the commands that write
        # their own file print the rows alone on stdout with --csv -, the tables on stderr
        what, out = run(kvlab, d, ["calc", "--csv", "c,1.csv"])
        with open(os.path.join(d, "c,1.csv"), newline="") as f:
            checks += 1
            if out != "" or f.read() != run(kvlab, d, ["calc", "--csv", "-"])[1]:
                fail(f"{what}: the file differs from --csv -'s output, or the table was printed")
        for args in (["needle", "--models", "direct", "--lengths", "64", "--depths", "50",
                      "--csv", "-"],
                     ["serve", "--trace", "tr,ace.csv", "--max-requests", "4", "--csv", "-"]):
            what, out = run(kvlab, d, args)
            tables(out, what)
        check_csv_dir(kvlab, d, out_tour)  # tour --quick --csv -

        # every bench's --json (the CPU ones; prefill, mla and the --device cuda runs need a GPU)
        plotted = None
        for args in (["bench", "decode", "--steps", "8", "--repeats", "1"],
                     ["bench", "attention-gqa", "--seq", "256", "--repeats", "1"],
                     ["bench", "quant", "--quick", "--no-needles", "--seq", "256", "--repeats", "1"],
                     ["bench", "bandwidth", "--mib", "8", "--repeats", "1"],
                     ["bench", "engine", "--tokens", "8", "--repeats", "1", "--dim", "64",
                      "--layers", "1", "--heads", "2", "--hidden", "64", "--vocab", "64"],
                     ["bench", "paged", "--lengths", "64", "--repeats", "1", "--heads", "4",
                      "--kv-heads", "2", "--head-dim", "32"],
                     ["bench", "attention", "--decode", "64", "--prefill", "64", "--repeats", "1",
                      "--prefill-repeats", "1", "--heads", "4", "--kv-heads", "2"],
                     ["bench", "swap", "--max", "64", "--measure-max", "32", "--repeats", "1"]):
            path = check_json(kvlab, d, args)
            if path and args[1] == "swap":
                plotted = os.path.join(d, "swap.json")
                shutil.copy(path, plotted)
        plot_json(plotted)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"{checks} rows checked; {checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

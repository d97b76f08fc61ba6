#!/usr/bin/env python3
"""Build the training corpus from the King James Version that Debian's bible-kjv-text ships.

The text comes from the installed package (read through its `bible` program, Debian package
bible-kjv), never from the network. Output: one verse per line, verse numbers and chapter
headings left out, books in canonical order.

    train.txt    Genesis .. Philemon   (the first 57 books)
    heldout.txt  Hebrews .. Revelation (the last 9 books: a fixed held-out split)

Usage: corpus.py OUTDIR
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys

HELDOUT_FIRST_BOOK = "Hebrews"  # this book and every one after it are held out
HEADING = re.compile(r"^(?:[123] )?[A-Z][A-Za-z ]+ \d+$")  # "Genesis 1", "1 Samuel 3"
VERSE = re.compile(r"^\s+\d+ (.*)$")  # "  1 In the beginning ..."


def read_bible():
    exe = shutil.which("bible")
    if exe is None:
        sys.exit("corpus.py: the `bible` program is missing: apt-get install bible-kjv bible-kjv-text")
    # -l: one verse per line (no wrapping); the whole book range in one call
    out = subprocess.run([exe, "-l", "100000", "gen1:1-rev22:21"], check=True,
                         capture_output=True).stdout.decode("ascii")
    books = []  # [(book, [verse, ...])]
    for line in out.splitlines():
        if not line.strip():
            continue
        m = VERSE.match(line)
        if m:
            books[-1][1].append(" ".join(m.group(1).split()))
        elif HEADING.match(line):
            book = line.rsplit(" ", 1)[0]
            if not books or books[-1][0] != book:
                books.append((book, []))
        else:
            sys.exit(f"corpus.py: unexpected line in the bible output: {line!r}")
    return books


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    books = read_bible()
    names = [b for b, _ in books]
    if len(books) != 66 or HELDOUT_FIRST_BOOK not in names:
        sys.exit(f"corpus.py: expected the 66 books of the KJV, found {len(books)}")
    cut = names.index(HELDOUT_FIRST_BOOK)
    for name, part in (("train.txt", books[:cut]), ("heldout.txt", books[cut:])):
        text = "".join(v + "\n" for _, verses in part for v in verses)
        path = os.path.join(outdir, name)
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.write(text)
        digest = hashlib.sha256(text.encode("ascii")).hexdigest()
        print(f"{path}: {len(part)} books, {text.count(chr(10))} verses, {len(text)} bytes, "
              f"sha256 {digest}")


if __name__ == "__main__":
    main()

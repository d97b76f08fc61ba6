#!/usr/bin/env python3
"""The docs site as a reader sees it: every page written from Markdown (the chapters, the notes,
the reading guides, the main page) and every page that holds a formula, loaded in a headless
Chromium, one after another in a frame of a probe page, each checked once MathJax has typeset it.

A page fails on
  * a MathJax error: an merror element (the red box of "Undefined control sequence"), a
    MathJax_Error ("Math Processing Error"), or that sentence in the visible text;
  * a literal tag in the visible text, such as <tt> or </tt> (Markdown that Doxygen escaped
    instead of rendering);
  * a broken image: an <img> that did not decode (complete, natural width 0);
  * a chapter page without its previous/next footer (docs/chapter_nav.cmake).

usage: check_docs_render.py HTML_DIR [--chromium PATH] [--require]

Exit 0 when every page passes, 1 when one fails, 77 (skipped) when Chromium or the built pages
are absent, with the command that provides them; --require turns that skip into a failure (CI's
docs stage, right after building the docs target).
"""
import argparse
import glob
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
CHROMIUM_NAMES = ["chromium", "chromium-headless-shell", "chrome-headless-shell", "chromium-browser"]

# The probe loads each page into the frame; on load it waits for MathJax's queue to drain (when
# the page has MathJax), inspects the page, writes one line, and moves to the next page. The
# lines go into the probe's own <pre>, which --dump-dom prints.
PROBE = r"""<!DOCTYPE html><html><body><pre id="out">pending</pre>
<iframe id="f" width="1280" height="900"></iframe>
<script>
var pages = %(pages)s, i = 0, lines = [];
var frame = document.getElementById('f');
function visibleText(d) { return d.body ? (d.body.innerText || '') : ''; }
function inspect() {
  var d = frame.contentDocument, bad = [];
  if (!d || !d.body) { bad.push('no access to the page'); }
  else {
    var merr = d.querySelectorAll('.merror, .MathJax_Error, merror');
    for (var k = 0; k < merr.length && k < 3; k++)
      bad.push('MathJax error: ' + (merr[k].textContent || '').slice(0, 80));
    var text = visibleText(d);
    if (merr.length === 0 && text.indexOf('Undefined control sequence') >= 0)
      bad.push('MathJax error: Undefined control sequence');
    var tag = text.match(/<\/?(tt|code|em|b|i|sup|sub|br)>/);
    if (tag) {
      var at = text.indexOf(tag[0]);
      bad.push('a literal ' + tag[0] + ' in the text: ' + JSON.stringify(text.slice(Math.max(0, at - 30), at + 30)));
    }
    var imgs = d.querySelectorAll('img');
    for (var k = 0; k < imgs.length; k++)
      if (!imgs[k].complete || imgs[k].naturalWidth === 0)
        bad.push('broken image: ' + imgs[k].getAttribute('src'));
  }
  lines.push((bad.length ? 'FAIL ' : 'ok ') + pages[i] + (bad.length ? ' | ' + bad.join(' | ') : ''));
  i++;
  next();
}
function next() {
  if (i >= pages.length) { document.getElementById('out').textContent = 'DONE\n' + lines.join('\n'); return; }
  frame.onload = function () {
    var w = frame.contentWindow;
    if (w && w.MathJax && w.MathJax.Hub && w.MathJax.Hub.Queue) w.MathJax.Hub.Queue(inspect);
    else inspect();
  };
  frame.src = pages[i];
}
next();
</script></body></html>
"""


def find_chromium(given):
    if given:
        return given if os.access(given, os.X_OK) else shutil.which(given)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def pages_to_check(html_dir):
    """The Markdown pages, the generated chapter/notes pages, the main page, and any other page
    with a formula (MathJax's delimiters as Doxygen writes them)."""
    chosen = []
    for path in sorted(glob.glob(os.path.join(html_dir, "*.html"))):
        name = os.path.basename(path)
        if name.startswith("probe_"):
            continue
        if name.startswith("md_") or name in ("index.html", "chapters.html", "notes.html", "cpu_cuda.html"):
            chosen.append(name)
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if "\\(" in text or "\\[" in text or "class=\"formula" in text:
            chosen.append(name)
    return chosen


def static_checks(html_dir, pages):
    """What needs no browser: an escaped tag in a page's text outside code blocks, and a
    chapter page's footer."""
    bad = []
    for name in pages:
        with open(os.path.join(html_dir, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        body = re.sub(r"<div class=\"fragment\">.*?</div><!-- fragment -->", "", text, flags=re.S)
        if re.match(r"md_chapters_[0-9][0-9]_.*README\.html$", name) and "class=\"kv-chapter-nav\"" not in text:
            bad.append("FAIL %s | no previous/next chapter footer (docs/chapter_nav.cmake)" % name)
        m = re.search(r"&lt;/?tt&gt;", body)
        if m:
            around = html.unescape(re.sub(r"<[^>]+>", "", body[max(0, m.start() - 80):m.end() + 80]))
            bad.append("FAIL %s | an escaped <tt> in the page: %r" % (name, around.strip()))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html_dir")
    ap.add_argument("--chromium")
    ap.add_argument("--require", action="store_true",
                    help="fail (instead of skipping) when Chromium or the pages are absent")
    ap.add_argument("--batch", type=int, default=40, help="pages per Chromium process")
    a = ap.parse_args()
    absent = SKIP if not a.require else 1

    html_dir = os.path.abspath(a.html_dir)
    if not os.path.isfile(os.path.join(html_dir, "index.html")):
        print("check_docs_render: no built docs in %s: build them first "
              "(cmake --build build --target docs)" % html_dir)
        return absent
    chromium = find_chromium(a.chromium)
    if not chromium:
        print("check_docs_render: no headless Chromium: apt-get install chromium "
              "(tools/setup/install-deps.sh installs it with the docs tools)")
        return absent

    pages = pages_to_check(html_dir)
    failures = static_checks(html_dir, pages)
    n_ok = 0
    for start in range(0, len(pages), a.batch):
        batch = pages[start:start + a.batch]
        fd, probe = tempfile.mkstemp(prefix="probe_", suffix=".html", dir=html_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(PROBE % {"pages": "[" + ",".join('"%s"' % p for p in batch) + "]"})
        try:
            r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                                "--allow-file-access-from-files", "--virtual-time-budget=%d" % (2000 * len(batch) + 10000),
                                "--dump-dom", "file://" + probe],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=600)
            dom = r.stdout.decode("utf-8", errors="replace")
        except subprocess.TimeoutExpired:
            dom = ""
        finally:
            os.remove(probe)
        m = re.search(r"<pre id=\"out\">(.*?)</pre>", dom, flags=re.S)
        report = html.unescape(m.group(1)) if m else ""
        if not report.startswith("DONE"):
            failures.append("FAIL pages %s..%s | the browser did not finish (%s)"
                            % (batch[0], batch[-1], report.split("\n")[0] or "no output"))
            continue
        for line in report.split("\n")[1:]:
            if line.startswith("FAIL"):
                failures.append(line)
            elif line.startswith("ok "):
                n_ok += 1

    for line in failures:
        print(line)
    print("check_docs_render: %d pages rendered in %s, %d passed, %d failed"
          % (len(pages), os.path.basename(chromium), n_ok, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

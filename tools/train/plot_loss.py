#!/usr/bin/env python3
"""The loss curve CSV written by train.py as an SVG line chart, with no plotting library.

Usage: plot_loss.py LOSS_CSV OUT_SVG
Train loss per step (thin, light), its running mean over 20 steps, and the held-out loss at each
evaluation (points joined), against tokens seen.
"""
import csv
import sys

W, H, ML, MR, MT, MB = 640, 360, 60, 20, 30, 45


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    tok = [int(r["tokens"]) / 1e6 for r in rows]
    tr = [float(r["train_loss"]) for r in rows]
    mean = [sum(tr[max(0, i - 19):i + 1]) / len(tr[max(0, i - 19):i + 1]) for i in range(len(tr))]
    held = [(t, float(r["heldout_loss"])) for t, r in zip(tok, rows) if r["heldout_loss"]]
    x1 = max(tok)
    y0, y1 = 0.0, max(8.0, max(tr))
    y0 = int(min(min(tr), min(h for _, h in held) if held else 9) - 0.5)

    def px(t):
        return ML + (W - ML - MR) * t / x1

    def py(v):
        return MT + (H - MT - MB) * (1 - (v - y0) / (y1 - y0))

    def path(pts):
        return " ".join(f"{'M' if i == 0 else 'L'}{px(t):.1f},{py(v):.1f}" for i, (t, v) in enumerate(pts))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for k in range(int(y0), int(y1) + 1):  # horizontal grid, one line per nat
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{py(k):.1f}" y2="{py(k):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{ML - 6}" y="{py(k) + 4:.1f}" text-anchor="end">{k}</text>')
    for i in range(6):
        t = x1 * i / 5
        out.append(f'<text x="{px(t):.1f}" y="{H - MB + 16}" text-anchor="middle">{t:.2f}</text>')
    out.append(f'<text x="{(W + ML) / 2}" y="{H - 8}" text-anchor="middle">tokens seen (millions)</text>')
    out.append(f'<text x="14" y="{(H - MB + MT) / 2}" transform="rotate(-90 14 {(H - MB + MT) / 2})" '
               f'text-anchor="middle">loss (nats per token)</text>')
    out.append(f'<path d="{path(list(zip(tok, tr)))}" fill="none" stroke="#9ecae1" stroke-width="0.8"/>')
    out.append(f'<path d="{path(list(zip(tok, mean)))}" fill="none" stroke="#08519c" stroke-width="1.6"/>')
    if held:
        out.append(f'<path d="{path(held)}" fill="none" stroke="#d94801" stroke-width="1.6"/>')
        out += [f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="2.5" fill="#d94801"/>' for t, v in held]
    out.append(f'<text x="{W - MR}" y="{MT - 10}" text-anchor="end">'
               f'<tspan fill="#08519c">train (mean of 20 steps)</tspan>  '
               f'<tspan fill="#d94801">held-out</tspan></text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

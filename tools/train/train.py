#!/usr/bin/env python3
"""Train kvlab's model on the King James Version and export it for kvlab.

    python3 tools/train/train.py                 # the shipped model (datasets/models/kjv.*)
    python3 tools/train/train.py --smoke --out D # 20 steps of a tiny model (the `train` test)

Steps: build the corpus from the installed Debian package (corpus.py), train the BPE tokenizer
on the train split (tokenizer.py), train the model (model.py) with a fixed seed, then write
beside each other in --out:

    NAME.bin            the checkpoint, kvlab format v1 (fp32, tied classifier)
    NAME-tokenizer.bin  llama2.c tokenizer.bin
    NAME-loss.csv       step, tokens seen, learning rate, train loss, held-out loss, seconds
    NAME.check          what kvlab's tests compare against: held-out tokens and mean NLL
                        (fp32, this trainer's own evaluation), the fixed prompt's ids
    NAME.logits         float32 [prompt tokens][vocab]: the logits after every prompt token
    NAME-heldout.txt    the held-out split, eval ppl's default text
    SHA256SUMS          sha256sum lines of the checkpoint, the tokenizer and the held-out text

Held-out perplexity is defined as kvlab eval ppl computes it: the stream [BOS] + encode(held-out
text) cut into windows of seq_len tokens that overlap by one (stride seq_len - 1), each window
run from position 0, so every token after the first is predicted exactly once.
"""
import argparse
import csv
import hashlib
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402
import tokenizer as tok  # noqa: E402

PROMPT = "In the beginning God created the heaven and the earth. And"


def parse_args():
    root = os.path.dirname(os.path.dirname(HERE))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(root, "datasets", "models"))
    p.add_argument("--work", default=None, help="corpus and tokenizer model (default OUT/../build-train)")
    p.add_argument("--name", default="kjv")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--steps", type=int, default=800, help="training steps")
    p.add_argument("--decay-start", type=int, default=-1,
                   help="step where the learning rate starts its decay (default: 80%% of --steps)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-windows", type=int, default=4, help="held-out windows per interim eval")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=0,
                   help="minutes: start the decay at 80%% of it and end near it (the steps are "
                        "printed, to reproduce the run with --steps and --decay-start)")
    p.add_argument("--smoke", action="store_true", help="a tiny model for 20 steps (the train test)")
    a = p.parse_args()
    if a.smoke:
        a.vocab, a.dim, a.layers, a.heads, a.hidden, a.seq_len = 512, 64, 2, 4, 128, 128
        a.batch, a.steps, a.warmup, a.eval_every, a.eval_windows = 4, 20, 5, 10, 2
    if a.work is None:
        a.work = os.path.join(a.out, "build-train") if a.smoke else os.path.join(root, "build-train")
    return a


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per 2 % otherwise."""

    def __init__(self, total):
        self.total, self.t0, self.tty, self.last = total, time.time(), sys.stderr.isatty(), -1

    def update(self, step, msg):
        frac = step / self.total
        el = time.time() - self.t0
        eta = el / frac - el if frac > 0 else 0
        bar = "#" * int(30 * frac)
        line = f"[{bar:<30}] {step}/{self.total} {msg} {el:.0f}s elapsed, eta {eta:.0f}s"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if step == self.total else ""))
        elif int(frac * 50) != self.last or step == self.total:
            self.last = int(frac * 50)
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def build_train_stream(sp, text):
    """Training samples start at a verse with BOS, as `kvlab generate` starts: each line's ids
    with the dummy-prefix space (used when a sample starts there) and without (mid-text)."""
    lines = text.rstrip("\n").split("\n")
    first = [sp.encode(" " + l) for l in lines]
    rest = tok.encode_lines(sp, lines, first_has_prefix=False)
    starts, flat = [], []
    for r in rest:  # flat: every line without the prefix, each followed by <0x0A>
        starts.append(len(flat))
        flat.extend(r)
        flat.append(tok.NEWLINE)
    return first, np.array(starts), np.array(flat, dtype=np.int64)


def sample_batch(rng, first, starts, flat, B, T):
    """B sequences of T + 1 ids: BOS, verse j with the prefix space, then the text after it."""
    last_ok = np.searchsorted(starts, len(flat) - T - 1, side="right") - 1
    out = np.empty((B, T + 1), dtype=np.int64)
    for b in range(B):
        j = int(rng.integers(0, last_ok))
        head = [tok.BOS] + first[j] + [tok.NEWLINE]
        nxt = starts[j + 1]
        out[b] = np.concatenate([head, flat[nxt:nxt + T + 1 - len(head)]])[:T + 1]
    x = torch.from_numpy(out)
    return x[:, :-1], x[:, 1:]


def heldout_windows(stream, T):
    """Windows of T ids with stride T - 1 (the definition in the module docstring)."""
    w, s = [], 0
    while s < len(stream) - 1:
        w.append(stream[s:s + T])
        s += T - 1
    return w


@torch.no_grad()
def evaluate(model, windows, device):
    """Mean NLL (nats per token, fp32 forward, float64 sum) over the windows' predictions."""
    model.eval()
    total, count = 0.0, 0
    for w in windows:
        x = torch.tensor(w, dtype=torch.int64, device=device)[None]
        logits = model(x[:, :-1]).float()
        nll = F.cross_entropy(logits[0], x[0, 1:], reduction="none")
        total += nll.double().sum().item()
        count += nll.numel()
    model.train()
    return total / count, count


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    t_start = time.time()

    # 1. corpus and tokenizer
    subprocess.run([sys.executable, os.path.join(HERE, "corpus.py"), a.work], check=True)
    train_text = open(os.path.join(a.work, "train.txt"), encoding="ascii").read()
    heldout_text = open(os.path.join(a.work, "heldout.txt"), encoding="ascii").read()
    sp = tok.train(os.path.join(a.work, "train.txt"), os.path.join(a.work, a.name + "-sp"), a.vocab)
    tok_path = os.path.join(a.out, a.name + "-tokenizer.bin")
    pieces, scores = tok.export_bin(sp, tok_path)
    heldout = [tok.BOS] + tok.encode(sp, heldout_text)
    # the ids are kvlab's: check the fast path against the port of kv_tokenizer_encode
    sample = heldout_text[:20000] if a.smoke else heldout_text
    if tok.encode(sp, sample) != tok.kvlab_encode(pieces, scores, sample):
        sys.exit("train.py: sentencepiece's ids differ from kvlab's encode on the held-out text")
    first, starts, flat = build_train_stream(sp, train_text)
    n_train = int(len(flat))
    print(f"tokenizer: {a.vocab} pieces; train split {n_train} tokens, held-out {len(heldout)}",
          file=sys.stderr)

    # 2. model
    cfg = M.Config(a.dim, a.layers, a.heads, a.heads, a.hidden, a.vocab, a.seq_len)
    model = M.Transformer(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: dim {a.dim}, L {a.layers}, H {a.heads}, H_kv {a.heads}, d {cfg.head_dim}, "
          f"hidden {a.hidden}, vocab {a.vocab}, seq {a.seq_len}: {n_params} parameters",
          file=sys.stderr)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    windows = heldout_windows(heldout, a.seq_len)

    if a.decay_start < 0:
        a.decay_start = int(0.8 * a.steps)

    def lr_at(step):  # warmup, stable, decay: linear up, flat, then cosine down to lr / 10
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        if step < a.decay_start:
            return a.lr
        t = (step - a.decay_start) / max(1, a.steps - a.decay_start)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    # 3. train
    csv_path = os.path.join(a.out, a.name + "-loss.csv")
    rows, t0 = [], time.time()
    tokens_per_step = a.batch * a.seq_len
    smooth = None
    if a.time_limit > 0:  # the schedule is fixed when the decay starts (below)
        a.steps = a.decay_start = 10 ** 9
    bar, step = Progress(a.steps if a.time_limit <= 0 else 1), 0
    while step < a.steps:
        step += 1
        lr = lr_at(step - 1)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = sample_batch(rng, first, starts, flat, a.batch, a.seq_len)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        smooth = lv if smooth is None else 0.9 * smooth + 0.1 * lv
        held = ""
        el = time.time() - t0
        if a.time_limit > 0 and a.decay_start == 10 ** 9 and el > 0.8 * 60 * a.time_limit:
            a.decay_start = step
            a.steps = step + max(1, int(0.2 * 60 * a.time_limit / (el / step)))
            print(f"time limit: decay from step {a.decay_start} to step {a.steps} (reproduce "
                  f"with --steps {a.steps} --decay-start {a.decay_start})", file=sys.stderr)
        bar.total = a.steps if a.steps < 10 ** 9 else max(step + 1, int(step * 60 * a.time_limit / el))
        if step % a.eval_every == 0 or step == a.steps:
            held = f"{evaluate(model, windows[:a.eval_windows], device)[0]:.4f}"
        rows.append([step, step * tokens_per_step, f"{lr:.3e}", f"{lv:.4f}", held,
                     f"{time.time() - t0:.1f}"])
        bar.update(step, f"loss {smooth:.3f}" + (f" held-out {held}" if held else ""))
        if held or step == a.steps:
            with open(csv_path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["step", "tokens", "lr", "train_loss", "heldout_loss", "seconds"])
                w.writerows(rows)
    train_s = time.time() - t0

    # 4. export and the values kvlab's tests compare against (fp32, on the CPU)
    model = model.to("cpu").float()
    ckpt = os.path.join(a.out, a.name + ".bin")
    M.export_kvlab(model, ckpt)
    nll, count = evaluate(model, windows, "cpu")
    prompt = [tok.BOS] + tok.encode(sp, PROMPT)
    with torch.no_grad():
        logits = model(torch.tensor(prompt)[None])[0].float()
    logits.numpy().astype("<f4").tofile(os.path.join(a.out, a.name + ".logits"))
    tail = [float(r[3]) for r in rows[-max(1, len(rows) // 20):]]
    with open(os.path.join(a.out, a.name + ".check"), "w") as f:
        f.write("# written by tools/train/train.py at export; read by kvlab's tests\n")
        f.write(f"heldout_tokens {count}\n")
        f.write(f"heldout_nll {nll:.9f}\n")
        f.write(f"heldout_ppl {math.exp(nll):.6f}\n")
        f.write(f"train_loss_last5pct {sum(tail) / len(tail):.4f}\n")
        f.write(f"steps {a.steps}\ndecay_start {a.decay_start}\ntokens_seen {a.steps * tokens_per_step}\n")
        f.write(f"train_seconds {train_s:.0f}\nparameters {n_params}\n")
        f.write(f"prompt_text {PROMPT}\n")
        f.write("prompt_ids " + " ".join(str(t) for t in [len(prompt)] + prompt) + "\n")
    heldout_path = os.path.join(a.out, a.name + "-heldout.txt")
    shutil.copyfile(os.path.join(a.work, "heldout.txt"), heldout_path)
    with open(os.path.join(a.out, "SHA256SUMS"), "w") as f:
        for p in (ckpt, tok_path, heldout_path):
            f.write(f"{sha256(p)}  {os.path.basename(p)}\n")
    print(f"done in {time.time() - t_start:.0f} s (training {train_s:.0f} s): train loss "
          f"{sum(tail) / len(tail):.4f} (mean of the last 5 %), held-out NLL {nll:.4f} "
          f"(perplexity {math.exp(nll):.3f}) over {count} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()

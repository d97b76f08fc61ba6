"""The model kvlab runs (reference_cpu/engine/kv_forward.c), written in PyTorch for training,
and its export to kvlab's checkpoint format (reference_cpu/model/kv_checkpoint.c).

    embed -> L x [ RMSNorm -> Q,K,V -> RoPE(Q,K) -> causal attention (scale 1/sqrt(d)) -> Wo
                   -> residual -> RMSNorm -> W2(silu(W1 x) * W3 x) -> residual ]
          -> RMSNorm -> classifier (tied to the embedding)

The conventions kvlab fixes, matched here:
  RMSNorm   x * rsqrt(mean(x^2) + eps) * g, eps = 1e-5 (kv_rmsnorm)
  RoPE      adjacent pairs (x[2i], x[2i+1]) rotated by pos * theta^(-2i/d), theta 10000,
            every dim of the head (kv_rope with rotary_dim = d): llama2.c's pairing
  SwiGLU    w1 is the gate, w3 the up projection, w2 the down projection (kv_swiglu)
  matrices  row-major [out][in], as nn.Linear stores them
"""
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, dim, n_layers, n_heads, n_kv_heads, hidden_dim, vocab_size, seq_len,
                 rope_theta=10000.0, norm_eps=1e-5):
        self.dim, self.n_layers, self.n_heads, self.n_kv_heads = dim, n_layers, n_heads, n_kv_heads
        self.hidden_dim, self.vocab_size, self.seq_len = hidden_dim, vocab_size, seq_len
        self.rope_theta, self.norm_eps = rope_theta, norm_eps
        self.head_dim = dim // n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg, device):
    """cos and sin [seq_len][d/2] of pos * theta^(-2i/d), in float64 then rounded (kv_rope)."""
    i = torch.arange(0, cfg.head_dim, 2, dtype=torch.float64)
    freq = cfg.rope_theta ** (-i / cfg.head_dim)
    ang = torch.arange(cfg.seq_len, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)


def apply_rope(x, cos, sin):
    """x [B][T][H][d]: rotate each adjacent pair (x[2i], x[2i+1]) by the position's angle."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, kv = cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.cfg = cfg
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * d, bias=False)
        self.wk = nn.Linear(cfg.dim, kv, bias=False)
        self.wv = nn.Linear(cfg.dim, kv, bias=False)
        self.wo = nn.Linear(cfg.n_heads * d, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)  # down
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # up

    def forward(self, x, cos, sin):
        cfg = self.cfg
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, cfg.n_heads, cfg.head_dim)
        k = self.wk(h).view(B, T, cfg.n_kv_heads, cfg.head_dim)
        v = self.wv(h).view(B, T, cfg.n_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        g = cfg.n_heads // cfg.n_kv_heads
        if g > 1:  # grouped-query attention: each KV head serves g query heads
            k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B][H][T][d]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(cfg.head_dim)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, cfg.n_heads * cfg.head_dim)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.apply(self._init)
        # GPT-2's scaled init of the projections that write into the residual stream
        for n, p in self.named_parameters():
            if n.endswith("wo.weight") or n.endswith("w2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, tokens):
        """tokens [B][T] -> logits [B][T][vocab] (classifier tied to the embedding)."""
        T = tokens.shape[1]
        cos, sin = rope_tables(self.cfg, tokens.device)
        cos, sin = cos[:T], sin[:T]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x) @ self.tok_embeddings.weight.t()


def export_kvlab(model, path):
    """kvlab checkpoint v1 (kv_checkpoint.c): 256-byte header, then fp32 weights in llama2.c
    order: embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final (tied: no wcls)."""
    cfg = model.cfg
    hdr = bytearray(256)
    hdr[0:4] = b"KVLB"
    struct.pack_into("<8ifif2i", hdr, 4, 1, cfg.dim, cfg.hidden_dim, cfg.n_layers,
                     cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len, cfg.rope_theta,
                     cfg.head_dim, cfg.norm_eps, 1, 0)
    L = model.layers
    parts = [model.tok_embeddings.weight]
    parts += [l.attention_norm.weight for l in L]
    for name in ("wq", "wk", "wv", "wo"):
        parts += [getattr(l, name).weight for l in L]
    parts += [l.ffn_norm.weight for l in L]
    for name in ("w1", "w2", "w3"):
        parts += [getattr(l, name).weight for l in L]
    parts.append(model.norm.weight)
    with open(path, "wb") as f:
        f.write(bytes(hdr))
        for p in parts:
            f.write(p.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes())

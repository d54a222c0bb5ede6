"""The small decoder-only transformer that the ``training`` area and ``bench/training.py``
train, and its tensor-parallel plan.

Llama-shaped (token embedding, pre-norm blocks of causal multi-head attention and a SiLU-gated
feed-forward, RMSNorm, output projection, no biases) because that is what FSDP2 and
``parallelize_module`` are used on; biases are left out on purpose: a key bias has a gradient
that is zero in exact arithmetic (softmax ignores a per-row constant), and AdamW turns the
rounding noise in such a gradient into full-size updates that no two reduction orders agree on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    dim: int = 16
    heads: int = 4
    hidden: int = 32
    layers: int = 2
    #: ``F.scaled_dot_product_attention`` instead of the explicit softmax(q k^T / sqrt(d)) v.
    sdpa: bool = False
    #: Dropout after the attention and the feed-forward (0 disables it).
    dropout: float = 0.0


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.heads
        self.sdpa = cfg.sdpa
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(cfg.dim, cfg.dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: the heads this rank holds (all of them, or its share under ColwiseParallel)
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5
            # ones_like: a DTensor mask for DTensor scores (a plain mask would mix the two)
            future = torch.ones_like(scores, dtype=torch.bool).triu(1)
            out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(cfg.dim), nn.RMSNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x)))
        return x + self.dropout(self.feed_forward(self.ffn_norm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: Config = Config()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def loss_fn(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy (mean over the batch's predicted positions)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def tp_plan(model: Transformer, local_heads: bool = True) -> dict:
    """The tensor-parallel plan: the embedding Rowwise on the vocab dim, wq/wk/wv and w1/w3
    Colwise (each rank holds whole heads), wo and w2 Rowwise, the output Colwise gathered to a
    replicated result; norms stay plain (replicated) tensors. ``local_heads``: wq/wk/wv return
    this rank's heads as plain tensors (torchtitan's Llama); otherwise as DTensors sharded on
    the heads dim, so attention runs on DTensors (torch's own TP test Transformer)."""
    heads = ColwiseParallel(use_local_output=local_heads)
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.layers)):
        plan.update({
            f"layers.{i}.attention.wq": heads,
            f"layers.{i}.attention.wk": heads,
            f"layers.{i}.attention.wv": heads,
            f"layers.{i}.attention.wo": RowwiseParallel(),
            f"layers.{i}.feed_forward.w1": ColwiseParallel(),
            f"layers.{i}.feed_forward.w2": RowwiseParallel(),
            f"layers.{i}.feed_forward.w3": ColwiseParallel(),
        })
    return plan


def tokens(batch: int, seq: int, seed: int, vocab: int = Config.vocab) -> torch.Tensor:
    """A CPU batch of token ids, the same on every rank for the same ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=gen)


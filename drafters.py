"""Drafters: who proposes the tokens the target verifies.

A drafter looks at the context (prompt + generated tokens, the last one not yet run
through the target) and proposes a Tree of candidate continuations. The target verifies the
whole tree in one pass (switchsd.verify). Drafters differ only in how they propose:

  copy drafters   PLD (Saxena 2023), CopySpec (Dumitru et al. 2025) and SwitchSD's kappa-gram
                  retriever, which drafts W candidates of up to D tokens by copying the
                  context after earlier occurrences of the current kappa-gram.
"""
from dataclasses import dataclass, field

import torch


@dataclass
class Tree:
    """Candidate continuations, as a tree rooted at the context's last token.

    Node 0 is that token (its logits give the first new token); node i > 0 is a drafted
    token with parent parents[i] < i. q[i] is the distribution node i was sampled from,
    or None when it was copied (a deterministic draft, q = one-hot).
    """
    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    q: list = field(default_factory=lambda: [None])

    @classmethod
    def chain(cls, root: int, tokens, q=None) -> "Tree":
        n = len(tokens)
        return cls([root, *tokens], list(range(-1, n)), [None, *(q or [None] * n)])

    @classmethod
    def trie(cls, root: int, candidates) -> "Tree":
        """Merge candidates that share a prefix, keeping their order among siblings."""
        tree, child = cls([root]), {}  # child[(parent, token)] -> node
        for cand in candidates:
            node = 0
            for tok in cand:
                if (node, tok) not in child:
                    child[node, tok] = len(tree.tokens)
                    tree.tokens.append(tok)
                    tree.parents.append(node)
                    tree.q.append(None)
                node = child[node, tok]
        return tree

    def __len__(self):
        return len(self.tokens)


def probs(logits, temperature: float, top_p: float = 1.0):
    """Sampling distribution softmax(logits / T), restricted to the top-p nucleus."""
    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, idx = p.sort(descending=True)
        sp[(sp.cumsum(-1) - sp) >= top_p] = 0  # keep the smallest prefix reaching top_p
        p = torch.zeros_like(p).scatter_(-1, idx, sp)
        p = p / p.sum(-1, keepdim=True)
    return p


# ---------------------------------------------------------------------------------------
# Copy drafters: candidates are spans of the context itself
# ---------------------------------------------------------------------------------------

class CopyDrafter:
    """SwitchSD's retriever: W candidates of up to D tokens that followed earlier
    occurrences of the kappa-gram ending at the current token, most recent first.

    The index maps each kappa-gram to the end positions of its occurrences. It is brought
    up to date lazily from the context, one dict append per new token: no rescans.
    """

    def __init__(self, kappa: int = 5, width: int = 4, depth: int = 20):
        self.kappa, self.width, self.depth = kappa, width, depth
        self.ends: dict[tuple, list[int]] = {}
        self.n = 0  # context tokens indexed so far

    def _sync(self, ctx):
        k = self.kappa
        for i in range(max(self.n, k - 1), len(ctx)):
            self.ends.setdefault(tuple(ctx[i - k + 1:i + 1]), []).append(i)
        self.n = len(ctx)

    def _occurrences(self, ctx) -> list[int]:
        """End positions of the current kappa-gram, oldest first; the last is the current one."""
        self._sync(ctx)
        return self.ends.get(tuple(ctx[-self.kappa:]), []) if len(ctx) >= self.kappa else []

    def matches(self, ctx) -> bool:
        """Did the kappa-gram ending at the current token occur earlier in the context?"""
        return len(self._occurrences(ctx)) > 1

    def propose(self, ctx, depth: int):
        """A trie of up to W distinct continuations of length <= min(D, depth), or None."""
        cands = []
        for e in reversed(self._occurrences(ctx)[-8 * self.width - 1:-1]):  # recent first, bounded
            cand = ctx[e + 1:e + 1 + min(self.depth, depth)]
            if cand and cand not in cands:
                cands.append(cand)
                if len(cands) == self.width:
                    break
        return Tree.trie(ctx[-1], cands) if cands else None


class PromptLookup:
    """PLD (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding), as published:
    try n-gram sizes 3, 2, 1; take the earliest match whose 10 following tokens all exist."""

    def __init__(self, max_ngram: int = 3, num_pred: int = 10):
        self.max_ngram, self.num_pred = max_ngram, num_pred

    def propose(self, ctx, depth: int):
        import numpy as np
        a = np.asarray(ctx)
        for n in range(min(self.max_ngram, len(a) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(a, n)
            for i in np.flatnonzero((windows == a[-n:]).all(axis=1)):
                start, end = i + n, i + n + self.num_pred
                if end <= len(a) and start < len(a) - n:
                    return Tree.chain(ctx[-1], ctx[start:end][:depth])
        return None


class CopySpec:
    """CopySpec (Dumitru et al. 2025): hash the last gamma = 3 tokens, look up the first
    occurrence of that gamma-gram, copy the 10 tokens that followed it."""

    def __init__(self, gamma: int = 3, num_copy: int = 10):
        self.gamma, self.num_copy = gamma, num_copy
        self.first: dict[tuple, int] = {}  # gamma-gram -> end position of its first occurrence
        self.n = 0

    def propose(self, ctx, depth: int):
        g = self.gamma
        for i in range(max(self.n, g - 1), len(ctx)):
            self.first.setdefault(tuple(ctx[i - g + 1:i + 1]), i)
        self.n = len(ctx)
        e = self.first.get(tuple(ctx[-g:]), len(ctx) - 1)
        cand = ctx[e + 1:e + 1 + min(self.num_copy, depth)]
        return Tree.chain(ctx[-1], cand) if cand else None

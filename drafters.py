"""Drafters: who proposes the tokens the target verifies.

A drafter looks at the context (prompt + generated tokens, the last one not yet run
through the target) and proposes a Tree of candidate continuations. The target verifies the
whole tree in one pass (switchsd.verify). Drafters differ only in how they propose:

  copy drafters    SwitchSD's kappa-gram retriever (W candidates of up to D tokens copied from
                   after earlier occurrences of the current kappa-gram), PLD (Saxena 2023) and
                   CopySpec (Dumitru et al. 2025)
  neural drafters  SPS: a small draft model (Chen et al. 2023; Leviathan et al. 2023), and an
                   EAGLE-3 head on the target's own features (Li et al. 2025)

The two interfaces are written down as Protocols (Copier, Neural) and each drafter's options
as one config dataclass (CopyConfig, SPSConfig, Eagle3Config): the CLI, the benchmarks and the
tests read their defaults from there. EAGLE-3 training comes last.

    python drafters.py train-eagle3 --model M --completions FILE --work DIR --out HEAD_DIR
"""
import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file

import data
import llama
from fetch import resolve


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
    def trie(cls, root: int, candidates, size: int = 1 << 30) -> "Tree":
        """Merge candidates that share a prefix, keeping their order among siblings; a
        candidate that would take the tree past `size` nodes is cut where it would."""
        tree, child = cls([root]), {}  # child[(parent, token)] -> node
        for cand in candidates:
            node = 0
            for tok in cand:
                if (node, tok) not in child:
                    if len(tree.tokens) >= size:
                        break
                    child[node, tok] = len(tree.tokens)
                    tree.tokens.append(tok)
                    tree.parents.append(node)
                    tree.q.append(None)
                node = child[node, tok]
        return tree

    def grow(self, node: int, token: int, q=None, leaves=()) -> int:
        """Extend the first branch, whose last node is `node`, by a drafted token, and hang
        beside it, as leaves, runners-up the drafter ranked next (greedy only: q is None for
        them). Returns the token's node. The branch stays at the front, leaves after it, so
        that every row's ancestors sit where a chain's would (llama.exact_layout)."""
        i = node + 1  # nodes from i on are leaves: shifting them moves no one's parent
        self.tokens.insert(i, token)
        self.parents.insert(i, node)
        self.q.insert(i, q)
        for t in leaves:
            self.tokens.append(t)
            self.parents.append(node)
            self.q.append(None)
        return i

    def __len__(self):
        return len(self.tokens)

    def paths(self) -> list[list[int]]:
        """Root-to-leaf token lists, without the root."""
        inner, out = set(self.parents), []
        for leaf in (i for i in range(1, len(self)) if i not in inner):
            path, node = [], leaf
            while node > 0:
                path.append(self.tokens[node])
                node = self.parents[node]
            out.append(path[::-1])
        return out


class Copier(Protocol):
    """Drafts by copying from the context: a Tree, or None when the context offers nothing."""

    def reset(self, max_len: int) -> None: ...  # a new prompt starts

    def propose(self, ctx: list[int], depth: int) -> Tree | None: ...


class Neural(Protocol):
    """Drafts with a network. Its state may lag the context after steps it did not draft; it
    catches up inside its next propose (lazy propagation)."""
    capture: tuple  # the target's hidden states it reads, as llama.Model.forward's (kind, layer)
    weights: int  # llama.n_weights of its network: what its prefill of a prompt costs beside the target's

    def reset(self, max_len: int) -> None: ...

    def observe(self, hidden: dict) -> None: ...  # the captured states of the accepted rows

    def propose(self, ctx: list[int], depth: int, temperature: float, top_p: float, gen) -> Tree: ...


def probs(logits, temperature: float, top_p: float = 1.0):
    """Sampling distribution softmax(logits / T), restricted to the top-p nucleus."""
    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, idx = p.sort(descending=True)
        sp[(sp.cumsum(-1) - sp) >= top_p] = 0  # keep the smallest prefix reaching top_p
        p = torch.zeros_like(p).scatter_(-1, idx, sp)
        p = p / p.sum(-1, keepdim=True)
    return p


def pick(logits, temperature, top_p, gen, topk: int, threshold: float, ids=None, vocab_size=0):
    """A neural drafter's choice at one depth, from its logits over its own rows.

    Greedy: the top-k rows (the first is the chain's token, the rest runner-up leaves), q None.
    Sampling: one row drawn from q = probs(logits). `sure` is the drafter's probability of its
    token, for the early stop (greedy computes it only when a threshold asks for it). ids maps
    rows to target ids (a cut vocabulary; None: row i is id i). q is returned over the target's
    vocab_size ids, zero on those the drafter has no row for: the acceptance rule subtracts it
    from the target's p, so the two must have the same length.
    Returns (target ids of the picked rows, q or None, sure).
    """
    if temperature == 0:
        top, q = logits.topk(min(topk, len(logits))).indices, None
        sure = torch.softmax(logits.float(), -1)[top[0]].item() if threshold else 1.0
    else:
        q = probs(logits, temperature, top_p)
        top = torch.multinomial(q, 1, generator=gen)
        sure = q[top[0]].item()
    if ids is not None:
        top = ids[top]
    if q is not None and (ids is not None or len(q) < vocab_size):
        rows = ids if ids is not None else torch.arange(len(q), device=q.device)
        q = torch.zeros(vocab_size, device=q.device).index_copy_(0, rows, q)
    return top.tolist(), q, sure


# ---------------------------------------------------------------------------------------
# Copy drafters: candidates are spans of the context itself
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CopyConfig:
    """SwitchSD's copy path (section 3 of the paper)."""
    kappa: int = data.KAPPA  # the kappa-gram ending at the current token must have occurred before
    width: int = 4  # W: candidates verified together in one pass
    depth: int = 20  # D: tokens per candidate, at most
    rows: int = llama.EXACT_TILE  # the pass's tokens (root included), at most: later candidates are cut
    # to fit. Up to 32 rows a pass costs about one step with either kernel set; past that the
    # exact kernels read the weights once more per 32 rows (docs/performance.md), and a wider
    # tree's later candidates are rarely the accepted one (docs/results.md, the copy path's width).


class CopyDrafter:
    """SwitchSD's retriever: W candidates of up to D tokens that followed earlier
    occurrences of the kappa-gram ending at the current token, most recent first.

    The index maps each kappa-gram to the end positions of its occurrences. It is brought
    up to date lazily from the context, one dict append per new token: no rescans.
    """

    def __init__(self, cfg: CopyConfig = CopyConfig()):
        self.kappa, self.width, self.depth, self.rows = cfg.kappa, cfg.width, cfg.depth, cfg.rows
        self.reset()

    def reset(self, max_len: int = 0):
        """Forget the context: a new prompt starts."""
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

    def match_length(self, ctx, longest: int) -> int:
        """The longest suffix of ctx, up to `longest` tokens, that occurred earlier: at least
        kappa where the kappa-gram recurs (else 0); data.surface_scores at the current token."""
        best = 0
        for e in self._occurrences(ctx)[-65:-1]:  # the most recent 64 earlier occurrences
            n = self.kappa
            while n < longest and e - n >= 0 and ctx[e - n] == ctx[-1 - n]:
                n += 1
            best = max(best, n)
        return best

    def propose(self, ctx, depth: int):
        """A trie of up to W distinct continuations of length <= min(D, depth), cut to `rows`
        tokens, or None."""
        cands = []
        for e in reversed(self._occurrences(ctx)[-8 * self.width - 1:-1]):  # recent first, bounded
            cand = ctx[e + 1:e + 1 + min(self.depth, depth)]
            if cand and cand not in cands:
                cands.append(cand)
                if len(cands) == self.width:
                    break
        return Tree.trie(ctx[-1], cands, self.rows) if cands else None


class PromptLookup:
    """PLD (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding), as published:
    try n-gram sizes 3, 2, 1; take the earliest match whose 10 following tokens all exist.
    `matched`: the n-gram size of the last proposal's match (0: none)."""

    def __init__(self, max_ngram: int = 3, num_pred: int = 10):
        self.max_ngram, self.num_pred, self.matched = max_ngram, num_pred, 0

    def reset(self, max_len: int = 0):
        pass  # stateless: it rescans the context every step, as published

    def propose(self, ctx, depth: int):
        a = np.asarray(ctx)
        for n in range(min(self.max_ngram, len(a) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(a, n)
            for i in np.flatnonzero((windows == a[-n:]).all(axis=1)):
                start, end = i + n, i + n + self.num_pred
                if end <= len(a) and start < len(a) - n:
                    self.matched = n
                    return Tree.chain(ctx[-1], ctx[start:end][:depth])
        self.matched = 0
        return None


class CopySpec:
    """CopySpec (Dumitru et al. 2025): hash the last gamma = 3 tokens, look up the first
    occurrence of that gamma-gram, copy the 10 tokens that followed it.

    Where it finds no match, the step goes to the neural drafter the run was given: this
    project's SPS (DraftModel) or EAGLE-3 (Eagle3), as the benchmarks' CopySpec[SPS] and
    CopySpec[EAGLE3] rows say, not the speculative decoder of the CopySpec paper's own runs;
    without one, a plain autoregressive step."""

    def __init__(self, gamma: int = 3, num_copy: int = 10):
        self.gamma, self.num_copy = gamma, num_copy
        self.reset()

    def reset(self, max_len: int = 0):
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


# ---------------------------------------------------------------------------------------
# Neural drafters. Both keep a KV cache of their own that lags the context after any step
# whose accepted tokens they did not draft (a copy step; the target's bonus token). They
# catch up lazily: the missing tokens are prepended to their next draft forward, which runs
# anyway, instead of an extra pass at acceptance time that would cost a full forward of
# weight reads for a handful of tokens.
# ---------------------------------------------------------------------------------------

def common_prefix(a, b, start: int = 0) -> int:
    """The length of the longest common prefix of a and b, known to be at least `start`."""
    n = start
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class SPSConfig:
    """An SPS draft model's options; defaults chosen with `bench.py neural` on prompts Table 1
    does not use (docs/results.md)."""
    gamma: int = 6  # lookahead: draft tokens per step, at most
    threshold: float = 0.7  # early stop: a drafted token with q below this ends the draft (0: never)
    topk: int = 2  # greedy: the draft's top-k per depth, runners-up verified as leaves (1: a chain)
    vocab: int = 65536  # draft among the ids below this and the context's tokens (0: all)
    quant: str = "auto"  # the draft's weights: "int8" (llama.Int8Linear), "none" (as the target's), "auto" (llama.default_quant)


@dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 head's drafting options (docs/results.md)."""
    gamma: int = 4  # lookahead: head steps per draft, at most
    threshold: float = 0.7  # early stop, as SPSConfig's
    topk: int = 2  # greedy: runners-up per depth verified as leaves (1: a chain)


QUANTS = ("auto", "int8", "none")


class DraftModel:
    """SPS (Chen et al. 2023; Leviathan et al. 2023): a small model with the target's
    tokenizer drafts up to gamma tokens autoregressively, each sampled from its own q.

    threshold: stop drafting after a token the draft itself doubts (its probability under q
    below threshold; greedy: the top softmax probability). A doubted token is usually rejected,
    and every draft forward after it is wasted time: on the development CPU a forward of the
    0.5B draft costs about half a 1.5B target step. Lossless all the same: where to stop
    depends only on the draft's own samples, and each drafted token still meets the
    acceptance rule.

    vocab: draft only among the `vocab` lowest token ids and the tokens already in the context
    (0 = the whole vocabulary). A small draft spends a large share of each forward on its output
    layer (151,936 x 896 of the 0.5B Qwen's 494M weights), while it rarely proposes a token
    outside a common core: FR-Spec (Zhao et al. 2025) restricts the draft's head to frequent
    tokens. A byte-level BPE numbers its tokens in merge order, the frequency order of the
    tokenizer's own corpus, so the lowest ids stand in for a frequency count; the context adds
    the names and rare words that get repeated. Still lossless: q is the draft's distribution
    over that subset (zero elsewhere), and acceptance uses that same q.

    topk > 1 (greedy only) hangs the draft's runners-up at each depth beside the chain as
    leaves, as Eagle3 does: where the 0.5B Qwen draft's first choice misses the 1.5B target's
    token, its second choice is the target's half the time (ad hoc, 4,880 tokens of the
    target's Spec-Bench answers), and a few more rows cost the verification pass almost
    nothing on a bandwidth-bound machine. No extra draft forward.

    target_vocab: the target's vocabulary size (None: the draft's own), which may exceed the
    draft's: Qwen2.5-Coder-7B has 152,064 rows, its 0.5B draft 151,936 (switchsd.load_draft
    allows draft <= target). q is over the target's ids, zero on the rows the draft lacks. An
    id the draft has no row for can only reach it through the context (the prompt, or a token
    the target emitted itself); its embedding lookup would index out of range, so the draft
    reads such an id as its own last row. In the Qwen pair both are untrained padding rows;
    in any pair the stand-in only makes the draft's guesses worse, never the output: every
    drafted token still meets the acceptance rule."""
    capture = ()  # needs no hidden state of the target

    def __init__(self, model, cfg: SPSConfig = SPSConfig(), target_vocab: int | None = None):
        self.model, self.gamma, self.threshold, self.vocab, self.topk = model, cfg.gamma, cfg.threshold, cfg.vocab, cfg.topk
        self.target_vocab = target_vocab or model.args.vocab_size
        if self.target_vocab < model.args.vocab_size:
            raise ValueError(f"draft vocabulary of {model.args.vocab_size} exceeds the target's {self.target_vocab}")
        self.last = ("mlp", model.args.n_layers - 1)  # the final residual, before the norm
        self.weights = llama.n_weights(model)

    def reset(self, max_len: int):
        self.cache = self.model.new_cache(max_len + self.gamma)
        self.tokens = []  # the token in each cache slot
        self.synced = 0  # a prefix of ctx known to be in the cache
        self.keep = torch.zeros(self.model.args.vocab_size, dtype=torch.bool)  # the subset
        self.keep[:self.vocab] = True
        self.seen, self.ids, self.head = 0, None, None  # ctx[:seen] is in the subset

    def _restrict(self, ctx):
        """Cut the output layer to the subset; redone only when the context brings a new token
        (a few per answer), so the subset is a function of the context alone."""
        new = torch.tensor(ctx[self.seen:], dtype=torch.long)
        new = new[new < len(self.keep)]  # an id the draft has no row for cannot be drafted
        self.seen = len(ctx)
        if self.head is not None and self.keep[new].all():
            return
        self.keep[new] = True
        self.ids = self.keep.nonzero()[:, 0].to(self.model.device)  # (V',) sorted target ids
        self.head = self.model.lm_head.rows(self.ids)

    def _logits(self, feed):
        """The draft's logits for the token after feed, over the subset if there is one."""
        dev = self.model.device
        mask, pos = llama.causal_mask(len(feed), self.cache.n, dev)
        ids = torch.tensor(feed, device=dev).clamp_max(self.model.args.vocab_size - 1)  # see the class
        if self.head is None:
            return self.model(ids, pos, mask, self.cache, logits_at=slice(-1, None))[0][0].float()
        _, hidden = self.model(ids, pos, mask, self.cache, (self.last,), logits_at=slice(0, 0))
        return self.head(self.model.model.norm(hidden[self.last][-1:]))[0].float()  # (V',)

    def observe(self, hidden):
        pass

    def propose(self, ctx, depth, temperature, top_p, gen) -> Tree:
        # Rollback: keep the cached prefix that the context still agrees with (accepted
        # drafts stay, rejected ones go; truncating costs nothing). Lazy propagation: the
        # rest of the context -- copied tokens, the bonus token -- rides along in the first
        # draft forward below.
        m = min(common_prefix(self.tokens, ctx, min(self.synced, len(self.tokens))), len(ctx) - 1)
        self.cache.truncate(m)
        del self.tokens[m:]
        self.synced = m
        if 0 < self.vocab < self.model.args.vocab_size:
            self._restrict(ctx)
        feed, tree, node = ctx[m:], Tree([ctx[-1]]), 0
        for _ in range(min(self.gamma, depth)):
            logits = self._logits(feed)
            self.tokens += feed
            self.synced = len(ctx)  # all of ctx is in the cache now
            (x, *leaves), q, sure = pick(logits, temperature, top_p, gen, self.topk, self.threshold,
                                         self.ids if self.head is not None else None, self.target_vocab)
            node = tree.grow(node, x, q, leaves)
            if sure < self.threshold:
                break
            feed = [x]
        return tree


# ---------------------------------------------------------------------------------------
# EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
# Models via Training-Time Test"): one decoder layer that drafts from the target's own
# features. Input at position j: [embedding of token j+1 ; g_j], where g_j = fc([low; mid;
# high]) fuses the target's hidden states entering layers 2, L//2 and L-3 at position j.
# Later draft steps feed the layer's own output h in place of g. It predicts token j+2.
# ---------------------------------------------------------------------------------------

class Eagle3Head(nn.Module):
    """The official EAGLE-3 checkpoint layout (key names as in SafeAILab/EAGLE):
    fc [H, 3 H_target]; midlayer.{input_layernorm, hidden_norm, post_attention_layernorm};
    midlayer.self_attn.{q,k,v}_proj (input width 2H), o_proj; midlayer.mlp.{gate,up,down}_proj;
    norm; lm_head [draft_vocab, H]; d2t [draft_vocab] with target_id = draft_id + d2t[draft_id]."""

    def __init__(self, cfg: dict, target_dim: int):
        super().__init__()
        H = cfg["hidden_size"]
        # A Llama layer's settings (rope, heads, norms), with the draft vocabulary as output.
        self.args = llama.ModelArgs.from_config(
            {**cfg, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "attention_bias": False,
             "vocab_size": cfg.get("draft_vocab_size") or cfg["vocab_size"]}, "EAGLE-3 config.json")
        a = self.args
        self.fc = llama.Linear(3 * target_dim, H, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.input_layernorm = llama.RMSNorm(H, a.norm_eps)  # on the token embedding
        self.midlayer.hidden_norm = llama.RMSNorm(H, a.norm_eps)  # on the feature
        # The attention reads [embedding; feature] (2H wide) and writes H.
        self.midlayer.self_attn = llama.Attention(replace(a, dim=2 * H))
        self.midlayer.self_attn.o_proj = llama.Linear(a.n_heads * a.head_dim, H, bias=False)
        self.midlayer.post_attention_layernorm = llama.RMSNorm(H, a.norm_eps)
        self.midlayer.mlp = llama.MLP(a)
        self.norm = llama.RMSNorm(H, a.norm_eps)
        self.lm_head = llama.Linear(H, a.vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(a.vocab_size, dtype=torch.long))
        self.register_buffer("inv_freq", llama.rope_frequencies(a), persistent=False)

    def draft_ids(self) -> torch.Tensor:
        """The target id of every draft id: draft_id + d2t[draft_id]."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def forward(self, emb, g, pos, mask, cache):
        """emb, g: (T, H) token embeddings and features -> (T, H) the layer's output h."""
        m = self.midlayer
        cos, sin = llama.rope(self.inv_freq, pos, g.dtype)
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], dim=-1)  # (T, 2H)
        h = g + m.self_attn(x, cos, sin, mask, cache, 0)
        h = h + m.mlp(m.post_attention_layernorm(h))
        cache.n += len(g)
        return h

    def logits(self, h):
        """Draft-vocabulary logits of h (T, H)."""
        return self.lm_head(self.norm(h)).float()

    @classmethod
    def load(cls, folder, target) -> "Eagle3Head":
        """Read an official EAGLE-3 checkpoint (model.safetensors or pytorch_model.bin)."""
        folder = Path(folder)
        cfg = llama.read_json(folder / "config.json")
        for key in ("hidden_size", "num_attention_heads", "intermediate_size"):
            if key not in cfg:
                raise ValueError(f"{folder / 'config.json'}: missing field {key!r}")
        if cfg.get("target_fingerprint", target.fingerprint()) != target.fingerprint():
            raise ValueError(f"{folder}: this head was trained for another target (weights fingerprint "
                             f"{cfg['target_fingerprint']}, this target's is {target.fingerprint()})")
        if (folder / "model.safetensors").is_file():
            w = llama.load_safetensors(folder)
        elif (folder / "pytorch_model.bin").is_file():
            w = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin")
        w = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v
             for k, v in w.items()}  # a known variant names the layer layers.0
        if "fc.weight" not in w:
            raise ValueError(f"{folder}: no fc.weight: not an EAGLE-3 checkpoint")
        if w["fc.weight"].shape[1] != 3 * target.args.dim:
            raise ValueError(f"{folder}: fc.weight takes {w['fc.weight'].shape[1]} features, but this "
                             f"target gives 3 x {target.args.dim}: the head was trained for another model")
        if cfg["hidden_size"] != target.args.dim:
            raise ValueError(f"{folder}: hidden_size {cfg['hidden_size']} differs from the target's "
                             f"{target.args.dim} (the head reads the target's token embeddings)")
        with torch.device("meta"):
            head = cls(cfg, target.args.dim)
        if "d2t" not in w:  # allowed when the draft vocabulary is the target's own
            if head.args.vocab_size != target.args.vocab_size:
                raise ValueError(f"{folder}: no d2t, and draft_vocab_size {head.args.vocab_size} "
                                 f"differs from the target's vocabulary {target.args.vocab_size}")
            w["d2t"] = torch.zeros(head.args.vocab_size, dtype=torch.long)
        for name, p in [*head.named_parameters(), ("d2t", head.d2t)]:
            t = llama.checked_weight(w, name, p.shape, folder)
            t = t.to(target.device, torch.long if name == "d2t" else target.dtype, copy=True)
            module, leaf = llama.parent_of(head, name)
            if name == "d2t":
                head.d2t = t
            else:
                setattr(module, leaf, nn.Parameter(t, requires_grad=False))
        ids = head.draft_ids()
        if ids.min() < 0 or ids.max() >= target.args.vocab_size:
            raise ValueError(f"{folder}: d2t maps draft ids outside the target's vocabulary")
        # One-to-one, or q (spread over target ids by pick) would not be the distribution the
        # head drew its token from: of two draft rows on one target id, q keeps one's probability.
        seen = {}
        for d, t in enumerate(ids.tolist()):
            if t in seen:
                raise ValueError(f"{folder}: d2t maps draft ids {seen[t]} and {d} to the same target id {t}")
            seen[t] = d
        head.inv_freq = llama.rope_frequencies(head.args).to(target.device)
        return head.eval()

    def save(self, folder, cfg: dict):
        """Write the official layout: config.json + model.safetensors (bf16, no embeddings)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).detach().contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))


class Eagle3:
    """Chain drafting with an EAGLE-3 head: gamma tokens, each step feeding back the head's
    own output. Its KV cache holds rows built from the target's real features only; rows
    of drafted positions are dropped at the next call (rollback) and the new real features
    from the verification pass are fed in the next draft forward (lazy propagation).

    topk > 1 (greedy only) hangs the head's runners-up at each depth beside the chain as
    leaves: a weak head's second guess is often right where its first is not, and on a
    bandwidth-bound machine a few more rows in the verification pass cost almost nothing
    (a static form of EAGLE-2's tree; no extra head forward).

    threshold: stop after a chain token the head gives q < threshold, as DraftModel does: a
    head forward costs several percent of a target step here, and most are spent past the
    point where the draft goes wrong."""

    def __init__(self, head: Eagle3Head, target, cfg: Eagle3Config = Eagle3Config()):
        self.head, self.target, self.gamma, self.topk, self.threshold = head, target, cfg.gamma, cfg.topk, cfg.threshold
        self.ids = head.draft_ids()  # the target id of each draft-vocabulary row
        self.weights = llama.n_weights(head)
        L = target.args.n_layers
        if L < 3:
            raise ValueError(f"EAGLE-3 reads layers 2, L//2 and L-3: the target has only {L} layers")
        self.capture = (("in", 2), ("in", L // 2), ("in", L - 3))

    def reset(self, max_len: int):
        self.cache = llama.KVCache(self.head.args, max_len + self.gamma, self.target.dtype,
                                   self.target.device)
        self.pending = []  # features of target positions the head has not consumed yet
        self.n_real = 0  # head cache rows built from the target's features

    def observe(self, hidden):
        if hidden:
            self.pending.append(torch.cat([hidden[c] for c in self.capture], dim=-1))

    def propose(self, ctx, depth, temperature, top_p, gen) -> Tree:
        dev, embed = self.target.device, self.target.model.embed_tokens
        feats = torch.cat(self.pending) if self.pending else None
        self.pending = []
        k = self.n_real
        self.cache.truncate(k)
        tree = Tree([ctx[-1]])
        if feats is None or len(feats) != len(ctx) - 1 - k:  # only without any target pass yet
            return tree
        # Catch up: pairs (g_j, token j+1) for every position j the target has run since.
        pos = torch.arange(k, len(ctx) - 1, device=dev)
        mask, _ = llama.causal_mask(len(pos), k, dev)
        g = self.head.fc(feats)
        h = self.head(embed(torch.tensor(ctx[k + 1:], device=dev)), g, pos, mask, self.cache)[-1:]
        self.n_real = len(ctx) - 1
        node, n = 0, min(self.gamma, depth)
        for i in range(n):
            logits = self.head.logits(h)[0]  # (draft_vocab,)
            (x, *leaves), q, sure = pick(logits, temperature, top_p, gen, self.topk, self.threshold,
                                         self.ids, self.target.args.vocab_size)
            node = tree.grow(node, x, q, leaves)
            if sure < self.threshold:
                break
            if i + 1 < n:
                p = torch.tensor([len(ctx) - 1 + i], device=dev)
                mask, _ = llama.causal_mask(1, self.cache.n, dev)
                h = self.head(embed(torch.tensor([x], device=dev)), h, p, mask, self.cache)
        return tree


# ---------------------------------------------------------------------------------------
# Training an EAGLE-3 head on the target's own completions (self-distillation)
# ---------------------------------------------------------------------------------------

class ConcatCache:
    """A KV cache that grows by concatenation: autograd-safe, for training only."""

    def __init__(self):
        self.k = self.v = None
        self.n = 0

    def write(self, layer, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)
        return self.k, self.v


def unroll(head, embed, feats, tokens, steps: int):
    """EAGLE-3's training-time test: run the head `steps` times over one sequence, each
    step on its own previous outputs, as drafting does. Row j of step s reads token j+1+s
    and, from step 1 on, the head's step s-1 output at row j; it sits at position j+s, sees
    the real rows <= j of step 0 and its own rows of steps 1..s, and predicts token j+2+s.
    feats: (R, 3H) target features of rows j < R; tokens: the sequence (len >= R + 1).
    Returns one (R, draft_vocab) logits tensor per step."""
    R = len(feats)
    cache, h, out = ConcatCache(), head.fc(feats), []
    causal = torch.ones(R, R, dtype=torch.bool).tril()
    eye = torch.eye(R, dtype=torch.bool)
    for s in range(steps):
        tok = torch.tensor(tokens[1 + s:1 + s + R] + [0] * max(0, R + 1 + s - len(tokens)))
        mask = torch.cat([causal] + [eye] * s, dim=1)
        h = head(embed(tok).to(h.dtype), h, torch.arange(R) + s, mask, cache)
        out.append(head.logits(h))
    return out


def eagle3_loss(head, embed, ex, steps: int):
    """sum_s 0.8^s * cross-entropy(target's top-k distribution, head's prediction) over
    the rows whose predicted token lies in the completion (EAGLE-3's weights per step)."""
    T = len(ex["tokens"])
    logits = unroll(head, embed, ex["feats"][:T - 2], ex["tokens"], steps)
    total = 0.0
    for s, lg in enumerate(logits):
        j = torch.arange(len(lg))
        valid = (j + 2 + s >= ex["prompt_len"]) & (j + 2 + s < T)
        at = (j + 1 + s).clamp(max=T - 1)  # the target's logits at j+1+s predict token j+2+s
        p = torch.softmax(ex["top_logits"][at].float(), -1)
        logq = torch.log_softmax(lg, -1).gather(1, ex["top_ids"][at].long())
        total = total + 0.8 ** s * (-(p * logq).sum(-1) * valid).sum() / valid.sum().clamp_min(1)
    return total


@torch.no_grad()
def acceptance_length(head, embed, examples, gamma: int, d2t) -> float:
    """Expected tokens per target forward of greedy chain drafting with gamma tokens,
    teacher-forced on the target's own greedy completions: 1 + the mean number of leading
    draft tokens equal to what the target emitted."""
    total, n = 0.0, 0
    for ex in examples:
        T, P = len(ex["tokens"]), ex["prompt_len"]
        logits = unroll(head, embed, ex["feats"][:T - 2], ex["tokens"], gamma)
        tok = torch.tensor(ex["tokens"])
        alive = torch.ones(T - 2, dtype=torch.bool)
        run = torch.zeros(T - 2)
        for s, lg in enumerate(logits):
            d = lg.argmax(-1)
            j = torch.arange(T - 2)
            ok = (j + 2 + s < T) & ((d + d2t[d]) == tok[(j + 2 + s).clamp(max=T - 1)])
            alive &= ok
            run += alive
        rows = torch.arange(T - 2) + 2 >= P  # rows that draft the completion's tokens
        total += float((1 + run[rows]).sum())
        n += int(rows.sum())
    return total / max(n, 1)


def train_eagle3(target, folder, out, steps=2000, ttt=3, lr=3e-4, intermediate=None, gamma=4,
                 eval_every=200, seed=0, init=None, log=print):
    """Train a head on data.eagle_features(folder); save it to `out` in the official layout.
    init: a loaded Eagle3Head to continue from (same draft vocabulary), else a fresh head."""
    info, example = data.eagle_examples(folder)
    train = [i for i, s in enumerate(info["splits"]) if s == "train"]
    val = [example(i) for i, s in enumerate(info["splits"]) if s == "val"][:40]
    a = target.args
    draft_ids = torch.tensor(info["draft_ids"])
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": a.dim,
           "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
           "intermediate_size": intermediate or a.ffn_dim, "num_hidden_layers": 1, "rms_norm_eps": a.norm_eps,
           "rope_theta": a.rope_theta, "rope_scaling": a.rope_scaling, "max_position_embeddings": a.max_seq_len,
           "vocab_size": a.vocab_size, "draft_vocab_size": len(draft_ids), "hidden_act": "silu",
           "tie_word_embeddings": False, "target_fingerprint": target.fingerprint()}
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, a.dim).float()
    with torch.no_grad():
        if init is not None:  # continue a run: its weights, with a fresh learning-rate schedule
            if not torch.equal(init.draft_ids().cpu(), draft_ids):
                raise ValueError(f"the head to continue has another draft vocabulary than {folder}")
            if init.args.ffn_dim != cfg["intermediate_size"]:
                raise ValueError(f"the head to continue has MLP width {init.args.ffn_dim}; "
                                 f"pass --intermediate {init.args.ffn_dim}")
            head.load_state_dict({k: v.float() if v.is_floating_point() else v
                                  for k, v in init.state_dict().items()})
        else:  # start from the target's own output layer over the draft vocabulary
            for name, p in head.named_parameters():
                if p.ndim == 2:
                    nn.init.normal_(p, std=0.02)
            head.lm_head.weight.copy_(target.lm_head.weight[draft_ids].float())
            head.norm.weight.copy_(target.model.norm.weight.float())
            head.fc.weight.zero_()
            head.fc.weight[:, 2 * a.dim:] = torch.eye(a.dim)  # start as the deepest feature
        head.d2t = draft_ids - torch.arange(len(draft_ids))
    weight = target.model.embed_tokens.weight

    def embed(ids):
        return weight[ids].float()

    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(1.0, (t + 1) / 50) * max(0.05, 1 - t / max(1, steps)))
    rng, curve, t0 = np.random.default_rng(seed), [], time.time()
    head.train()
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            head.eval()
            acc = acceptance_length(head, embed, val, gamma, head.d2t)
            curve.append({"step": step, "seconds": round(time.time() - t0, 1), "acceptance_length": acc})
            log(f"step {step}: val acceptance length {acc:.3f} (gamma {gamma}), {time.time() - t0:.0f}s")
            head.save(out, cfg)  # a checkpoint at every evaluation: the run can stop any time
            (Path(out) / "training_curve.json").write_text(json.dumps(curve, indent=1))
            head.train()
        if step == steps:
            break
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = eagle3_loss(head, embed, example(int(rng.choice(train))), ttt)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
        sched.step()
    return curve


def main(argv=None):
    ap = argparse.ArgumentParser(description="Train an EAGLE-3 head for a target model.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train-eagle3", help="self-distillation on the target's own completions")
    p.add_argument("--model", required=True, help="target: HF folder or demo name")
    p.add_argument("--completions", help="probe.py completions (JSON lines); with --text, optional")
    p.add_argument("--work", required=True, help="folder for the extracted features")
    p.add_argument("--out", required=True, help="head folder to write (official layout)")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=2000, help="training sequences")
    p.add_argument("--ttt", type=int, default=3, help="training-time-test unroll steps")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--intermediate", type=int, help="MLP width (default: the target's)")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--init", help="a head folder to continue training (its draft vocabulary is kept)")
    p.add_argument("--text", type=int, default=0,
                   help="add N windows of reference text (stdlib code, Python docs); every 10th is validation")
    a = ap.parse_args(argv)
    if not (a.completions or a.text):  # before loading the target: fail in a second, not a minute
        ap.error("train-eagle3 needs --completions, --text N or both")
    target = llama.Model.from_pretrained(resolve(a.model))
    comps = data.read_jsonl(a.completions) if a.completions else []
    if a.text:
        comps += data.reference_text(llama.Tokenizer(resolve(a.model)), a.text)
    init = Eagle3Head.load(a.init, target) if a.init else None
    if init is not None:
        ids = init.draft_ids().tolist()
    else:
        ids = data.draft_vocabulary([c for c in comps if c["split"] == "train"], a.draft_vocab)
    data.eagle_features(target, comps, a.work, ids)
    train_eagle3(target, a.work, a.out, a.steps, a.ttt, a.lr, a.intermediate, eval_every=a.eval_every,
                 init=init, log=lambda m: print(m, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()

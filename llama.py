"""A from-scratch Llama / Qwen2 / Qwen3 decoder that reads Hugging Face checkpoints.

References:
  Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models"): GQA, SwiGLU, RMSNorm,
      RoPE with the "llama3" frequency scaling.
  Qwen2 (Yang et al. 2024): the same block with a bias on the q/k/v projections.
  Qwen3 (Yang et al. 2025): no q/k/v bias, an RMSNorm over each head of q and k.
  RoFormer (Su et al. 2021): rotary position embeddings, here in the rotate-half form.

The model knows nothing of speculation. It takes token ids, their positions and a boolean
mask over (cached + new) tokens, and returns logits plus whichever hidden states the caller
asks for. Everything speculative lives in drafters.py and switchsd.py. Its layers are the
`Linear` of the last section, nn.Linear with a faster CPU path; read it last.

KV cache geometry (batch 1). Slots [0, n) hold the committed context. A forward over T
new tokens writes their keys/values into slots [n, n+T) and row i of `mask` (T, n+T) says
which of those n+T slots token i may attend to. Afterwards all T rows count as cached;
the caller keeps the rows it accepted with `cache.keep(n, rows)`, which packs them into
slots [n, n+len(rows)); rows past the new length are dead and later overwritten.

    slots:   0 ........ n-1 | n  n+1 ... n+T-1
    row i:   prefix (all 1) | mask[:, n:] (causal, a tree, or W blocks)
"""
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer as HFTokenizer

# HF "architectures" entry -> what differs between the three families.
ARCHITECTURES = {
    "LlamaForCausalLM": dict(qkv_bias=False, qk_norm=False),
    "Qwen2ForCausalLM": dict(qkv_bias=True, qk_norm=False),
    "Qwen3ForCausalLM": dict(qkv_bias=False, qk_norm=True),
}
# config.json's "model_type" -> architecture, for files whose "architectures" is missing or
# null (transformers 5 writes null after loading a GGUF), as transformers itself falls back.
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@dataclass
class ModelArgs:
    arch: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_seq_len: int
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool

    @classmethod
    def from_config(cls, cfg: dict, where: str = "config.json") -> "ModelArgs":
        arch = (cfg.get("architectures") or [None])[0] or MODEL_TYPES.get(cfg.get("model_type"))
        if arch not in ARCHITECTURES:
            got = arch or f"model_type {cfg.get('model_type')!r}, no architectures"
            raise ValueError(f"{where}: unsupported architecture {got!r} "
                             f"(supported: {', '.join(ARCHITECTURES)})")
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "vocab_size"):
            if key not in cfg:
                raise ValueError(f"{where}: missing field {key!r}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: unsupported hidden_act {cfg['hidden_act']!r} (only silu)")
        if cfg.get("use_sliding_window"):
            raise ValueError(f"{where}: use_sliding_window=true is not supported")
        # Llama 3.1 files say rope_theta + rope_scaling; transformers >= 5 writes rope_parameters.
        scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise ValueError(f"{where}: unsupported rope_scaling type {kind!r} (default, llama3)")
        family = ARCHITECTURES[arch]
        n_heads = cfg["num_attention_heads"]
        return cls(
            arch=arch,
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            ffn_dim=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", scaling.get("rope_theta", 10000.0)),
            rope_scaling=scaling if kind == "llama3" else None,
            max_seq_len=cfg.get("max_position_embeddings", 4096),
            qkv_bias=cfg.get("attention_bias", family["qkv_bias"]),
            qk_norm=family["qk_norm"],
            tie_embeddings=cfg.get("tie_word_embeddings", False),
        )


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, computed in float32 like the reference code."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_frequencies(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/D), with Llama 3's piecewise rescaling when configured."""
    D = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, D, 2).float() / D))  # float32, as HF
    s = args.rope_scaling
    if s:  # Llama 3.1: slow down low frequencies by `factor`, blend the middle band smoothly
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(medium, blended, scaled)
    return inv


def rope(inv_freq, pos, dtype):
    """cos and sin of the rotation angles pos * theta_i, shaped (T, 1, D) to broadcast over heads."""
    angles = pos[:, None].float() * inv_freq[None, :]  # (T, D/2)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        H, Hkv, D = args.n_heads, args.n_kv_heads, args.head_dim
        self.H, self.Hkv, self.D = H, Hkv, D
        self.q_proj = Linear(args.dim, H * D, bias=args.qkv_bias)
        self.k_proj = Linear(args.dim, Hkv * D, bias=args.qkv_bias)
        self.v_proj = Linear(args.dim, Hkv * D, bias=args.qkv_bias)
        self.o_proj = Linear(H * D, args.dim, bias=False)
        if args.qk_norm:
            self.q_norm = RMSNorm(D, args.norm_eps)
            self.k_norm = RMSNorm(D, args.norm_eps)

    def forward(self, x, cos, sin, mask, cache, layer):
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.H, self.D)
        k = self.k_proj(x).view(T, self.Hkv, self.D)
        v = self.v_proj(x).view(T, self.Hkv, self.D)
        if hasattr(self, "q_norm"):  # Qwen3: per-head RMSNorm before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin  # (T, H, D)
        k = k * cos + rotate_half(k) * sin  # (T, Hkv, D)
        K, V = cache.write(layer, k.transpose(0, 1), v.transpose(0, 1))  # (Hkv, n+T, D)
        if isinstance(mask, list):  # exact kernels: exact_layout's calls, from Model.forward
            Kc, Vc, n = cache.k[layer], cache.v[layer], cache.n
            kn, vn = k.transpose(0, 1), v.transpose(0, 1)  # (Hkv, T, D): the pass's own, as written
            y, moved = q.new_empty(T, self.H * self.D), None
            for rows, path, bias in mask:
                if path is not None and path is not moved:  # a path's keys to the slots a chain's take
                    Kc[:, n:n + len(path)], Vc[:, n:n + len(path)] = kn[:, path], vn[:, path]
                    moved = path
                W = bias.shape[1]  # the rows' key window; contiguous, or bmm copies it once per tile
                K, V = Kc[:, :W].contiguous(), Vc[:, :W].contiguous()
                r = slice(None) if rows is None else rows
                y[r] = exact_attention(q[r], k[r], v[r], K, V, bias)
            if moved is not None:  # the pass's own keys and values back, for KVCache.keep
                Kc[:, n:n + T], Vc[:, n:n + T] = kn, vn
            return self.o_proj(y)
        # A leading batch dimension of 1 lets torch pick its fused CPU kernel (~4x faster).
        y = F.scaled_dot_product_attention(q.transpose(0, 1)[None], K[None], V[None],
                                           attn_mask=mask, enable_gqa=self.H != self.Hkv)
        return self.o_proj(y[0].transpose(0, 1).reshape(T, self.H * self.D))  # (1, H, T, D) -> (T, dim)


def exact_layout(mask, T: int, n: int, L: int, device):
    """How exact_attention computes a pass of T tokens after n cached ones: a list of calls
    (rows, path, bias), each for some of the pass's rows (rows None: all of them).

    A row's reduction runs over cache slots, so it equals its one-token step only if (1) it
    runs over the same slots, its key window (key_window: a function of its position alone),
    and (2) the ancestors it sees sit where they would in a chain: slots n, n+1, ... in order.
    A chain's rows do, and so does every row hanging off a tree's first branch when that
    branch comes first (a drafter's runner-up leaves, drafters.Tree.grow). Every other row is
    computed with its root-to-node path first moved to those slots: `path` lists the path's
    new-token indices in order (None: nothing moves). bias (len(rows), W): 0 where a row
    attends among the W slots of its window, -inf elsewhere; a row's own key is not among
    them (exact_attention adds it apart).
    """
    bias = torch.full((T, L), float("-inf"), device=device)
    if mask is None:  # one token (causal_mask): its ancestors are all cached
        bias[:, :n] = 0.0
        return [(None, None, bias[:, :key_window(n, L)])]
    bias[:, :n + T] = torch.where(mask, 0.0, float("-inf"))
    bias[:, n:n + T].fill_diagonal_(float("-inf"))
    anc = mask[:, n:].cpu() & ~torch.eye(T, dtype=torch.bool)  # (T, T): row i's ancestors in the pass
    depth = anc.sum(1).tolist()
    moved = ~(anc == (torch.arange(T)[None, :] < torch.tensor(depth)[:, None])).all(1)
    kept = torch.nonzero(~moved)[:, 0].tolist()
    calls = by_window(kept, None, bias[kept], [n + depth[i] for i in kept], L, T)
    todo = set(torch.nonzero(moved)[:, 0].tolist())
    for i in sorted(todo, key=lambda i: -depth[i]):  # one path per deepest row not yet done
        if i not in todo:
            continue
        path = torch.nonzero(anc[i])[:, 0].tolist() + [i]
        rows = [j for j in path if j in todo]
        todo -= set(rows)
        b = torch.full((len(rows), L), float("-inf"), device=device)
        b[:, :n] = bias[rows, :n]  # the cached slots each row may see, as its mask says
        for r, j in enumerate(rows):
            b[r, n:n + path.index(j)] = 0.0  # its ancestors, moved; itself comes apart
        calls += by_window(rows, torch.tensor(path, device=device), b, [n + depth[j] for j in rows], L, T)
    return calls


def by_window(rows, path, bias, seen, L: int, T: int):
    """exact_layout's calls for `rows` (their bias rows in `bias`, seen[r] cached slots before
    row r): one per key window, bias cut to it."""
    windows = [key_window(s, L) for s in seen]
    calls = []
    for W in sorted(set(windows)):
        pick = [r for r, w in enumerate(windows) if w == W]
        ids = None if len(pick) == T else torch.tensor([rows[r] for r in pick], device=bias.device)
        calls.append((ids, path, bias[pick, :W]))
    return calls


def key_window(seen: int, L: int) -> int:
    """The cache slots a row reduces over when `seen` slots precede it: a whole number of
    EXACT_KEYS blocks (at most L). A function of the row's position alone, so a row in a
    pass and its one-token step reduce over the same slots, yet neither over all L."""
    return min(-(-max(seen, 1) // EXACT_KEYS) * EXACT_KEYS, L)


def exact_attention(q, k, v, K, V, bias):
    """Attention whose every query row is computed as it would be alone (batch-invariant).

    q: (T, H, D) and the rows' own k, v: (T, Hkv, D); K, V: (Hkv, W, D), the slots of the
    rows' key window; bias: (T, W), 0 where row i attends, -inf elsewhere. A fused kernel
    reduces a row over the keys of its own pass, in blocks that depend on T, so a token
    verified among others gets other roundings than in a one-token step. Here every row
    reduces over the W slots in one order whatever T is (masked slots add exact zeros), both
    products run in tiles of rows (tiled), and a row's own key and value come as one column
    apart, after the W slots: a runner-up leaf then needs no slot of its own. exact_layout
    picks the window and the slots, so that a row equals its one-token step.
    """
    T, H, D = q.shape
    Hkv, W, _ = K.shape
    G, M = H // Hkv, T * H // Hkv  # query heads per kv head; rows per kv head
    qg = q.view(T, Hkv, G, D).transpose(0, 1)  # (Hkv, T, G, D)
    s = tiled(lambda c: c @ K.transpose(1, 2), qg.reshape(Hkv, M, D)).view(Hkv, T, G, W)
    own = (qg.float() * k.transpose(0, 1)[:, :, None].float()).sum(-1, keepdim=True).to(q.dtype)
    x = s.new_empty(Hkv, T, G, W + 1, dtype=torch.float32)  # scores: the W slots, then the row's own
    torch.add(bias[:, None], s, alpha=D ** -0.5, out=x[..., :W])
    torch.mul(own, D ** -0.5, out=x[..., W:])
    p = torch.softmax(x, dim=-1).to(V.dtype)  # (Hkv, T, G, W + 1)
    y = tiled(lambda c: c @ V, p[..., :W].reshape(Hkv, M, W)).view(Hkv, T, G, D)
    y = torch.addcmul(y, p[..., W:], v.transpose(0, 1)[:, :, None])  # plus the row's own value, weighted
    return y.permute(1, 0, 2, 3).reshape(T, H * D)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = Linear(args.dim, args.ffn_dim, bias=False)
        self.up_proj = Linear(args.dim, args.ffn_dim, bias=False)
        self.down_proj = Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args)


class Inner(nn.Module):  # the HF "model." prefix: embeddings, blocks, final norm
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)


class Model(nn.Module):
    def __init__(self, args: ModelArgs, exact: bool = False):
        super().__init__()
        self.args = args
        self.model = Inner(args)
        self.lm_head = Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(args), persistent=False)
        self.set_exact(exact)

    def set_exact(self, exact: bool) -> "Model":
        """Batch-invariant products and attention: a token's logits are then bit for bit the
        same whether it is computed alone or on any branch of a verification pass, so greedy
        speculative decoding follows autoregressive decoding through near-ties that a fused
        kernel would flip. False: the kernels torch picks (docs/performance.md: what each costs)."""
        self.exact = exact
        for m in self.modules():
            if isinstance(m, Linear):  # (Attention follows the layout Model.forward hands it)
                m.exact = exact
        return self

    @property
    def device(self):
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self):  # of the activations and the KV cache, even with int8 weights
        return self.model.embed_tokens.weight.dtype

    @property
    def step_rows(self) -> int:
        """Rows a one-token pass computes: the exact kernels pad every product to EXACT_ROWS
        (tiled), so a plain step may carry that many tokens for little more than its own cost."""
        return EXACT_ROWS.get(self.dtype, 1) if self.exact else 1

    def new_cache(self, max_len: int) -> "KVCache":
        return KVCache(self.args, max_len, self.dtype, self.device)

    def forward(self, ids, pos, mask, cache, capture=(), logits_at=slice(None), exact=None):
        """ids, pos: (T,) int64; mask: (T, cache.n + T) bool, or None when every new token
        may see every slot (a single new token: the mask builders below return None then,
        and attention runs its faster unmasked kernel).

        capture: (kind, layer) pairs, kind "attn" (the residual after the attention
        sublayer), "mlp" (after the MLP sublayer) or "in" (the block's input).
        logits_at: which of the T rows get logits (prefill needs one, feature passes none).
        exact: this pass's kernels (set_exact), e.g. False for a prompt's prefill, which every
        method runs alike; None: the model's setting.
        Returns logits (len(logits_at), V) in float32 and {(kind, layer): (T, dim)}.
        """
        x = self.model.embed_tokens(ids)  # (T, dim)
        cos, sin = rope(self.inv_freq, pos, x.dtype)
        if exact is not None and exact != self.exact:  # this pass only
            self.set_exact(exact)
            try:
                return self(ids, pos, mask, cache, capture, logits_at)
            finally:
                self.set_exact(not exact)
        if self.exact:
            mask = exact_layout(mask, len(ids), cache.n, cache.k.shape[2], x.device)
        hidden = {}
        for i, block in enumerate(self.model.layers):
            if ("in", i) in capture:
                hidden["in", i] = x
            x = x + block.self_attn(block.input_layernorm(x), cos, sin, mask, cache, i)
            if ("attn", i) in capture:
                hidden["attn", i] = x
            x = x + block.mlp(block.post_attention_layernorm(x))
            if ("mlp", i) in capture:
                hidden["mlp", i] = x
        cache.n += len(ids)
        logits = self.lm_head(self.model.norm(x[logits_at])).float()
        return logits, hidden

    @torch.inference_mode()
    def forward_sequence(self, ids, capture=(), logits_at=slice(None)):
        """One teacher-forced pass over a whole sequence from an empty cache: its logits
        (at `logits_at`) and captured hidden states, as forward() returns them."""
        mask, pos = causal_mask(len(ids), 0, self.device)
        return self(torch.tensor(ids, device=self.device), pos, mask, self.new_cache(len(ids)),
                    capture, logits_at)

    def fingerprint(self) -> str:
        """A short hash of a few weights, stable across dtypes: names the checkpoint."""
        h = hashlib.sha256()
        for t in (self.model.embed_tokens.weight[:8], self.model.norm.weight,
                  self.model.layers[0].self_attn.q_proj.weight[:4]):
            h.update(t.detach().to(torch.bfloat16).float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def quantize_int8(self) -> "Model":
        """Every Linear (the blocks' and the output layer) to Int8Linear, in place. The
        embedding stays: a lookup reads one row per token, not the table."""
        for mod in list(self.modules()):
            for name, child in list(mod.named_children()):
                if isinstance(child, Linear):
                    setattr(mod, name, Int8Linear.quantize(child))
        return self

    @classmethod
    def from_pretrained(cls, folder, dtype=None, device="cpu", int8=False, exact=True) -> "Model":
        """dtype None: default_dtype(device). int8: weight-only int8 Linears (Int8Linear), for a
        draft model. exact: batch-invariant kernels (set_exact); False: torch's own, which a
        draft model keeps (it only proposes). docs/performance.md: what exact costs."""
        folder = Path(folder)
        dtype = dtype or default_dtype(device)
        args = ModelArgs.from_config(read_json(folder / "config.json"), str(folder / "config.json"))
        with torch.device("meta"):
            model = cls(args)
        tensors = load_safetensors(folder)
        params = dict(model.named_parameters())
        if args.tie_embeddings:
            params.pop("lm_head.weight")
        for name, p in params.items():
            # copy=True: the file is memory-mapped, and the kernel may drop mapped pages
            # under memory pressure, which stalls a later decode step for a second.
            t = checked_weight(tensors, name, p.shape, folder).to(device=device, dtype=dtype, copy=True)
            module, leaf = parent_of(model, name)
            setattr(module, leaf, nn.Parameter(t, requires_grad=False))
        if args.tie_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.inv_freq = rope_frequencies(args).to(device)
        return (model.quantize_int8() if int8 else model).set_exact(exact).eval()


def n_weights(module: nn.Module) -> int:
    """The weights a forward of `module` reads, int8 ones included (Int8Linear's buffers)."""
    return sum(t.numel() for t in (*module.parameters(), *module.buffers()))


def parent_of(root: nn.Module, name: str):
    """(the module holding parameter `name`, its attribute name), e.g. "model.norm.weight"."""
    *path, leaf = name.split(".")
    for p in path:
        root = getattr(root, p)
    return root, leaf


class KVCache:
    """Preallocated keys and values for batch 1: (n_layers, n_kv_heads, max_len, head_dim)."""

    def __init__(self, args: ModelArgs, max_len: int, dtype, device):
        shape = (args.n_layers, args.n_kv_heads, max_len, args.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n = 0  # committed slots; a forward appends, keep/truncate shrink

    def write(self, layer, k, v):
        """Store (Hkv, T, D) new keys/values after slot n; return views of slots [0, n+T)."""
        n, T = self.n, k.shape[1]
        if n + T > self.k.shape[2]:
            raise ValueError(f"KV cache full: {n} + {T} tokens > {self.k.shape[2]} slots")
        self.k[layer, :, n:n + T] = k
        self.v[layer, :, n:n + T] = v
        return self.k[layer, :, :n + T], self.v[layer, :, :n + T]

    def keep(self, start: int, rows):
        """Keep rows start+r for r in `rows` (ascending) as slots start, start+1, ...; drop the rest."""
        if list(rows) == list(range(len(rows))):  # already in place (e.g. a chain's prefix)
            self.n = start + len(rows)
            return
        idx = torch.as_tensor(rows, device=self.k.device) + start
        self.k[:, :, start:start + len(rows)] = self.k[:, :, idx]
        self.v[:, :, start:start + len(rows)] = self.v[:, :, idx]
        self.n = start + len(rows)

    def truncate(self, n: int):
        self.n = min(self.n, n)


# ---------------------------------------------------------------------------------------
# Masks: the model obeys any mask; these two shapes are what the decode loop needs.
# ---------------------------------------------------------------------------------------

def tree_mask(parents, n: int, device="cpu"):
    """Mask and positions for new tokens arranged as a tree hanging off n cached tokens.

    parents[i] is the index of token i's parent among the new tokens (-1: it follows the
    cache directly). Token i sees the whole cache, itself and its ancestors; its position
    is n + depth(i). A chain [-1, 0, 1, ...] gives the ordinary causal mask; W candidates
    hanging off the current token c give SwitchSD's block-triangular mask, each block
    restarting its positions at n + 1:

                 cache  c  a1 a2  b1 b2 b3      parents = [-1, 0, 1, 0, 3, 4]
        c      [ 1 1 1  1  .  .   .  .  . ]     pos     = [n, n+1, n+2, n+1, n+2, n+3]
        a1     [ 1 1 1  1  1  .   .  .  . ]
        a2     [ 1 1 1  1  1  1   .  .  . ]
        b1     [ 1 1 1  1  .  .   1  .  . ]
        b2     [ 1 1 1  1  .  .   1  1  . ]
        b3     [ 1 1 1  1  .  .   1  1  1 ]
    """
    T = len(parents)
    anc = torch.eye(T, dtype=torch.bool)
    depth = [0] * T
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    mask = torch.cat([torch.ones(T, n, dtype=torch.bool), anc], dim=1)
    return (mask.to(device) if T > 1 else None), (n + torch.tensor(depth)).to(device)


def causal_mask(T: int, n: int, device="cpu"):
    """The chain special case of tree_mask, without a Python loop (for long prefills)."""
    pos = torch.arange(n, n + T, device=device)
    return (torch.ones(T, n + T, dtype=torch.bool).tril(n).to(device) if T > 1 else None), pos


# ---------------------------------------------------------------------------------------
# Checkpoint files
# ---------------------------------------------------------------------------------------

def read_json(path: Path) -> dict:
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent}: no such model folder")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def checked_weight(tensors: dict, name: str, shape, folder) -> torch.Tensor:
    """tensors[name], refused with the checkpoint's name when missing or of another shape."""
    if name not in tensors:
        raise ValueError(f"{folder}: weight {name!r} is missing from the checkpoint")
    if tuple(tensors[name].shape) != tuple(shape):
        raise ValueError(f"{folder}: weight {name!r} has shape {tuple(tensors[name].shape)}, "
                         f"config.json implies {tuple(shape)}")
    return tensors[name]


def load_safetensors(folder: Path) -> dict:
    """All tensors of model.safetensors, or of the shards a model.safetensors.index.json names."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = sorted({folder / f for f in read_json(index)["weight_map"].values()})
    else:
        raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: shard named in the index is missing")
        try:
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    tensors[k] = sf.get_tensor(k)
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise ValueError(f"{f}: unreadable safetensors file ({e})") from None
    return tensors


# ---------------------------------------------------------------------------------------
# Tokenizer and chat formats
# ---------------------------------------------------------------------------------------

def default_system(template: str) -> str | None:
    """The literal system prompt a ChatML jinja template inserts when the user gives none.
    The template may also splice in messages[0]['content'] and may write its newline as a
    real one or as a jinja escape: take the first system turn that is plain text."""
    for m in re.finditer(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", template, re.S):
        if not re.search(r"[{}'\"+]|\bmessages\b", m.group(1)):
            return m.group(1).replace("\\n", "\n")
    return None


class Tokenizer:
    """tokenizer.json through the `tokenizers` library, plus stop ids and a chat format.

    Two chat formats are written out by hand (no jinja): ChatML (Qwen, SmolLM2) and the
    Llama 3 header format. The default system prompt of a ChatML template, when it has
    one, is read from tokenizer_config.json's chat_template.
    """

    def __init__(self, folder):
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: file not found")
        self.tok = HFTokenizer.from_file(str(path))
        cfg = read_json(folder / "config.json")
        tcfg = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        gcfg = read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        eos = gcfg.get("eos_token_id", cfg.get("eos_token_id"))
        self.eos_ids = set([eos] if isinstance(eos, int) else eos or [])
        vocab = self.tok.get_vocab(with_added_tokens=True)
        if "<|im_start|>" in vocab:
            self.chat_format = "chatml"
            self.eos_ids.add(vocab["<|im_end|>"])
            self.default_system = default_system(tcfg.get("chat_template") or "")
        elif "<|start_header_id|>" in vocab:
            self.chat_format = "llama3"
            self.eos_ids.add(vocab["<|eot_id|>"])
            self.default_system = None
        else:
            self.chat_format, self.default_system = None, None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, special: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def pieces(self, ids) -> list[str]:
        """The text each token adds, decoding prefixes so multi-byte characters split across
        tokens land on the token that completes them."""
        ids = list(ids)
        return [self.decode(ids[:i + 1])[len(self.decode(ids[:i])):] for i in range(len(ids))]

    def chat(self, user: str, system: str | None = None, history=()) -> str:
        """The prompt text for a user turn after `history`, (user, assistant) pairs of earlier
        turns, ending where the assistant starts to write."""
        system = system if system is not None else self.default_system
        if self.chat_format == "chatml":
            turn = lambda role, text: f"<|im_start|>{role}\n{text}<|im_end|>\n"
            head = turn("system", system) if system else ""
            past = "".join(turn("user", u) + turn("assistant", a) for u, a in history)
            return f"{head}{past}{turn('user', user)}<|im_start|>assistant\n"
        if self.chat_format == "llama3":
            turn = lambda role, text: f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>"
            head = turn("system", system) if system else ""
            past = "".join(turn("user", u) + turn("assistant", a) for u, a in history)
            return f"<|begin_of_text|>{head}{past}{turn('user', user)}<|start_header_id|>assistant<|end_header_id|>\n\n"
        raise ValueError("tokenizer.json: no known chat format (ChatML or Llama 3); use --no-chat")

    def prompt_ids(self, text: str, chat: bool = True) -> list[int]:
        return self.encode(self.chat(text), special=False) if chat else self.encode(text)


# ---------------------------------------------------------------------------------------
# CPU speed-ups: nothing above depends on them for correctness. A batch-1 step on a CPU
# waits on reading the weights (docs/performance.md); these make that read cheaper.
# ---------------------------------------------------------------------------------------

# The rows a product may have for each row's result not to depend on how many rows it has
# (measured with `bench.py invariance`; the tests check it on the machine they run on). At
# least EXACT_ROWS: one row runs a matrix-vector kernel that reduces in another order; oneDNN's
# bf16 GEMM is row-independent from 3 rows (from 2 on most shapes, but on an AVX512-bf16 AMD EPYC
# a 2-row product of a 32-wide layer rounds otherwise), MKL's batched float32 GEMM
# (Linear.blocked, the attention's products) from 4, where its plain GEMM needs 16. At most
# EXACT_TILE: on a CPU with AMX, oneDNN's bf16 GEMM changes kernels above 32 rows
# (docs/performance.md).
EXACT_ROWS = {torch.bfloat16: 3, torch.float16: 3, torch.float32: 4}
EXACT_TILE = 32
# Output rows per block of an exact float32 product on a CPU (Linear.blocked): the fastest for
# 1-4 rows on the AMD EPYC (docs/performance.md); every block size from 16 up gives the same bits.
EXACT_BLOCK = 16
# Attention's key windows grow in blocks of this many slots (key_window): a product's result
# changes with its inner length (MKL's float32 GEMM at any length, oneDNN's bf16 past ~4k
# slots), so a row's window must not depend on its pass; in blocks, it costs a one-token
# step half a block of masked slots on average, where the whole cache would cost it
# max_new + the tree slack.
EXACT_KEYS = 128


def tiled(f, x):
    """f(x) for a product f over the rows of x (dim -2), run in tiles of EXACT_ROWS..EXACT_TILE
    rows (zero rows appended to a short one), so that every row goes through the same kernel
    whatever the number of rows."""
    lo, out = EXACT_ROWS.get(x.dtype, 1), []
    for c in x.split(EXACT_TILE, dim=-2):
        n = c.shape[-2]
        out.append(f(F.pad(c, (0, 0, 0, lo - n)) if n < lo else c)[..., :n, :])
    return out[0] if len(out) == 1 else torch.cat(out, dim=-2)


class Linear(nn.Linear):
    """nn.Linear that can be cut to a subset of its output rows (a draft's output layer).

    Batch-1 products are plain F.linear: hand-picked kernels for one row (torch.mv) or a few
    (W @ x.T) were faster on one host and 5-20% slower on the next (docs/performance.md), so
    the one kernel torch picks is the default that ages best. One case is not left to it: in
    float32 on a CPU (MKL's sgemm, the path of a CPU without bf16) 2-15 rows stream the weights
    from memory once per few rows, up to five times one row's cost. Cut into blocks of <= 512 KB
    of weights, one batched product keeps each block in the core's L2 while every row uses it,
    so the weights stream once: a 1.5B verification pass of 5-13 tokens costs 1.4-2.1 one-token
    passes instead of 2.0-5.1 (docs/performance.md).

    Exact (Model.set_exact): every product in tiles of rows (tiled). In float32 on a CPU the
    tiles run as blocked products of EXACT_BLOCK rows: MKL's batched GEMM gives a row the same
    bits from 4 rows on, and a one-token step padded to 4 rows costs about what F.linear's
    matrix-vector product does, where F.linear would need 16 rows and up to four times that."""

    exact = False  # Model.set_exact turns it on for a model's layers

    def forward(self, x):  # x: (T, in)
        mkl = x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu"
        if self.exact:  # batch-invariant: in tiles of rows the kernel treats alike
            return tiled(lambda c: self.blocked(c, EXACT_BLOCK) if mkl else F.linear(c, self.weight, self.bias), x)
        if 1 < x.shape[0] < 16 and mkl:
            O, I = self.weight.shape
            r = 1 << (max(1, min(2 ** 17 // I, O // 2)).bit_length() - 1)  # r * I * 4 B <= 512 KB
            if O % r == 0:
                return self.blocked(x, r)
        return super().forward(x)

    def blocked(self, x, r: int):
        """x @ W.T with W's output rows cut into blocks of r, as one batched product over the
        blocks: (blocks, T, in) @ (blocks, in, r). Zero rows complete the last block, and make
        two blocks at least: torch runs a batch of one as a plain product."""
        (O, I), T = self.weight.shape, x.shape[0]
        pad = max(-O % r, 2 * r - O)
        W = F.pad(self.weight, (0, 0, 0, pad)) if pad else self.weight
        W = W.view(-1, r, I).transpose(1, 2)  # (blocks, in, r)
        y = torch.bmm(x.expand(len(W), T, I), W).transpose(0, 1).reshape(T, -1)[:, :O]
        return y if self.bias is None else y + self.bias

    def rows(self, ids) -> "Linear":
        """The layer cut to output rows `ids` (a draft's output layer over a token subset)."""
        cut = Linear(self.in_features, len(ids), bias=self.bias is not None, device="meta")  # no init
        cut.weight = nn.Parameter(self.weight[ids], requires_grad=False)
        if self.bias is not None:
            cut.bias = nn.Parameter(self.bias[ids], requires_grad=False)
        return cut


class Int8Linear(nn.Module):
    """Int8 weights, one scale per output row: W ~= s * Q, Q = round(W / s), s = max|W_row| / 127.

    For a draft model. A batch-1 pass streams every weight once, so a quarter of float32's
    bytes (half of bf16's) makes a draft forward cheaper on a bandwidth-bound CPU (Qwen2.5-Coder-
    0.5B: docs/performance.md). On a CPU the product runs in integers too: each row of
    x is rounded the same way, x ~= a * X with its own a = max|x_row| / 127, and X @ Q.T is exact
    in int32 (torch._int_mm, VNNI on x86), so y = a * (X @ Q.T) * s. Its rows do not depend on
    one another, and a draft catching up on 20 tokens after a copy step, or reading a prompt,
    costs about half of what it did with int8 weights times bf16 rows (docs/performance.md).
    The rounding moves the draft's q a little and so its acceptance, never the output: every
    drafted token is still verified by the target against that same q."""

    def __init__(self, q, scales, bias=None):
        super().__init__()
        self.register_buffer("weight", q)  # (out, in) int8
        self.register_buffer("scales", scales)  # (out,) float32
        self.bias = bias

    @classmethod
    def quantize(cls, lin: nn.Linear) -> "Int8Linear":
        w = lin.weight.detach().float()
        s = w.abs().amax(1).clamp(min=1e-12) / 127
        return cls((w / s[:, None]).round().to(torch.int8), s, lin.bias)

    def forward(self, x):  # x: (T, in)
        if x.device.type == "cpu":
            xf = x.float()
            a = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127  # (T, 1): one scale per row
            X = (xf / a).round().to(torch.int8)
            y = torch._int_mm(X, self.weight.T) * (a * self.scales)  # (T, out), float32
        else:  # dequantize on the fly (torch._int_mm on CUDA wants more than 16 rows)
            y = F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        return (y if self.bias is None else y + self.bias).to(x.dtype)

    def rows(self, ids) -> "Int8Linear":
        return Int8Linear(self.weight[ids], self.scales[ids], None if self.bias is None else self.bias[ids])


def default_dtype(device="cpu") -> torch.dtype:
    """bfloat16 where the hardware computes in it (CUDA; a CPU with AVX512-bf16 or AMX), else
    float32. Without native bf16 a CPU converts every weight it multiplies: a 1.5B step then
    costs as much as in float32 with half the bytes, and a verification pass of 21 tokens twice
    float32's (docs/performance.md)."""
    if torch.device(device).type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has("avx512_bf16") or cpu_has("amx_tile") else torch.float32


def default_quant(device="cpu") -> str:
    """A draft's weights where none are asked for: "int8" (Int8Linear) on a CPU that multiplies
    int8 natively (VNNI, torch._int_mm's fast path), else "none" (the target's dtype). Without
    VNNI torch._int_mm falls back to a generic loop: on an AVX2-only AMD EPYC one row of a 0.5B
    draft's MLP product costs 2.6x float32's, 16 rows 14x, and the draft's steps cost more than
    the target's (docs/performance.md). Off a CPU, Int8Linear converts its weights at every
    forward, which reads more bytes than it saves."""
    return "int8" if torch.device(device).type == "cpu" and cpu_has("vnni") else "none"


def cpu_has(feature: str) -> bool:
    """Whether this CPU has `feature` (torch.cpu._is_<feature>_supported). torch names these
    only privately; where it does not, assume the common case, yes."""
    return getattr(torch.cpu, f"_is_{feature}_supported", lambda: True)()

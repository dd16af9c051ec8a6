"""Tests on tiny random models that the tests write as real checkpoint folders, in the
layer order of the code (llama, data, drafters, switchsd, probe, bench, fetch).

Token identity is tested with the exact (batch-invariant) kernels, the default, in float32 and
bf16: they must give a token the same logits in any pass.
"""
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import data
import drafters
import llama
import probe as probe_mod
import switchsd
from drafters import CopyConfig, CopyDrafter, CopySpec, Eagle3Config, PromptLookup, SPSConfig, Tree


# ---------------------------------------------------------------------------------------
# Builders: tiny checkpoints, drafters and references shared by the tests below
# ---------------------------------------------------------------------------------------

HERE = Path(__file__).parent
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}...{% endfor %}{{ '<|im_start|>system\\nYou are a test."
          "<|im_end|>\\n' }}")


def write_tokenizer(folder: Path):
    """A byte-level BPE with no merges: 256 byte tokens, then the ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return tok.get_vocab_size()


CONFIGS = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=64),
                  tie_word_embeddings=False),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1e6,
                  tie_word_embeddings=True),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=24,
                  attention_bias=False, rope_theta=1e6, tie_word_embeddings=True),
}


def make_checkpoint(folder: Path, arch="qwen2", seed=0, scale=0.3, **overrides) -> Path:
    """Write config.json, model.safetensors and a tokenizer for a tiny random model."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder)
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=512,
               rms_norm_eps=1e-6, hidden_act="silu", eos_token_id=vocab - 1, bos_token_id=vocab - 3)
    cfg.update(CONFIGS[arch], **overrides)
    (folder / "config.json").write_text(json.dumps(cfg))
    args = llama.ModelArgs.from_config(cfg)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in llama.Model(args).state_dict().items()}
    if args.tie_embeddings:
        shapes.pop("lm_head.weight")
    g = torch.Generator().manual_seed(seed)
    tensors = {k: torch.randn(s, generator=g) * (1.0 if k.endswith("norm.weight") else scale)
               + (1.0 if k.endswith("norm.weight") else 0.0) for k, s in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def make_copying_checkpoint(folder: Path, seed=0, noise=0.01, vocab=32):
    """A 4-layer Qwen2 model with a planted induction circuit, plus random noise.

    Random tiny models almost never repeat themselves, so copy drafts would never be
    accepted and the tests would not exercise acceptance. This one mostly predicts the
    token that followed the most recent earlier occurrence of the current token: layer 0
    has a previous-token head (rotary phases that peak at distance 1), layer 1 an
    induction head (query: current token; key: previous token; a recency slope).
    """
    folder.mkdir(parents=True, exist_ok=True)
    V, dim, D = vocab, 128, 128
    cfg = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=dim,
               intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
               num_key_value_heads=1, head_dim=D, vocab_size=V, max_position_embeddings=512,
               rms_norm_eps=1e-6, rope_theta=1e9, tie_word_embeddings=False, hidden_act="silu")
    (folder / "config.json").write_text(json.dumps(cfg))
    args = llama.ModelArgs.from_config(cfg)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in llama.Model(args).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    w = {k: (torch.ones(s) if k.endswith("norm.weight") else noise * torch.randn(s, generator=g))
         for k, s in shapes.items()}
    theta = [1e6 ** (-2 * f / D) for f in range(D // 2)]
    eye = torch.eye(V)
    code = [D // 4 + v for v in range(V)]  # first components of slow rotary pairs
    w["model.embed_tokens.weight"][:, :V] += eye  # dims 0..V-1: the current token
    # Layer 0, head 0, attends to the previous token: q.k peaks at distance 1 using the
    # high-frequency rotary pairs; a slow pair breaks the tie between distances 0 and 2.
    p = "model.layers.0.self_attn."
    for f in range(6):
        w[p + "q_proj.bias"][f] += 200.0
        w[p + "k_proj.bias"][f] += math.cos(theta[f])
        w[p + "k_proj.bias"][f + D // 2] += math.sin(theta[f])
    w[p + "q_proj.bias"][16] += 200.0
    w[p + "k_proj.bias"][16 + D // 2] -= 70.0
    w[p + "v_proj.weight"][:V, :V] += eye / math.sqrt(dim)
    w[p + "o_proj.weight"][32:32 + V, :V] += eye  # dims 32..: the previous token
    # Layer 1, head 0, the induction head: query = current token, key = previous token,
    # with a recency slope; value = the token at that position, written to dims 64..
    p = "model.layers.1.self_attn."
    s = math.sqrt(dim / 2)
    for v in range(V):
        w[p + "q_proj.weight"][code[v], v] += 70000.0 / s
        w[p + "k_proj.weight"][code[v], 32 + v] += 1.0 / s
    w[p + "q_proj.bias"][16] += 35000.0
    w[p + "k_proj.bias"][16 + D // 2] -= 1.0
    w[p + "v_proj.weight"][:V, :V] += eye / s
    w[p + "o_proj.weight"][64:64 + V, :V] += 10 * eye
    w["lm_head.weight"][:, 64:64 + V] += eye
    save_file(w, str(folder / "model.safetensors"))
    return folder


def noisy_copy(folder: Path, src: Path, noise: float, seed=0) -> Path:
    """A draft model: the target's checkpoint plus noise (agrees often, not always)."""
    from safetensors.torch import load_file
    folder.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (src / f).exists():
            (folder / f).write_text((src / f).read_text())
    g = torch.Generator().manual_seed(seed)
    t = load_file(str(src / "model.safetensors"))
    save_file({k: v + noise * v.std() * torch.randn(v.shape, generator=g) for k, v in t.items()},
              str(folder / "model.safetensors"))
    return folder


def cut_vocab(folder: Path, src: Path, n: int, noise: float, seed=0) -> Path:
    """A draft model with only the first n of the target's vocabulary rows (its embedding and
    output layer cut), plus noise: a draft smaller in vocabulary than its target, as the
    0.5B Qwen2.5-Coder (151,936 rows) is against the 7B (152,064). Same tokenizer file."""
    from safetensors.torch import load_file
    noisy_copy(folder, src, noise, seed)
    t = load_file(str(folder / "model.safetensors"))
    save_file({k: v[:n].contiguous() if k in ("model.embed_tokens.weight", "lm_head.weight") else v
               for k, v in t.items()}, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": n}))
    return folder


def eagle_config(model, draft_vocab):
    a = model.args
    return {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": a.dim, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 96, "rms_norm_eps": 1e-6,
            "vocab_size": a.vocab_size, "draft_vocab_size": draft_vocab, "rope_theta": 10000.0,
            "num_hidden_layers": 1}


def make_eagle(folder: Path, model, draft_vocab=None, seed=0, fmt="safetensors", prefix="midlayer."):
    """A random EAGLE-3 head in the official layout, over the draft vocabulary's top ids."""
    draft_vocab = draft_vocab or model.args.vocab_size
    cfg = eagle_config(model, draft_vocab)
    head = drafters.Eagle3Head(cfg, model.args.dim)
    g = torch.Generator().manual_seed(seed)
    state = {}
    for k, v in head.state_dict().items():
        if k == "d2t":  # draft id i -> target id used[i]: every other id, here
            used = torch.arange(draft_vocab) * (model.args.vocab_size // draft_vocab)
            v = used - torch.arange(draft_vocab)
        elif k.endswith("norm.weight"):
            v = 1 + 0.1 * torch.randn(v.shape, generator=g)
        else:
            v = 0.3 * torch.randn(v.shape, generator=g)
        state[k.replace("midlayer.", prefix, 1)] = v.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return folder, state


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2")
    return llama.Model.from_pretrained(folder, torch.float32), folder


@pytest.fixture(scope="module")
def copier_model(tmp_path_factory):
    return llama.Model.from_pretrained(make_copying_checkpoint(tmp_path_factory.mktemp("cp") / "m"),
                                       torch.float32)


@pytest.fixture(scope="module")
def neural_setup(tmp_path_factory):
    """The copying target, a noisy copy of it as SPS draft, and a random EAGLE-3 head."""
    base = tmp_path_factory.mktemp("neural")
    src = make_copying_checkpoint(base / "target")
    target = llama.Model.from_pretrained(src, torch.float32)
    draft = llama.Model.from_pretrained(noisy_copy(base / "draft", src, 0.05), torch.float32, exact=False)  # as load_draft
    head = drafters.Eagle3Head.load(make_eagle(base / "eagle", target, draft_vocab=16)[0], target)
    draft8 = llama.Model.from_pretrained(base / "draft", torch.float32, int8=True, exact=False)
    return target, draft, head, draft8


def neural_drafters(setup):
    target, draft, head, draft8 = setup
    return [("sps", lambda: drafters.DraftModel(draft, sps(gamma=4))),
            ("sps-int8", lambda: drafters.DraftModel(draft8, sps(gamma=4, vocab=8, topk=2))),  # int8, cut head
            ("sps-stop", lambda: drafters.DraftModel(draft, sps(gamma=4, threshold=0.99))),
            ("sps-vocab", lambda: drafters.DraftModel(draft, sps(gamma=4, vocab=8))),  # ids < 8 and the context's
            ("sps-top3", lambda: drafters.DraftModel(draft, sps(gamma=4, vocab=8, topk=3))),  # leaves, cut head
            ("eagle3", lambda: drafters.Eagle3(head, target, eagle(gamma=3))),
            ("eagle3-top3", lambda: drafters.Eagle3(head, target, eagle(gamma=3, topk=3))),
            ("eagle3-stop", lambda: drafters.Eagle3(head, target, eagle(gamma=3, topk=2, threshold=0.5)))]


def repetitive_prompts(n, V=32, seed=0):
    """Prompts that repeat a block several times with mutations: the kappa-grams recur
    with different continuations, so copy candidates disagree with each other."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(V) for _ in range(rng.randrange(12, 30))]
        p = list(base)
        for _ in range(rng.randrange(1, 4)):
            cut = rng.randrange(len(base))
            p += [rng.randrange(V)] + base[:cut] + [rng.randrange(V)] + base[cut + 1:]
        out.append(p)
    return out


def sps(**options) -> SPSConfig:
    """An SPS drafter at its plainest (a chain, no early stop, the whole vocabulary), changed by options."""
    return SPSConfig(**{"gamma": 4, "threshold": 0.0, "topk": 1, "vocab": 0, **options})


def eagle(**options) -> Eagle3Config:
    """An EAGLE-3 drafter at its plainest (a chain, no early stop), changed by options."""
    return Eagle3Config(**{"gamma": 4, "threshold": 0.0, "topk": 1, **options})


def full_logits(model, ids):
    cache = model.new_cache(len(ids))
    mask, pos = llama.causal_mask(len(ids), 0)
    return model(torch.tensor(ids), pos, mask, cache)[0]


def ar_reference(model, prompt, n):
    """Greedy decoding by full recomputation: the ground truth every method must match."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(full_logits(model, ids)[-1].argmax()))
    return ids[len(prompt):]


def run_cli(*args):
    return subprocess.run([sys.executable, str(HERE / "switchsd.py"), *args],
                          capture_output=True, text=True, cwd=HERE, timeout=300)


def draws_match(counts, p, n):
    """Pearson's chi-square test of the draws against p at significance 1e-4 (cells with an
    expected count under 5 pooled); a draw p gives probability 0 fails outright."""
    assert all(p.get(x, 0.0) > 0 for x in counts), "drew an outcome the target never emits"
    cells, pooled = [], [0.0, 0]
    for x, px in p.items():
        if n * px < 5:
            pooled[0] += n * px
            pooled[1] += counts.get(x, 0)
        else:
            cells.append((n * px, counts.get(x, 0)))
    if pooled[0] > 0:
        cells.append(tuple(pooled))
    chi2 = sum((c - e) ** 2 / e for e, c in cells)
    df = len(cells) - 1
    z = 3.719  # the standard normal's 1 - 1e-4 quantile; Wilson-Hilferty for chi-square's
    assert chi2 < df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3, (chi2, df)


def brute_candidates(ctx, kappa, width, depth):
    key = ctx[-kappa:]
    cands = []
    for e in range(len(ctx) - 2, kappa - 2, -1):  # most recent earlier occurrence first
        if ctx[e - kappa + 1:e + 1] == key:
            c = ctx[e + 1:e + 1 + depth]
            if c not in cands:
                cands.append(c)
    return cands[:width]


def brute_labels(ids, start, kappa):
    """Y_j by definition: j inside a span of >= kappa tokens that also starts earlier."""
    n, y = len(ids), [0] * len(ids)
    for a in range(n):
        for b in range(a + kappa - 1, n):
            if any(ids[c:c + b - a + 1] == ids[a:b + 1] for c in range(a)):
                y[a:b + 1] = [1] * (b - a + 1)
    return y[start:]


def planted_probe(model, tokens, layer=0, tau=0.5):
    """A probe that fires (score ~1) exactly when the current token is one of `tokens`:
    the copying model keeps the current token one-hot in dims 0..31 of its residual."""
    w = torch.zeros(model.args.dim)
    w[:32] = -20.0
    w[list(tokens)] = 20.0
    return switchsd.Probe(w, layer, "attn", tau, 5, switchsd.model_identity(model))


class RandomCopier(CopyDrafter):
    """Copies at random steps (seeded): drives arbitrary interleavings of copy and neural."""

    def __init__(self, seed):
        super().__init__(CopyConfig(kappa=1, width=2, depth=6))
        self.rng = random.Random(seed)

    def propose(self, ctx, depth):
        return super().propose(ctx, depth) if self.rng.random() < 0.5 else None


METHODS = [("pld", PromptLookup), ("copyspec", CopySpec), ("copy", CopyDrafter),
           ("copy", lambda: CopyDrafter(CopyConfig(kappa=2, width=3, depth=7)))]


# ---------------------------------------------------------------------------------------
# llama.py: the model, cache, masks, checkpoints, tokenizer
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_match_transformers(arch, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = make_checkpoint(tmp_path / arch, arch)
    ours = llama.Model.from_pretrained(folder, torch.float32)
    ref, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.randint(0, ours.args.vocab_size, (50,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
        got = full_logits(ours, ids.tolist())
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_incremental_decoding_equals_full_forward(tiny):
    model, _ = tiny
    ids = torch.randint(0, 200, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    full = full_logits(model, ids)
    cache = model.new_cache(64)
    parts, start = [], 0
    for T in (7, 1, 1, 5, 16):  # a prefill, single steps, and a multi-token chunk
        mask, pos = llama.causal_mask(T, start)
        parts.append(model(torch.tensor(ids[start:start + T]), pos, mask, cache)[0])
        start += T
    # The random model's residual stream reaches ~200, and a product over one row and over
    # a chunk may sum in different orders (MKL picks kernels by shape): float32 rounding
    # reached ~1e-4 in the logits on an AMD EPYC host. Masking or cache slots gone wrong
    # would move them by ~1.
    torch.testing.assert_close(torch.cat(parts), full, rtol=1e-4, atol=1e-3)


def test_block_triangular_pass_equals_separate_passes(tiny):
    model, _ = tiny
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 200, (12,), generator=g).tolist()
    cands = [torch.randint(0, 200, (L,), generator=g).tolist() for L in (5, 3, 6)]
    cands = [[100 + i] + c for i, c in enumerate(cands)]  # distinct first tokens: pure blocks
    tree = Tree.trie(prefix[-1], cands)
    assert len(tree) == 1 + sum(map(len, cands))
    cache = model.new_cache(64)
    mask, pos = llama.causal_mask(11, 0)
    model(torch.tensor(prefix[:-1]), pos, mask, cache)
    mask, pos = llama.tree_mask(tree.parents, cache.n)
    # every block sees the prefix and its own earlier tokens, positions restart per block
    assert pos.tolist() == [11] + [12 + j for c in cands for j in range(len(c))]
    logits, _ = model(torch.tensor(tree.tokens), pos, mask, cache)
    node = 1
    for c in cands:
        alone = full_logits(model, prefix + c)[len(prefix):]
        torch.testing.assert_close(logits[node:node + len(c)], alone, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(logits[0], full_logits(model, prefix)[-1], rtol=1e-4, atol=1e-4)
        node += len(c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiled_products_do_not_depend_on_the_row_count(dtype):
    """The exact kernels' premise at a real model's sizes (Qwen2.5-Coder-1.5B's MLP down
    projection, its attention at a 1000-slot cache): in llama.tiled, each row of a product of
    up to a copy tree's 81 rows equals the row alone, for the product an exact Linear runs
    (F.linear in bf16; Linear.blocked in float32 on a CPU). A tiny model's products are too
    small to reach the kernel switches this guards against (bf16 GEMM on an AMX CPU above 32
    rows; MKL's float32 GEMM below 16, which Linear.blocked must not inherit); and the floor,
    EXACT_ROWS, on a narrow layer over many rows."""
    g = torch.Generator().manual_seed(0)
    lin = llama.Linear(8960, 1536, bias=False, dtype=dtype)
    lin.weight.data = torch.randn(1536, 8960, generator=g).to(dtype)
    X = torch.randn(81, 8960, generator=g).to(dtype)
    V = torch.randn(2, 1000, 128, generator=g).to(dtype)
    P = torch.softmax(torch.randn(2, 81, 1000, generator=g), -1).to(dtype)
    if dtype == torch.float32:
        product = lambda x: lin.blocked(x, llama.EXACT_BLOCK)
    else:
        product = lambda x: torch.nn.functional.linear(x, lin.weight)
    with torch.no_grad():
        for f, x in ((product, X), (lambda p: p @ V, P)):
            alone = torch.cat([llama.tiled(f, x[..., r:r + 1, :]) for r in range(81)], dim=-2)
            for M in (2, 5, 11, 16, 32, 33, 48, 81):
                assert torch.equal(llama.tiled(f, x[..., :M, :]), alone[..., :M, :]), M
    # A narrow layer (the tiny test models' key and value projections, 32 x 64), over many rows:
    # in bf16 a different reduction order shows only where a sum rounds across a bf16 step, so
    # rarely (on an AVX512-bf16 AMD EPYC, 2-row products differed from wider ones in 10 of
    # 255,000 outputs: llama.EXACT_ROWS).
    narrow = llama.Linear(64, 32, bias=False, dtype=dtype)
    narrow.weight.data = (torch.randn(32, 64, generator=g) * 0.5).to(dtype)
    narrow.exact = True
    X = torch.randn(8000, 64, generator=g).to(dtype)
    with torch.no_grad():
        alone = torch.cat([narrow(X[i:i + 1]) for i in range(len(X))])
        for M in range(2, llama.EXACT_ROWS[dtype] + 3):
            assert torch.equal(torch.cat([narrow(X[i:i + M])[:1] for i in range(len(X))]), alone), M


@pytest.mark.parametrize("keys", [8, llama.EXACT_KEYS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_do_not_depend_on_the_pass(arch, dtype, keys, tmp_path, monkeypatch):
    """Batch invariance (Model.set_exact): a token's logits are bit for bit the same whether
    the target computes it alone, in a chain of T tokens, or on any branch of a W x D tree;
    with key windows of 8 slots, a pass's rows span several windows."""
    monkeypatch.setattr(llama, "EXACT_KEYS", keys)
    model = llama.Model.from_pretrained(make_checkpoint(tmp_path / arch, arch), dtype, exact=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (70,), generator=g).tolist()
    n, N = 40, 30  # prefix, then N tokens: alone one at a time, then in passes
    cache = model.new_cache(n + 200)
    with torch.inference_mode():
        mask, pos = llama.causal_mask(n, 0)
        model(torch.tensor(ids[:n]), pos, mask, cache, logits_at=slice(0, 0))
        alone = []
        for i in range(N):
            mask, pos = llama.causal_mask(1, n + i)
            alone.append(model(torch.tensor(ids[n + i:n + i + 1]), pos, mask, cache)[0][0])
        for T in (2, 3, 5, 8, 13, 16, 17, 30):
            cache.truncate(n)
            mask, pos = llama.causal_mask(T, n)
            logits = model(torch.tensor(ids[n:n + T]), pos, mask, cache)[0]
            assert all(torch.equal(logits[i], alone[i]) for i in range(T)), (arch, dtype, T)
        for W, D, b in ((2, 3, 0), (4, 5, 3), (3, 9, 1), (3, 4, 2)):  # the true continuation is branch b
            cands = [torch.randint(0, 256, (D,), generator=g).tolist() for _ in range(W - 1)]
            cands.insert(b, ids[n + 1:n + 1 + D])
            tree = Tree.trie(ids[n], cands)
            assert len(tree) == 1 + W * D  # (no shared prefix: the rows below are branch b's)
            cache.truncate(n)
            mask, pos = llama.tree_mask(tree.parents, n)
            logits = model(torch.tensor(tree.tokens), pos, mask, cache)[0]
            rows = [0] + list(range(1 + b * D, 1 + (b + 1) * D))  # the root, then branch b
            assert all(torch.equal(logits[r], alone[j]) for j, r in enumerate(rows)), (arch, dtype, W, D)
        # a drafter's chain with runner-up leaves at every depth
        tree, node, chain = Tree([ids[n]]), 0, [0]
        for j in range(1, 9):
            extra = [int(x) for x in torch.randint(0, 256, (j % 3,), generator=g)]
            node = tree.grow(node, ids[n + j], None, extra)
            chain.append(node)
        leaves = [(chain.index(tree.parents[r]) + 1, r, tree.tokens[r])  # (depth, row, token)
                  for r in range(len(tree)) if r not in chain]
        assert len(leaves) == sum(j % 3 for j in range(1, 9))
        cache.truncate(n)
        mask, pos = llama.tree_mask(tree.parents, n)
        logits = model(torch.tensor(tree.tokens), pos, mask, cache)[0]
        assert all(torch.equal(logits[r], alone[j]) for j, r in enumerate(chain)), (arch, dtype, "chain")
        for j, r, t in leaves:  # a leaf alone: the chain up to its parent, then the leaf as a one-token step
            cache.truncate(n)
            mask, pos = llama.causal_mask(j, n)
            model(torch.tensor(ids[n:n + j]), pos, mask, cache, logits_at=slice(0, 0))
            mask, pos = llama.causal_mask(1, n + j)
            assert torch.equal(logits[r], model(torch.tensor([t]), pos, mask, cache)[0][0]), (arch, dtype, "leaf", j)


def test_kv_compaction_equals_recomputation(tiny):
    model, _ = tiny
    prefix = list(range(40, 50))
    tree = Tree.trie(prefix[-1], [[1, 2, 3], [1, 7, 8, 9], [5, 6]])  # shares the first token
    cache = model.new_cache(64)
    mask, pos = llama.causal_mask(9, 0)
    model(torch.tensor(prefix[:-1]), pos, mask, cache)
    mask, pos = llama.tree_mask(tree.parents, cache.n)
    model(torch.tensor(tree.tokens), pos, mask, cache)
    path = [0, 1, 4, 5]  # root, 1, 7, 8: the middle branch
    assert [tree.tokens[i] for i in path] == [49, 1, 7, 8]
    cache.keep(9, path)
    assert cache.n == 13
    mask, pos = llama.causal_mask(1, cache.n)
    step = model(torch.tensor([9]), pos, mask, cache)[0][-1]
    torch.testing.assert_close(step, full_logits(model, prefix + [1, 7, 8, 9])[-1], rtol=1e-4, atol=1e-4)


def test_hidden_state_capture(tiny):
    model, _ = tiny
    ids = list(range(60, 80))
    cache = model.new_cache(32)
    mask, pos = llama.causal_mask(len(ids), 0)
    L = model.args.n_layers
    cap = [("attn", 1), ("mlp", 1), ("in", 2), ("in", 0), ("mlp", L - 1)]
    logits, hid = model(torch.tensor(ids), pos, mask, cache, capture=cap)
    assert set(hid) == set(cap) and all(h.shape == (20, 64) for h in hid.values())
    torch.testing.assert_close(hid["in", 2], hid["mlp", 1])  # a block's input is the last output
    torch.testing.assert_close(hid["in", 0], model.model.embed_tokens(torch.tensor(ids)))
    final = model.lm_head(model.model.norm(hid["mlp", L - 1]))
    torch.testing.assert_close(final, logits)


def test_tokenizer_and_chat_format(tiny):
    _, folder = tiny
    tok = llama.Tokenizer(folder)
    text = "def f(x):\n    return x  # ünïcode ✓"
    assert tok.decode(tok.encode(text)) == text
    assert tok.chat("hi") == ("<|im_start|>system\nYou are a test.<|im_end|>\n"
                              "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.prompt_ids("hi")
    assert ids[0] == tok.tok.token_to_id("<|im_start|>") and ids.count(tok.tok.token_to_id("<|im_end|>")) == 2
    assert tok.tok.token_to_id("<|im_end|>") in tok.eos_ids
    # The system prompt as transformers' apply_chat_template inserts it, from the shapes of
    # real templates: Qwen2.5's (a spliced system turn first, jinja-escaped newlines) and
    # SmolLM2's (real newlines).
    qwen = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
            "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Q.<|im_end|>\\n' }}{%- endif %}")
    smol = "{{ '<|im_start|>system\nYou are S, by H<|im_end|>\n' }}{{'<|im_start|>' + message['role']}}"
    assert llama.default_system(qwen) == "You are Q."
    assert llama.default_system(smol) == "You are S, by H"
    assert llama.default_system("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>' }}") is None
    tok.chat_format = "llama3"
    assert tok.chat("hi", system="S") == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        llama.Model.from_pretrained(tmp_path / "nope")
    folder = make_checkpoint(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="config.json: unsupported architecture 'GPT2LMHeadModel'"):
        llama.Model.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 100}))
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.gate_proj.weight' has shape \(128, 64\)"):
        llama.Model.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        llama.Model.from_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json: file not found"):
        llama.Model.from_pretrained(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json: file not found"):
        llama.Tokenizer(folder)


def test_config_without_architectures_falls_back_on_model_type(tmp_path):
    """A config.json whose architectures is null or missing is read by its model_type; one with
    neither is refused in one line that names the file."""
    folder = make_checkpoint(tmp_path / "m")  # qwen2
    ids = list(range(3, 40))
    ref = full_logits(llama.Model.from_pretrained(folder, torch.float32), ids)
    cfg = json.loads((folder / "config.json").read_text())
    for c in ({**cfg, "architectures": None}, {k: v for k, v in cfg.items() if k != "architectures"}):
        (folder / "config.json").write_text(json.dumps(c))
        m = llama.Model.from_pretrained(folder, torch.float32)
        assert m.args.arch == "Qwen2ForCausalLM"
        torch.testing.assert_close(full_logits(m, ids), ref, rtol=0, atol=0)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                    if k not in ("architectures", "model_type")}))
    with pytest.raises(ValueError, match="config.json: unsupported architecture 'model_type None, "
                                         "no architectures'") as e:
        llama.Model.from_pretrained(folder)
    assert "\n" not in str(e.value)


def test_sharded_checkpoint(tmp_path):
    folder = make_checkpoint(tmp_path / "m")
    from safetensors.torch import load_file
    t = load_file(str(folder / "model.safetensors"))
    keys = sorted(t)
    save_file({k: t[k] for k in keys[::2]}, str(folder / "a.safetensors"))
    save_file({k: t[k] for k in keys[1::2]}, str(folder / "b.safetensors"))
    (folder / "model.safetensors").unlink()
    wm = {k: "a.safetensors" if i % 2 == 0 else "b.safetensors" for i, k in enumerate(keys)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    model = llama.Model.from_pretrained(folder, torch.float32)
    torch.testing.assert_close(model.lm_head.weight, t["model.embed_tokens.weight"])


def test_int8_weights(tiny, monkeypatch):
    """Int8Linear keeps each weight within half a step (s / 2) of W and, on a CPU, rounds each
    row of x to a * X with its own a, then computes a * (X @ Q.T) * s with exact integer
    products: a row's result is the same whatever rows come with it (a draft step's one row,
    a catch-up's few, a prefill's many). Its rows() cut is those rows; a quantized model is the
    model with those two roundings at every Linear (biases and the embedding as they were)."""
    model, folder = tiny
    lin = model.model.layers[0].self_attn.q_proj  # Qwen-style: it has a bias
    q = llama.Int8Linear.quantize(lin)
    assert q.weight.dtype == torch.int8 and q.scales.shape == (lin.out_features,)
    w = q.weight.float() * q.scales[:, None]
    assert ((w - lin.weight).abs() <= q.scales[:, None] / 2 + 1e-7).all()
    x = torch.randn(80, lin.in_features, generator=torch.Generator().manual_seed(3))
    a = x.abs().amax(1, keepdim=True) / 127
    X = (x / a).round()
    ref = (X.double() @ q.weight.double().T) * a.double() * q.scales.double() + lin.bias.double()
    y = q(x)
    torch.testing.assert_close(y, ref.float(), rtol=1e-6, atol=1e-6)
    for T in (1, 2, 7, 20):  # rows alone or together: bit for bit
        assert torch.equal(q(x[:T]), y[:T]) and torch.equal(q(x[T:T + 1]), y[T:T + 1])
    # and it stays within the two roundings' reach: |x - aX| <= a / 2, |W - sQ| <= s / 2
    err, reach = (y - lin(x)).abs(), a / 2 * w.abs().sum(1) + x.abs().sum(1, keepdim=True) * q.scales / 2
    assert err.max() > 1e-4 and (err <= reach + 1e-5).all()
    assert q(x.bfloat16()).dtype == torch.bfloat16
    ids = torch.tensor([3, 0, 7])
    torch.testing.assert_close(q.rows(ids)(x), y[:, ids])
    torch.testing.assert_close(lin.rows(ids)(x), lin(x)[:, ids])
    m8 = llama.Model.from_pretrained(folder, torch.float32, int8=True)
    assert m8.dtype == torch.float32 and not any(isinstance(m, llama.Linear) for m in m8.modules())
    assert sum(isinstance(m, llama.Int8Linear) for m in m8.modules()) == 7 * model.args.n_layers + 1
    # The same model as float32 products of the rounded rows and weights: (a X) @ (s Q).T
    deq = llama.Model.from_pretrained(folder, torch.float32)
    for m in deq.modules():
        if isinstance(m, llama.Linear):  # a new Parameter: a tied embedding keeps its own
            q = llama.Int8Linear.quantize(m)
            m.weight = torch.nn.Parameter(q.weight.float() * q.scales[:, None], requires_grad=False)
    ids = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    got = full_logits(m8, ids)
    with monkeypatch.context() as mp:
        def rounded_rows(self, x):
            a = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
            return torch.nn.functional.linear((x / a).round() * a, self.weight, self.bias)
        mp.setattr(llama.Linear, "forward", rounded_rows)
        torch.testing.assert_close(got, full_logits(deq, ids), rtol=1e-4, atol=1e-3)
    assert (got - full_logits(model, ids)).abs().max() > 1e-3  # and the rounding did happen


def test_draft_quant_auto_is_int8_only_where_the_cpu_multiplies_int8(monkeypatch):
    """--draft-quant auto: int8 weights on a CPU with VNNI, the target's dtype on one without
    (where torch._int_mm is slower than float32) and off a CPU."""
    for vnni in (True, False):
        monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda v=vnni: v, raising=False)
        assert switchsd.quant_of("auto") == ("int8" if vnni else "none")
        assert switchsd.quant_of("auto", "meta") == "none" and switchsd.quant_of("int8") == "int8"


def test_linear_blocks_few_rows_without_changing_them(tiny, monkeypatch):
    """2-15 float32 rows are multiplied by blocks of weight rows (not by F.linear, whose MKL
    path streams the weights once per few rows), with the bias where the layer has one, and
    come back as the same T rows as one row at a time; other widths, and a layer whose rows
    do not split into blocks, go to F.linear as they are."""
    model = tiny[0]
    was = model.exact
    model.set_exact(False)  # the fast kernels; exact ones pad every product instead
    q = model.model.layers[0].self_attn.q_proj
    odd = llama.Linear(q.in_features, 33)  # 33 rows: no whole blocks
    assert q.bias is not None  # Qwen2: q/k/v carry a bias
    widths = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: widths.append(len(x)) or real(x, w, b))
    for lin in (q, tiny[0].model.layers[0].mlp.gate_proj, odd):
        for T in (1, 2, 3, 4, 9, 15, 16, 21):
            widths.clear()
            x = torch.randn(T, lin.in_features)
            y = lin(x)
            assert y.shape == (T, lin.out_features) and (widths == [T]) == (lin is odd or not 1 < T < 16)
            torch.testing.assert_close(y, torch.cat([real(r[None], lin.weight, lin.bias) for r in x]),
                                       rtol=1e-5, atol=1e-5)
    model.set_exact(was)


def test_default_dtype_follows_the_hardware(monkeypatch, tiny):
    """bf16 on CUDA and on a CPU that computes in it (AVX512-bf16 or AMX), float32 on one that
    would convert every weight; a checkpoint loaded without a dtype gets it."""
    for bf16, amx, want in [(True, False, torch.bfloat16), (False, True, torch.bfloat16),
                            (False, False, torch.float32)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        assert llama.default_dtype("cpu") == want and llama.default_dtype("cuda") == torch.bfloat16
        assert switchsd.dtype_of("auto") == want and switchsd.dtype_of("float32") == torch.float32
        assert llama.Model.from_pretrained(tiny[1]).dtype == want


# ---------------------------------------------------------------------------------------
# data.py: copy labels, surface scores, reference text
# ---------------------------------------------------------------------------------------

def test_copy_labels_match_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randrange(1, 45)
        ids = [rng.randrange(rng.choice([2, 3, 8])) for _ in range(n)]
        start, kappa = rng.randrange(n), rng.randrange(1, 7)
        assert data.copy_labels(ids, start, kappa).tolist() == brute_labels(ids, start, kappa)


def test_surface_scores_match_brute_force_and_imply_the_label():
    """The longest earlier-occurring suffix ending at j, checked by search; a score >= kappa
    (the kappa-gram condition) always lies inside a labelled copy span."""
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randrange(1, 40)
        ids = [rng.randrange(rng.choice([2, 3, 8])) for _ in range(n)]
        start, kappa, longest = rng.randrange(n), rng.randrange(1, 6), rng.randrange(1, 9)
        want = [max([L for L in range(1, min(longest, j + 1) + 1)
                     if any(ids[a:a + L] == ids[j - L + 1:j + 1] for a in range(j - L + 1))], default=0)
                for j in range(start, n)]
        got = data.surface_scores(ids, start, longest)
        assert got.tolist() == want
        if kappa <= longest:
            assert (data.copy_labels(ids, start, kappa)[got >= kappa] == 1).all()
    r = probe_mod.surface_report(np.array([0, 1, 5, 6]), np.array([0, 1, 1, 1]), 5)
    assert r["surface_auc"] == 1.0 and r["kgram_precision"] == 1.0 and r["kgram_recall"] == pytest.approx(2 / 3)


def test_reference_text_for_heads(tiny):
    tok = llama.Tokenizer(tiny[1])
    rows = data.reference_text(tok, n=20, length=64)
    assert [r["kind"] for r in rows] == ["text-code"] * 10 + ["text-prose"] * 10
    assert len({r["id"] for r in rows}) == 20
    assert [i for i, r in enumerate(rows) if r["split"] == "val"] == [9, 19]  # a head can train on text alone
    assert all(32 <= len(r["output_ids"]) <= 64 for r in rows)
    # An assistant turn of the chat format, so the target's features are those it decodes with.
    assert rows[0]["prompt_ids"] == tok.prompt_ids("Show me a piece of Python's standard library.")
    assert tok.decode(rows[0]["output_ids"]).startswith("```python\n")
    assert rows == data.reference_text(tok, n=20, length=64)  # deterministic: features resume


# ---------------------------------------------------------------------------------------
# drafters.py: copy retrieval, PLD and CopySpec, the EAGLE-3 loader and trainer
# ---------------------------------------------------------------------------------------

def test_kgram_index_matches_brute_force():
    rng = random.Random(0)
    for trial in range(30):
        kappa, width, depth = rng.randrange(1, 5), rng.randrange(1, 5), rng.randrange(1, 8)
        d = CopyDrafter(CopyConfig(kappa, width, depth))
        ctx = []
        for _ in range(120):  # grow the context one token at a time, as decoding does
            ctx.append(rng.randrange(3 if trial % 2 else 6))
            want = brute_candidates(ctx, kappa, width, depth) if len(ctx) >= kappa else []
            assert d.matches(ctx) == bool(want)
            tree = d.propose(ctx, depth)
            got = [] if tree is None else tree.paths()
            assert sorted(got) == sorted(c for c in want if not any(
                o != c and o[:len(c)] == c for o in want))  # a prefix of another is merged


def test_match_at_the_very_end_of_the_context():
    d = CopyDrafter(CopyConfig(kappa=3, width=4, depth=20))
    ctx = [9, 1, 1, 1, 1]  # (1,1,1) ended one token ago: the continuation is just [1]
    assert d.propose(ctx, 20).paths() == [[1]]
    ctx = [5, 6, 7, 8, 5, 6, 7]  # the earlier occurrence's continuation runs into the present
    assert CopyDrafter(CopyConfig(3, 4, 20)).propose(ctx, 20).paths() == [[8, 5, 6, 7]]
    assert CopyDrafter(CopyConfig(3, 4, 20)).propose(ctx, 2).tokens == [7, 8, 5]  # cut to the budget


def test_copy_tree_is_cut_to_its_rows():
    # three candidates after the 2-gram (1, 2), most recent first: 7s, then 5s, then 6s
    ctx = [1, 2, *[6] * 8, 0, 1, 2, *[5] * 8, 0, 1, 2, *[7] * 8, 0, 1, 2]
    whole = CopyDrafter(CopyConfig(kappa=2, width=3, depth=6, rows=100)).propose(ctx, 6)
    assert whole.paths() == [[7] * 6, [5] * 6, [6] * 6] and len(whole) == 19
    cut = CopyDrafter(CopyConfig(kappa=2, width=3, depth=6, rows=10)).propose(ctx, 6)
    assert len(cut) == 10 and cut.paths() == [[7] * 6, [5] * 3]  # the first whole, the second cut, no third
    shared = Tree.trie(0, [[1, 2, 3], [1, 2, 4], [1, 5]], size=4)
    assert shared.paths() == [[1, 2, 3]]  # a shared prefix takes no room; [1, 2, 4] finds none left


def test_pld_and_copyspec_follow_their_papers():
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2, 3, 40, 1, 2, 3]
    assert PromptLookup().propose(ctx, 20).tokens == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    short = [1, 2, 3, 9, 9, 1, 2, 3]  # a match without 10 following tokens is skipped
    assert PromptLookup().propose(short, 20) is None
    cs = CopySpec()
    assert cs.propose(ctx, 20).tokens == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]  # first occurrence
    assert cs.propose(ctx + [77], 20) is None


def test_eagle3_loader_official_layout_and_variants(copier_model, tmp_path):
    m = copier_model
    for fmt, prefix in (("safetensors", "midlayer."), ("bin", "midlayer."), ("safetensors", "layers.0.")):
        folder, state = make_eagle(tmp_path / f"{fmt}-{prefix}", m, draft_vocab=16, fmt=fmt, prefix=prefix)
        head = drafters.Eagle3Head.load(folder, m)
        assert head.fc.weight.shape == (m.args.dim, 3 * m.args.dim)
        assert head.midlayer.self_attn.q_proj.weight.shape == (4 * 24, 2 * m.args.dim)  # head_dim from config
        assert head.lm_head.weight.shape == (16, m.args.dim)
        torch.testing.assert_close(head.midlayer.mlp.down_proj.weight, state[prefix + "mlp.down_proj.weight"])
        assert (torch.arange(16) + head.d2t).tolist() == list(range(0, 32, 2))
    folder, state = make_eagle(tmp_path / "nod2t", m)  # equal vocabularies: d2t may be absent
    del state["d2t"]
    save_file(state, str(folder / "model.safetensors"))
    assert drafters.Eagle3Head.load(folder, m).d2t.abs().sum() == 0
    folder, state = make_eagle(tmp_path / "nod2t16", m, draft_vocab=16)
    del state["d2t"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="no d2t, and draft_vocab_size 16 differs"):
        drafters.Eagle3Head.load(folder, m)
    state["d2t"] = torch.zeros(16, dtype=torch.long)
    state["d2t"][1] = -1  # draft ids 0 and 1 both -> target id 0: q would not be the proposal's
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="nod2t16: d2t maps draft ids 0 and 1 to the same target id 0") as e:
        drafters.Eagle3Head.load(folder, m)
    assert "\n" not in str(e.value)
    state["d2t"] = torch.zeros(16, dtype=torch.long)
    state["fc.weight"] = torch.zeros(m.args.dim, 3 * m.args.dim + 3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="fc.weight takes 387 features"):
        drafters.Eagle3Head.load(folder, m)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "target_fingerprint": "0123456789abcdef"}))
    with pytest.raises(ValueError, match="this head was trained for another target"):
        drafters.Eagle3Head.load(folder, m)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        drafters.Eagle3Head.load(folder, m)


def test_draft_vocabulary_restricts_proposals(neural_setup):
    """vocab=N: drafted tokens come from ids < N and the context only; without it they do not."""
    draft = neural_setup[1]
    outside = {0: 0, 4: 0}
    for vocab in outside:
        d = drafters.DraftModel(draft, sps(gamma=4, vocab=vocab))
        for seed, prompt in enumerate(repetitive_prompts(6, seed=3)):
            prompt = [t for t in prompt if t % 3]  # leave some ids out of the context
            d.reset(len(prompt) + 8)
            tree = d.propose(prompt, 4, 20.0, 1.0, torch.Generator().manual_seed(seed))  # near-uniform q
            outside[vocab] += sum(t >= vocab and t not in prompt for t in tree.tokens[1:])
    assert outside[4] == 0 and outside[0] > 0, outside


def test_eagle3_training_unroll_matches_inference_drafting(neural_setup):
    """The training-time test (drafters.unroll) computes exactly what chain drafting does:
    run on the drafter's own proposals, its argmax at every step is that proposal."""
    target, _, head, _ = neural_setup
    prompt = repetitive_prompts(1, seed=21)[0]
    d = drafters.Eagle3(head, target, eagle(gamma=4))
    d.reset(len(prompt) + 8)
    L = target.args.n_layers
    with torch.inference_mode():
        mask, pos = llama.causal_mask(len(prompt) - 1, 0)
        _, hid = target(torch.tensor(prompt[:-1]), pos, mask, target.new_cache(len(prompt)), d.capture)
        d.observe(hid)
        drafted = d.propose(prompt, 4, 0.0, 1.0, None).tokens[1:]
        feats = torch.cat([hid[c] for c in d.capture], -1)
        logits = drafters.unroll(head, target.model.embed_tokens, feats, prompt + drafted, 4)
    j = len(prompt) - 2  # the row of the last real position
    got = [int(lg[j].argmax()) + int(head.d2t[int(lg[j].argmax())]) for lg in logits]
    assert got == drafted


def test_eagle3_trainer_fits_a_sequence(neural_setup, tmp_path):
    target = neural_setup[0]
    prompt = repetitive_prompts(1, seed=5)[0]
    ids = prompt + switchsd.generate(target, prompt, max_new_tokens=30).output_ids  # self-distillation
    cfg = eagle_config(target, target.args.vocab_size)
    torch.manual_seed(0)
    head = drafters.Eagle3Head(cfg, target.args.dim).float()
    with torch.inference_mode():
        mask, pos = llama.causal_mask(len(ids), 0)
        logits, hid = target(torch.tensor(ids), pos, mask, target.new_cache(len(ids)), [("in", 2), ("in", 2), ("in", 1)])
    feats = torch.cat([hid["in", 2], hid["in", 2], hid["in", 1]], -1)
    top_logits, top_ids = logits.topk(8, dim=-1)
    ex = {"tokens": ids, "prompt_len": len(prompt), "feats": feats, "top_logits": top_logits, "top_ids": top_ids}
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = drafters.eagle3_loss(head, target.model.embed_tokens, ex, steps=3)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]
    assert drafters.acceptance_length(head, target.model.embed_tokens, [ex], 3, head.d2t) > 2.0


def test_eagle3_trainer_cli_writes_and_continues_a_head(tmp_path):
    src = make_checkpoint(tmp_path / "t", max_position_embeddings=4096)
    target = llama.Model.from_pretrained(src, torch.float32)
    rows = []
    for i, prompt in enumerate(repetitive_prompts(6, seed=7)):
        out = switchsd.generate(target, prompt, max_new_tokens=12).output_ids
        rows.append({"id": f"x{i}", "kind": "test", "split": "val" if i < 2 else "train",
                     "prompt_ids": prompt, "output_ids": out})
    comps = tmp_path / "c.jsonl"
    comps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train-eagle3", "--model", str(src), "--completions", str(comps), "--draft-vocab", "16",
            "--steps", "3", "--eval-every", "3", "--intermediate", "32"]
    drafters.main(args + ["--work", str(tmp_path / "w"), "--out", str(tmp_path / "h1")])
    first = drafters.Eagle3Head.load(tmp_path / "h1", target)
    assert first.args.vocab_size == 16
    # Continuing keeps the draft vocabulary and starts from the saved weights.
    drafters.main(args + ["--steps", "0", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "h2"),
                          "--init", str(tmp_path / "h1")])
    second = drafters.Eagle3Head.load(tmp_path / "h2", target)
    assert torch.equal(first.d2t, second.d2t)
    assert torch.equal(first.fc.weight, second.fc.weight)
    with pytest.raises(SystemExit):  # neither completions nor reference text: nothing to train on
        drafters.main(["train-eagle3", "--model", str(src), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "h4")])
    with pytest.raises(ValueError, match="MLP width"):
        drafters.main(args[:-2] + ["--steps", "0", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "h3"),
                                   "--init", str(tmp_path / "h1")])


# ---------------------------------------------------------------------------------------
# switchsd.py: acceptance, the decode loop with every method, the probe's read-out, the CLI
# ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_tree_acceptance_is_lossless():
    """Sampling through a trie of copied candidates (and a drafted chain) emits tokens
    with exactly the target's conditionals, however the drafts are chosen."""
    V, g = 6, torch.Generator().manual_seed(0)
    qs = [torch.softmax(torch.randn(V, generator=g), 0) for _ in range(2)]

    def sps_chain():  # a neural draft: each token sampled from its q
        return Tree.chain(0, [torch.multinomial(q, 1, generator=g).item() for q in qs], q=qs)

    copied = Tree.trie(0, [[1, 2], [1, 3], [2, 4], [3]])  # root children 1, 2, 3; node 1 has 2, 3
    for make in (lambda: copied, sps_chain):
        logits = torch.randn(3, V, generator=g)  # a node's logits depend on its depth only here
        target = [torch.softmax(l / 0.9, 0) for l in logits]
        n, first, second = 20000, {}, {}
        for _ in range(n):
            t = make()
            depth = [0] * len(t)
            for i in range(1, len(t)):
                depth[i] = depth[t.parents[i]] + 1
            path, bonus = switchsd.accept(logits[depth], t, 0.9, 1.0, g)
            toks = [t.tokens[i] for i in path] + [bonus]
            first[toks[0]] = first.get(toks[0], 0) + 1
            if path:  # the token after an accepted first node follows the depth-1 conditional
                second[toks[1]] = second.get(toks[1], 0) + 1
        draws_match(first, {x: target[0][x].item() for x in range(V)}, n)
        m = sum(second.values())
        assert m > 1000
        draws_match(second, {x: target[1][x].item() for x in range(V)}, m)


def test_zero_residual_falls_back_to_p():
    """Rejecting a draft where p <= q everywhere leaves max(0, p - q) without mass (q == p up to
    rounding, in practice): the bonus token is then drawn from p itself, not from 0 / 0."""
    logits = torch.tensor([1.0, 0.5, -1.0, 0.2]).repeat(2, 1)  # the root's row and the child's
    p = torch.softmax(logits[0], 0)
    q = p.clone()
    q[1] += 1.0  # p - q <= 0 everywhere; the draft is rejected with probability 1 - p(1) / q(1)
    tree = Tree.chain(5, [1], q=[q])
    g, counts, n = torch.Generator().manual_seed(0), {}, 0
    for _ in range(3000):
        path, bonus = switchsd.accept(logits, tree, 1.0, 1.0, g)
        if not path:
            counts[bonus] = counts.get(bonus, 0) + 1
            n += 1
    assert n > 2000
    draws_match(counts, {x: p[x].item() for x in range(4)}, n)


def test_ar_greedy_matches_recomputation(tiny):
    model, _ = tiny
    prompt = list(range(30, 45))
    res = switchsd.generate(model, prompt, max_new_tokens=25)
    assert res.output_ids == ar_reference(model, prompt, 25)
    assert res.stop == "length" and len(res.steps) == 25


def test_verify_reports_the_targets_confidence_in_each_token(tiny):
    """verify's last value, which CostSwitch's forecast reads: the target's top-token
    probability at the root and at each accepted row, as a full forward computes it."""
    model, _ = tiny
    prompt = list(range(30, 45))
    out = ar_reference(model, prompt, 5)
    cache = model.new_cache(64)
    mask, pos = llama.causal_mask(len(prompt) - 1, 0, model.device)
    model(torch.tensor(prompt[:-1]), pos, mask, cache, logits_at=slice(0, 0), exact=False)
    wrong = (out[4] + 1) % model.args.vocab_size
    path, bonus, _, top = switchsd.verify(model, cache, Tree.chain(prompt[-1], out[:4] + [wrong]), 0.0, 1.0, None)
    assert len(path) == 4 and bonus == out[4]
    p = full_logits(model, prompt + out[:4])[len(prompt) - 1:].float().softmax(-1)
    assert top == pytest.approx(p.amax(-1).tolist(), abs=1e-5)


def test_prompt_over_context_is_refused(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="prompt is 600 tokens; the model's context is 512"):
        switchsd.generate(model, [5] * 600)


def test_generation_stops_at_context_limit(tiny):
    model, _ = tiny
    res = switchsd.generate(model, [5] * 500, max_new_tokens=50)
    assert res.stop == "context" and len(res.output_ids) == 12


def test_copy_methods_greedy_match_ar(copier_model, tiny):
    taxed = accepted = partial = 0
    for model, prompts in ((copier_model, repetitive_prompts(6)),
                           (tiny[0], repetitive_prompts(2, V=200, seed=1))):
        for prompt in prompts:
            ref = switchsd.generate(model, prompt, max_new_tokens=50).output_ids
            for method, make in METHODS:
                res = switchsd.generate(model, prompt, method, make(), max_new_tokens=50)
                assert res.output_ids == ref, method
                copies = [s for s in res.steps if s.path == "copy"]
                taxed += sum(s.accepted == 0 for s in copies)
                accepted += sum(s.accepted for s in copies)
                partial += sum(0 < s.accepted < s.drafted - 1 for s in copies)
    assert taxed > 10 and accepted > 500 and partial > 10  # acceptance really was exercised


def test_candidates_longer_than_the_budget(copier_model):
    prompt = repetitive_prompts(1, seed=3)[0]
    for n in (1, 2, 3, 7):
        ref = switchsd.generate(copier_model, prompt, max_new_tokens=n).output_ids
        res = switchsd.generate(copier_model, prompt, "copy", CopyDrafter(CopyConfig(2, 4, 20)), max_new_tokens=n)
        assert res.output_ids == ref and len(ref) == n


def test_copy_at_the_context_limit(copier_model):
    prompt = (repetitive_prompts(1, seed=4)[0] * 30)[:500]  # the model's limit is 512
    ref = switchsd.generate(copier_model, prompt, max_new_tokens=40)
    res = switchsd.generate(copier_model, prompt, "copy", CopyDrafter(CopyConfig(2, 4, 20)), max_new_tokens=40)
    assert res.output_ids == ref.output_ids and len(ref.output_ids) == 12
    assert res.stop == ref.stop == "context" and max(s.accepted for s in res.steps) > 1


def test_eos_inside_a_candidate(copier_model):
    prompt = repetitive_prompts(1, seed=5)[0]
    free = switchsd.generate(copier_model, prompt, max_new_tokens=40).output_ids
    # free[12]: a token the model emits mid-run, most likely inside a copied span; free[7]: the
    # first time it emits 17, inside a copied candidate that goes on past it (PLD, CopySpec)
    ran_past = 0
    for eos in (free[12], free[7]):
        ref = switchsd.generate(copier_model, prompt, max_new_tokens=40, stop_ids={eos})
        assert ref.stop == "eos" and ref.output_ids[-1] == eos
        for method, make in METHODS:
            res = switchsd.generate(copier_model, prompt, method, make(), max_new_tokens=40, stop_ids={eos})
            assert res.output_ids == ref.output_ids and res.stop == "eos"
            # The steps record what was emitted: the run without the stop token takes the same
            # steps up to the last, whose accepted tokens are cut at the stop token.
            run = switchsd.generate(copier_model, prompt, method, make(), max_new_tokens=40).steps[:len(res.steps)]
            last, emitted = res.steps[-1], len(res.output_ids) - sum(s.accepted + 1 for s in res.steps[:-1])
            assert [(s.path, s.drafted, s.accepted) for s in res.steps[:-1]] == \
                [(s.path, s.drafted, s.accepted) for s in run[:-1]], method
            assert last.accepted == min(run[-1].accepted, emitted), (method, eos)
            ran_past += run[-1].accepted > last.accepted
    assert ran_past > 0  # a copied candidate did run past the stop token


@pytest.mark.slow
def test_copy_sampling_is_lossless_end_to_end(tmp_path):
    """Through the whole loop: the first two sampled tokens, drawn with copy verification,
    follow the target's joint distribution computed by enumeration (vocabulary of 8)."""
    model = llama.Model.from_pretrained(make_checkpoint(tmp_path / "m", vocab_size=8, scale=0.5),
                                        torch.float32)
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3]
    p1 = torch.softmax(full_logits(model, prompt)[-1], 0)
    joint = {(a, b): p1[a].item() * torch.softmax(full_logits(model, prompt + [a])[-1], 0)[b].item()
             for a in range(8) for b in range(8)}
    n, counts = 2000, {}
    for seed in range(n):
        res = switchsd.generate(model, prompt, "copy", CopyDrafter(CopyConfig(2, 3, 4)), max_new_tokens=2,
                                temperature=1.0, seed=seed)
        key = tuple(res.output_ids)
        counts[key] = counts.get(key, 0) + 1
    assert sum(s.path == "copy" for s in res.steps) > 0
    draws_match(counts, joint, n)


def test_neural_drafters_greedy_match_ar(neural_setup):
    target = neural_setup[0]
    accepted, stopped = 0, {"sps-stop": 0, "eagle3-stop": 0}
    for prompt in repetitive_prompts(4, seed=7):
        ref = switchsd.generate(target, prompt, max_new_tokens=40).output_ids
        for name, make in neural_drafters(neural_setup):
            for method, copier in ((name.split("-")[0], None), ("copyspec", CopySpec()), ("copy", CopyDrafter(CopyConfig(3, 2, 8)))):
                d = make()
                res = switchsd.generate(target, prompt, method, copier, d, max_new_tokens=40)
                assert res.output_ids == ref, (name, method)
                accepted += sum(s.accepted for s in res.steps if s.path == "neural")
                if name in stopped:  # chains cut short by the drafter's doubt, not by the budget
                    done = 0  # tokens emitted before the step
                    for s in res.steps:
                        chain = s.drafted // getattr(d, "topk", 1)  # EAGLE-3: k tokens per depth
                        stopped[name] += s.path == "neural" and chain < min(d.gamma, 39 - done)
                        done += s.accepted + 1
    assert accepted > 100 and min(stopped.values()) > 0, stopped


def test_lazy_propagation_matches_a_rebuilt_drafter(neural_setup):
    target = neural_setup[0]
    L = target.args.n_layers
    for seed, prompt in enumerate(repetitive_prompts(3, seed=11)):
        for name, make in neural_drafters(neural_setup):
            d = make()
            res = switchsd.generate(target, prompt, "copy", RandomCopier(seed), d, max_new_tokens=30)
            kinds = {s.path for s in res.steps[:-1]}  # the last step has no room to draft: "ar"
            assert kinds == {"copy", "neural"}, kinds
            ctx = prompt + res.output_ids
            g = torch.Generator().manual_seed(0)
            lagging = d.propose(ctx, 4, 0.0, 1.0, g)
            fresh = make()
            fresh.reset(len(ctx) + 8)
            with torch.inference_mode():  # the features a fresh drafter sees: one prefill
                cap = fresh.capture
                mask, pos = llama.causal_mask(len(ctx) - 1, 0)
                _, hid = target(torch.tensor(ctx[:-1]), pos, mask, target.new_cache(len(ctx)), cap)
                fresh.observe(hid)
                rebuilt = fresh.propose(ctx, 4, 0.0, 1.0, g)
            assert lagging.tokens == rebuilt.tokens, name


def test_sps_draft_with_a_smaller_vocabulary(tmp_path):
    """A draft with fewer vocabulary rows than its target (the 0.5B Qwen2.5-Coder, 151,936,
    drafting for the 7B, 152,064): its q lives on the target's vocabulary, zero on the rows it
    lacks, and an id it has no row for (in the prompt, or the target's own token) is read as
    its last row, never looked up out of range. Greedy equals AR, sampling gets past rejections."""
    src = make_checkpoint(tmp_path / "t", vocab_size=8, scale=0.5)
    target = llama.Model.from_pretrained(src, torch.float32)
    draft = switchsd.load_draft(cut_vocab(tmp_path / "d", src, 6, 0.3), target, llama.Tokenizer(src),
                                torch.float32, "cpu", "none")
    assert (draft.args.vocab_size, target.args.vocab_size) == (6, 8)
    prompt = [1, 2, 6, 3, 7, 4, 5]  # 6 and 7: ids the draft has no row for
    ref = switchsd.generate(target, prompt, max_new_tokens=30).output_ids
    assert {6, 7} & set(ref)  # the target emits them too
    for cfg in (sps(gamma=3), sps(gamma=3, vocab=4, topk=2)):  # the whole vocabulary; a cut head
        _, neural = switchsd.make_drafters("sps", target, draft=draft, sps=cfg)
        neural.reset(64)
        tree = neural.propose(prompt, 3, 1.0, 1.0, torch.Generator().manual_seed(0))
        assert all(q.shape == (8,) and q[6:].sum() == 0 for q in tree.q[1:])
        res = switchsd.generate(target, prompt, "sps", None, neural, max_new_tokens=30)
        assert res.output_ids == ref and sum(s.accepted for s in res.steps) > 0
        rejected = 0
        for seed in range(10):
            res = switchsd.generate(target, prompt, "sps", None, neural, max_new_tokens=12, temperature=1.0, seed=seed)
            rejected += sum(s.accepted < s.drafted for s in res.steps)
        assert rejected > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind,gamma,threshold,temperature",
                         [("sps", 2, 0.0, 1.0), ("sps", 3, 0.7, 4.0), ("sps-vocab", 2, 0.0, 1.0),
                          ("sps-int8", 2, 0.0, 1.0), ("sps-small", 2, 0.0, 1.0),
                          ("eagle3", 2, 0.0, 1.0), ("eagle3", 3, 0.7, 4.0)])
def test_neural_sampling_is_lossless(tmp_path, kind, gamma, threshold, temperature):
    src = make_checkpoint(tmp_path / "t", vocab_size=8, scale=0.5)
    target = llama.Model.from_pretrained(src, torch.float32, exact=False)  # the rule's law, whatever the kernels: 2,000 runs
    if kind.startswith("sps"):  # sps-vocab: drafts among ids 0-1 and the prompt's 1-5, not 6-7
        # sps-small: a draft with rows for ids 0-5 only; q is zero on 6-7, p is not
        folder = cut_vocab(tmp_path / "d", src, 6, 0.5) if kind == "sps-small" else noisy_copy(tmp_path / "d", src, 0.5)
        draft = llama.Model.from_pretrained(folder, torch.float32, int8=kind == "sps-int8", exact=False)
        _, neural = switchsd.make_drafters("sps", target, draft=draft, sps=sps(
            gamma=gamma, threshold=threshold, vocab=2 if kind == "sps-vocab" else 0,
            topk=2))  # a greedy-only option: sampling must ignore it
        kind = "sps"
    else:  # a head over 6 of the 8 ids: q is zero on the other two, p is not
        head = drafters.Eagle3Head.load(make_eagle(tmp_path / "e", target, draft_vocab=6)[0], target)
        neural = drafters.Eagle3(head, target, eagle(gamma=gamma, topk=1, threshold=threshold))
    prompt, T = [1, 2, 3, 4, 5], temperature
    p1 = torch.softmax(full_logits(target, prompt)[-1] / T, 0)
    joint = {(a, b): p1[a].item() * torch.softmax(full_logits(target, prompt + [a])[-1] / T, 0)[b].item()
             for a in range(8) for b in range(8)}
    n, counts, cut = 2000, {}, 0
    for seed in range(n):  # three new tokens: the first step drafts up to two, the joint of which we test
        res = switchsd.generate(target, prompt, kind, None, neural, max_new_tokens=3, temperature=T, seed=seed)
        counts[tuple(res.output_ids[:2])] = counts.get(tuple(res.output_ids[:2]), 0) + 1
        cut += res.steps[0].drafted < 2
    draws_match(counts, joint, n)
    assert (cut > n // 4) == (threshold > 0)  # the threshold variant does stop drafts early


@pytest.mark.slow
def test_every_method_equals_ar_in_bfloat16_at_near_ties(tmp_path):
    """Greedy output of every method equals AR's in bf16, on a target whose top two logits lie
    within bf16's rounding of each other at most steps (each token has a near-twin in the
    output layer): a row computed differently in a verification pass than in a one-token
    step would flip some of them (as torch's own kernels do: docs/performance.md)."""
    src = make_checkpoint(tmp_path / "t", "llama", scale=0.5)
    target = llama.Model.from_pretrained(src, torch.bfloat16)
    assert target.exact  # the default
    draft = llama.Model.from_pretrained(noisy_copy(tmp_path / "d", src, 0.05), torch.bfloat16)
    for m in (target, draft):  # every odd token is its even neighbour's near-twin: a near-tie at most steps
        w = m.lm_head.weight
        w[1::2] = w[0::2][:len(w[1::2])] * (1 + 1e-3 * torch.randn(len(w[1::2]), 1, generator=torch.Generator().manual_seed(0)))
    head = drafters.Eagle3Head.load(make_eagle(tmp_path / "e", target)[0], target)
    probe = switchsd.Probe(torch.zeros(target.args.dim), 0, "attn", 0.5, 2)  # always on
    ar = lambda p: switchsd.generate(target, p, "ar", max_new_tokens=60).output_ids
    ties = 0
    for prompt in repetitive_prompts(6, V=64, seed=2):
        ref = ar(prompt)
        logits = target.forward_sequence(prompt + ref)[0][len(prompt) - 1:-1]
        top2 = logits.topk(2).values
        ties += int((top2[:, 0] - top2[:, 1] <= 2 ** -6).sum())  # within a bf16 step or two
        for method in switchsd.METHODS[1:]:
            for kw in ({"draft": draft}, {"head": head}) if method not in ("pld",) else ({},):
                if method == "sps" and "draft" not in kw or method == "eagle3" and "head" not in kw:
                    continue
                copier, neural = switchsd.make_drafters(method, target, copy=CopyConfig(kappa=2), **kw)
                res = switchsd.generate(target, prompt, method, copier, neural, probe if method == "switchsd" else None,
                                        max_new_tokens=60)
                assert res.output_ids == ref, (method, list(kw))
    assert ties >= 10  # the contexts do produce near-ties


def test_gate_truth_table(copier_model):
    """copy iff probe >= tau AND the kappa-gram recurred; otherwise the neural path."""
    m = copier_model
    prompt = repetitive_prompts(1, seed=9)[0]
    on, off = planted_probe(m, range(32)), planted_probe(m, [])
    for probe, kappa, expect_copy in ((on, 2, True), (on, 40, False), (off, 2, False), (off, 40, False)):
        res = switchsd.generate(m, prompt, "switchsd", CopyDrafter(CopyConfig(kappa, 2, 8)), probe=probe, max_new_tokens=30)
        assert any(s.path == "copy" for s in res.steps) == expect_copy, (probe is on, kappa)
    # a probe firing on chosen tokens: copy steps start exactly after those tokens
    chosen = {3, 7, 11, 19, 23}
    probe = planted_probe(m, chosen)
    res = switchsd.generate(m, prompt, "switchsd", CopyDrafter(CopyConfig(2, 2, 8)), probe=probe, max_new_tokens=40,
                            policy="paper")  # the paper's switch: no neural drafter -> AR steps
    ctx = list(prompt)
    for s in res.steps:
        fired = ctx[-2] in chosen  # the score comes from the last token the target ran
        room = len(ctx) - len(prompt) < 39  # with one token left to emit, nothing is drafted
        assert s.path == ("copy" if fired and room and CopyDrafter(CopyConfig(2)).matches(ctx) else "ar")
        ctx += res.output_ids[len(ctx) - len(prompt):][:s.accepted + 1]


def test_switchsd_and_banditspec_greedy_match_ar(neural_setup):
    """Every switch: banditspec, and switchsd with each policy and gate."""
    target = neural_setup[0]
    copied, paths, spare = 0, set(), 0
    runs = [("banditspec", {})] + [("switchsd", dict(policy=p, gate=g)) for p in switchsd.POLICIES for g in switchsd.GATES]
    for prompt in repetitive_prompts(3, seed=13):
        ref = switchsd.generate(target, prompt, max_new_tokens=40).output_ids
        for _, make in [("ar", lambda: None)] + neural_drafters(neural_setup):
            for method, kw in runs:
                probe = planted_probe(target, range(0, 32, 2))
                copier, _ = switchsd.make_drafters(method, target, copy=CopyConfig(3, 3, 10))  # banditspec: PLD
                res = switchsd.generate(target, prompt, method, copier, make(), probe, max_new_tokens=40, **kw)
                assert res.output_ids == ref, (method, kw)
                copied += sum(s.accepted for s in res.steps if s.path == "copy")
                paths |= {s.path for s in res.steps}
                spare += sum(s.accepted for s in res.steps if s.path == "ar" and method == "switchsd")
                assert all(s.drafted < target.step_rows for s in res.steps if s.path == "ar")
                kinds = switchsd.provenance(res)  # what --show colours: every token has a kind it knows
                assert len(kinds) == len(ref) and set(kinds) <= {"copy", "lookup", "neural", "target"}
                assert kinds.count("lookup") == sum(s.accepted for s in res.steps if s.path in ("ar", "lookup"))
    assert copied > 50 and paths == {"ar", "copy", "lookup", "neural"}
    assert target.step_rows == 4 and spare > 0  # plain steps' spare rows carried the lookup's head


def test_gates_and_their_ablations():
    """probe: score >= tau AND the kappa-gram recurs; kgram: the kappa-gram alone; surface: a
    recurring suffix of SURFACE_MIN tokens, the same length data.surface_scores gives."""
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 5, 6, 7, 8, 9, 10]  # a 6-token repeat
    copier = CopyDrafter(CopyConfig(kappa=3))
    probe = switchsd.Probe(torch.zeros(4), 0, "attn", 0.5, 3)
    assert copier.match_length(ctx, 8) == 6 == data.surface_scores(ctx, len(ctx) - 1, 8)[-1]
    assert copier.match_length(ctx, 5) == 5
    gate = lambda g, c, score=0.0: switchsd.gate_open(g, c, score, copier, probe)
    assert gate("probe", ctx, 0.5) and not gate("probe", ctx, 0.49) and gate("kgram", ctx)
    assert not gate("surface", ctx)  # 6 < SURFACE_MIN
    longer = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 3, 4, 5, 6, 7, 8, 9, 10]  # an 8-token repeat
    assert gate("surface", longer) and copier.match_length(longer, 20) == 8
    unmatched = ctx + [11]
    assert not any(gate(g, unmatched, 1.0) for g in switchsd.GATES)


def test_cost_switch_plays_the_fastest_path():
    """CostSwitch: the lookup scored at every pick without being played, and offered once its
    kind of match has a score; the neural drafter and a plain step tried until measured, the
    drafter's first step (its prefill, a sunk cost) not measured, and the drafter not offered
    before the steps without it have spent its prefill's price; then the best tokens/s, the
    drafter retried when stale; once bought, the drafter's step replaces the plain step."""
    sw = switchsd.CostSwitch(["lookup", "neural", "ar"])
    period, fresh = list(range(100, 120)), iter(range(1000, 10 ** 6))
    ctx, picks = period * 2, []
    for t in range(110):
        repeating = t < 40  # the text repeats `period`, then is novel but for a recurring token
        arm = sw.pick(ctx, 100, on=repeating)
        assert t > 40 or sw.found is not None and sw.lookup.matched == 3  # t = 40 reads t = 39's text
        picks.append(arm)
        # (tokens, seconds): a lookup step 11 tokens while the text repeats (its draft is the
        # repetition), 1 elsewhere, in 1.5 s; neural 3 in 1 s (its first step 30 s: its
        # prefill), 1 in 2 s from t = 70; a plain step 1 in 1 s
        first = not sw.primed
        n, s = {"lookup": (11 if repeating else 1, 1.5), "ar": (1, 1.0),
                "neural": (3, 30.0) if first else (3, 1.0) if t < 70 else (1, 2.0)}[arm]
        sw.update(arm, n, s)
        ctx += ([period[(len(ctx) + i) % 20] for i in range(n)] if repeating else  # novel, ending in a recurring token at every other step
                [next(fresh) for _ in range(n - 1)] + [100 if n > 1 or t % 2 else next(fresh)])
    assert "ar" not in picks  # no price: bought at once, and its step replaces the plain step
    assert picks[:4] == ["neural"] * 4  # its prefill, 2 trials, the best until a lookup has a score
    assert picks[4:36] == ["lookup"] * 32  # 11 tokens per 1.5 s, scored from the earlier steps' text
    assert picks[36] == "neural"  # stale: retried once
    assert picks[40:70] == ["neural"] * 30  # 3 tokens/s beat the lookup's 1 per 1.5 s
    assert sum(n for (on, _), n in sw.n.items() if not on) > 4  # ... scored, not played
    assert picks[85:].count("lookup") >= 10  # the drafter now 1 per 2 s: the lookup wherever it finds one
    sw = switchsd.CostSwitch(["lookup", "ar"])  # no neural drafter, no lookup scored yet
    assert sw.pick(period * 2, 10, True) == "ar"
    # Rent or buy: a drafter whose prefill will cost 4 s, whose step costs 2 plain steps and
    # would emit 5 tokens at best (gamma 4), is first offered once 1 s plain steps (each 0.6 s
    # slower than it at best) have lost that much; at half that loss where the target's
    # confidence forecasts that it pays (0.95: 2.26 tokens per plain step), at twice that
    # where it forecasts that it does not (0.3: 0.71).
    for top, rent in (((), 7), ((0.3,), 14), ((0.95,), 4)):
        sw, picks = switchsd.CostSwitch(["neural", "ar"]), []
        sw.price = 4.0
        sw.measure(4, 0.25)
        for t in range(rent + 2):
            picks.append(sw.pick(period, 10, False))
            sw.update(picks[-1], 1, 1.0, top)
        assert picks == ["ar"] * rent + ["neural"] * 2, top
    for t in range(4):  # once bought it stays, though the forecast turns and it emits less than
        assert sw.pick(period, 10, False) == "neural"  # the plain steps did: its prefill is sunk
        sw.update("neural", 1, 2.0, (0.01,))


@pytest.mark.slow
def test_switchsd_sampling_is_lossless(tmp_path):
    src = make_checkpoint(tmp_path / "t", vocab_size=8, scale=0.5)
    target = llama.Model.from_pretrained(src, torch.float32, exact=False)  # the rule's law, whatever the kernels: 2,000 runs
    draft = drafters.DraftModel(llama.Model.from_pretrained(noisy_copy(tmp_path / "d", src, 0.5), torch.float32, exact=False),
                                sps(gamma=2))
    probe = switchsd.Probe(torch.zeros(64), 0, "attn", 0.5, 2)  # score 0.5 >= tau: always on
    prompt = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    p1 = torch.softmax(full_logits(target, prompt)[-1], 0)
    joint = {(a, b): p1[a].item() * torch.softmax(full_logits(target, prompt + [a])[-1], 0)[b].item()
             for a in range(8) for b in range(8)}
    n, counts = 2000, {}
    for seed in range(n):
        res = switchsd.generate(target, prompt, "switchsd", CopyDrafter(CopyConfig(2, 2, 3)), draft, probe,
                                max_new_tokens=2, temperature=1.0, seed=seed)
        counts[tuple(res.output_ids)] = counts.get(tuple(res.output_ids), 0) + 1
    draws_match(counts, joint, n)


def test_banditspec_consults_the_bandit_at_every_step(copier_model, monkeypatch):
    """BanditSpec as the SwitchSD paper ran it: UCBSpec picks copy or neural at every step, and
    the copy arm drafts whatever PLD's n-gram lookup finds, where no kappa-gram recurs too (it
    is not SwitchSD's gate); when the lookup finds nothing, the copy arm's step is an AR step."""
    picks = []
    pick = switchsd.UCBSpec.pick
    monkeypatch.setattr(switchsd.UCBSpec, "pick", lambda self: picks.append(pick(self)) or picks[-1])
    base = repetitive_prompts(1, seed=17)[0][:30]
    prompt = base + [8, 9, 11, base[2]]  # the last token recurs, its 5-gram does not
    assert not CopyDrafter(CopyConfig(kappa=5)).matches(prompt)
    copier, neural = switchsd.make_drafters("banditspec", copier_model)
    assert isinstance(copier, PromptLookup) and neural is None
    res = switchsd.generate(copier_model, prompt, "banditspec", copier, neural, max_new_tokens=40)
    assert res.output_ids == switchsd.generate(copier_model, prompt, max_new_tokens=40).output_ids
    done = [sum(s.accepted + 1 for s in res.steps[:i]) for i in range(len(res.steps))]
    assert len(picks) == sum(d < 39 for d in done)  # every step with room to draft
    assert picks[:4] == ["copy", "neural", "copy", "neural"]  # the warm-up: each arm twice
    assert [s.path for s in res.steps] == [{"copy": "copy", "neural": "ar"}[a] for a in picks] + ["ar"] * (
        len(res.steps) - len(picks))  # the neural arm without a neural drafter: AR steps
    first = res.steps[0]
    assert first.path == "copy" and first.drafted > 0 and first.accepted > 0  # copied without a kappa-gram


def test_ucbspec_prefers_the_faster_arm():
    """The reward is the round's raw throughput, tokens / seconds. The arm that emits more per
    second wins, and the exploration bonus brings back an arm whose warm-up rounds were unlucky
    (with the authors' shared bonus, the same for every arm, it would never be played again)."""
    b = switchsd.UCBSpec(["copy", "neural"])
    rng = random.Random(0)
    picks = []
    for _ in range(300):
        arm = b.pick()
        picks.append(arm)
        b.update(arm, 3 if arm == "copy" else 1, rng.uniform(0.08, 0.12))  # 30 vs 10 tokens/s
    assert picks[:2] == ["copy", "neural"] and picks[-100:].count("copy") > 90
    b, picks = switchsd.UCBSpec(["copy", "neural"]), []
    for _ in range(300):
        arm = b.pick()
        picks.append(arm)
        unlucky = arm == "copy" and picks.count("copy") <= 2  # 1 token/s in its warm-up, 5 after
        b.update(arm, 1 if unlucky or arm == "neural" else 5, 1.0 if unlucky or arm == "copy" else 0.5)
    assert picks[:4] == ["copy", "neural", "copy", "neural"] and picks[4] == "neural"
    assert picks[-100:].count("copy") > 90


def test_probe_file_round_trip_and_refusals(tiny, copier_model, tmp_path):
    model, _ = tiny
    p = switchsd.Probe(torch.randn(64), 2, "attn", 0.42, 5, switchsd.model_identity(model, "tiny"))
    p.save(tmp_path / "p.safetensors")
    q = probe_mod.Probe.load(tmp_path / "p.safetensors", model)
    assert (q.layer, q.position, q.tau, q.kappa, q.meta) == (2, "attn", 0.42, 5, p.meta)
    torch.testing.assert_close(q.w, p.w)
    with pytest.raises(ValueError, match="probe made for a model with hidden_size 64, this model has 128"):
        probe_mod.Probe.load(tmp_path / "p.safetensors", copier_model)
    other = llama.Model.from_pretrained(make_checkpoint(tmp_path / "o", seed=5), torch.float32)
    with pytest.raises(ValueError, match="probe made for a model with fingerprint"):
        probe_mod.Probe.load(tmp_path / "p.safetensors", other)
    (tmp_path / "bad.safetensors").write_bytes(b"not a probe")
    with pytest.raises(ValueError, match="bad.safetensors: not a probe file"):
        probe_mod.Probe.load(tmp_path / "bad.safetensors")
    with pytest.raises(FileNotFoundError, match="probe file not found"):
        probe_mod.Probe.load(tmp_path / "none.safetensors")


def test_probe_scores_align_with_output_ids(copier_model):
    m = copier_model
    p = switchsd.Probe(torch.randn(m.args.dim, generator=torch.Generator().manual_seed(0)) * 0.3,
                        1, "attn", 0.5, 5)
    prompt = repetitive_prompts(1, seed=2)[0]
    res = switchsd.generate(m, prompt, "copy", CopyDrafter(CopyConfig(2, 3, 8)), probe=p, max_new_tokens=30)
    assert len(res.probe_scores) == len(res.output_ids) and res.probe_scores[-1] is None
    assert max(s.accepted for s in res.steps) > 2  # multi-token steps happened
    ids = prompt + res.output_ids
    ref = probe_mod.teacher_forced_scores(m, p, ids)[len(prompt):len(ids) - 1]
    np.testing.assert_allclose(res.probe_scores[:-1], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_cli_end_to_end(tiny):
    model, folder = tiny
    r = run_cli("--model", str(folder), "--prompt", "hello", "--max-new-tokens", "12",
                "--dtype", "float32", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("prompt_ids", "output_ids", "text", "new_tokens", "seconds",
                "tokens_per_second", "target_forwards"):
        assert key in out
    tok = llama.Tokenizer(folder)
    assert out["prompt_ids"] == tok.prompt_ids("hello")
    assert out["output_ids"] == ar_reference(model, out["prompt_ids"], 12)[:len(out["output_ids"])]
    assert out["text"] == tok.decode(out["output_ids"])
    r = run_cli("--model", str(folder), "--prompt", "hello", "--max-new-tokens", "8",
                "--temperature", "0.8", "--top-p", "0.9", "--no-chat")
    assert r.returncode == 0, r.stderr
    assert "tokens" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args,msg", [
    (["--model", "/nonexistent/dir"], "/nonexistent/dir: no such model folder"),
    (["--prompt-file", "/nonexistent.txt"], "/nonexistent.txt: No such file"),
    (["--prompt-file", "LATIN1"], "latin1.txt: not UTF-8 text"),
    (["--topk", "0"], "--topk 0: must be >= 1"),
    (["--gamma", "0"], "--gamma 0: must be >= 1"),
    (["--gamma", "300", "--topk", "4"], "--gamma x --topk 1200: must be < 512"),
    (["--copy-kappa", "0"], "--copy-kappa 0: must be >= 1"),
    (["--copy-rows", "600"], "--copy-rows 600: must be in [2, 512]"),
    (["--draft-vocab", "-1"], "--draft-vocab -1: must be >= 0"),
    (["--draft-threshold", "1"], "--draft-threshold 1.0: must be in [0, 1)"),
    (["--temperature", "-1"], "--temperature -1.0: must be >= 0"),
    (["--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
    pytest.param(["--device", "cuda"], "--device cuda: CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_cli_errors(tiny, tmp_path, args, msg):
    """Bad input: one line that names the flag or file, never a traceback."""
    _, folder = tiny
    base = {"--model": str(folder), "--prompt": "x"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    if base.get("--prompt-file") == "LATIN1":  # a prompt file in another encoding
        base["--prompt-file"] = str(tmp_path / "latin1.txt")
        Path(base["--prompt-file"]).write_bytes("d\xe9j\xe0 vu".encode("latin-1"))
    if "--prompt-file" in base:
        base.pop("--prompt")
    r = run_cli(*[x for kv in base.items() for x in kv])
    assert r.returncode != 0 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_cli_switchsd_with_probe_and_drafters(tiny, tmp_path):
    model, folder = tiny
    switchsd.Probe(torch.zeros(64), 1, "attn", 0.5, 2, switchsd.model_identity(model)).save(tmp_path / "p.safetensors")
    draft = noisy_copy(tmp_path / "d", folder, 0.1)
    eagle, _ = make_eagle(tmp_path / "e", model)
    base = ["--model", str(folder), "--prompt", "abcabcabcabc", "--max-new-tokens", "16", "--dtype", "float32",
            "--json", "--method", "switchsd", "--probe", str(tmp_path / "p.safetensors")]
    outs = []
    for extra in ([], ["--draft-model", str(draft)], ["--draft-model", str(draft), "--draft-quant", "none"],
                  ["--draft-model", str(draft), "--draft-quant", "int8"], ["--eagle", str(eagle)]):
        r = run_cli(*base, *extra)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert len(out["probe_scores"]) == len(out["output_ids"]) and out["probe_scores"][-1] is None
        assert (out["copy_steps"] + out["neural_steps"] + out["lookup_steps"] + out["accept_hist"][0]
                >= out["target_forwards"] - 1)
        assert set(out["accepted_by_path"]) <= {"copy", "lookup", "neural", "ar"}
        outs.append(out["output_ids"])
    r = run_cli(*base, "--draft-model", str(draft), "--policy", "paper", "--gate", "kgram")
    assert r.returncode == 0 and "lookup" not in json.loads(r.stdout)["accepted_by_path"], r.stderr
    outs.append(json.loads(r.stdout)["output_ids"])
    assert outs[0] == outs[1] == outs[2] == outs[3] == outs[4]  # greedy: every drafter gives the AR output
    r = run_cli(*[x for x in base if x != "--json"], "--show", "path")
    assert r.returncode == 0 and "\x1b[30;43m" in r.stdout  # copied tokens, coloured


@pytest.mark.slow
def test_cli_refuses_mismatched_inputs(tiny, tmp_path):
    model, folder = tiny
    other = make_checkpoint(tmp_path / "o", seed=3)
    vocab = json.loads((other / "tokenizer.json").read_text())
    vocab["model"]["vocab"] = {k: (v + 1) % 256 if v < 256 else v for k, v in vocab["model"]["vocab"].items()}
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    r = run_cli("--model", str(folder), "--prompt", "x", "--method", "sps", "--draft-model", str(other))
    assert r.returncode != 0 and "tokenizer differs from the target's" in r.stderr
    switchsd.Probe(torch.zeros(32), 1, "attn", 0.5, 5, {"hidden_size": 32}).save(tmp_path / "p.safetensors")
    r = run_cli("--model", str(folder), "--prompt", "x", "--method", "switchsd", "--probe", str(tmp_path / "p.safetensors"))
    assert r.returncode != 0 and "probe made for a model with hidden_size 32, this model has 64" in r.stderr
    r = run_cli("--model", str(folder), "--prompt", "x", "--method", "sps")
    assert r.returncode != 0 and "--method sps needs --draft-model" in r.stderr


# ---------------------------------------------------------------------------------------
# probe.py: completions, features, fitting, metrics, commands
# ---------------------------------------------------------------------------------------

def test_trainer_recovers_a_planted_direction():
    g = torch.Generator().manual_seed(0)
    w_true = torch.randn(48, generator=g)
    X = torch.randn(3000, 48, generator=g) * 5 + 2  # an offset, as real residual streams have
    y = ((X - 2) @ w_true > 0).float()
    w = probe_mod.fit(X[:2000], y[:2000])
    s = torch.sigmoid(X[2000:] @ w).numpy()
    assert probe_mod.roc_auc(s, y[2000:].numpy()) > 0.97


def test_metrics_and_selection_on_hand_made_tables():
    s = np.array([0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1])
    y = np.array([1, 1, 0, 1, 0, 0, 1, 0])
    assert probe_mod.roc_auc(s, y) == pytest.approx(12 / 16)  # 12 of 16 pairs ordered right
    assert probe_mod.roc_auc([0.5, 0.5], [1, 0]) == 0.5  # ties count half
    tau, f1 = probe_mod.best_threshold(s, y)
    assert tau == 0.6 and f1 == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert probe_mod.prf(s, y, 0.6) == {"precision": 0.75, "recall": 0.75, "f1": 0.75}
    assert probe_mod.best_threshold([0.5, 0.5, 0.2], [1, 0, 0])[0] == 0.5  # never splits a tie
    report = {"layers": [{"position": "attn", "layer": 0, "val_f1": 0.5},
                         {"position": "attn", "layer": 1, "val_f1": 0.8},
                         {"position": "mlp", "layer": 2, "val_f1": 0.9}]}
    assert probe_mod.select(report)["layer"] == 1 and probe_mod.select(report, "mlp")["layer"] == 2
    # places: index in a copy run, or minus the distance after one; a new completion restarts
    y = np.array([0, 1, 1, 1, 0, 0, 1, 0, 0])
    assert probe_mod.places(y, [0, 7]).tolist() == [0, 0, 1, 2, -1, -2, 0, 0, 0]
    rows = probe_mod.error_places(np.array([.9, .2, .9, .9, .9, .1, .9, .1, .8]), y, 0.5, [0, 7])
    got = {r["place"]: (r["tokens"], r["errors"]) for r in rows}
    assert got["copy: a run's 1st token"] == (2, 1) and got["copy: 2nd"] == (1, 0)
    assert got["no copy: 1-4 tokens after a run"] == (2, 1) and got["no copy: no run before"] == (3, 2)


def test_batched_greedy_equals_one_prompt_at_a_time(tiny, tmp_path):
    model, folder = tiny
    prompts = [list(range(30, 45)), [7, 8, 9], list(range(100, 140)), [5] * 500]
    stop = (switchsd.generate(model, prompts[1], max_new_tokens=20).output_ids[6],)  # one prompt stops early
    outs = probe_mod.batched_greedy(model, prompts, 20, stop)
    for ids, out in zip(prompts, outs):
        assert out == switchsd.generate(model, ids, max_new_tokens=20, stop_ids=stop).output_ids
    assert len(outs[1]) == 7 and len(outs[3]) == 12  # the stop token, and the 512-token context
    with pytest.raises(ValueError, match="prompt 1 is 600 tokens"):
        probe_mod.batched_greedy(model, [[5], [5] * 600], 4)
    with pytest.raises(ValueError, match="--batch must be at least 1"):
        probe_mod.generate_completions(model, llama.Tokenizer(folder), [], tmp_path / "x.jsonl", batch=0)
    # the completions command batches too, and Spec-Bench rows read as their first turn
    bench = tmp_path / "sb.jsonl"
    bench.write_text("".join(json.dumps({"question_id": q, "category": "qa", "turns": [f"q {q} abc", "more"]}) + "\n"
                             for q in range(10)))
    rows = data.read_prompts(bench)
    assert rows[0] == {"id": "sb-0", "kind": "qa", "prompt": "q 0 abc", "split": "train"}
    assert [r["split"] for r in rows].count("val") == 1
    tok = llama.Tokenizer(folder)
    probe_mod.generate_completions(model, tok, rows, tmp_path / "c.jsonl", max_new_tokens=8, batch=4)
    comps = data.read_jsonl(tmp_path / "c.jsonl")
    assert [c["id"] for c in comps] == [r["id"] for r in rows]
    one = switchsd.generate(model, tok.prompt_ids("q 9 abc"), max_new_tokens=8, stop_ids=tok.eos_ids)
    assert comps[9]["output_ids"] == one.output_ids


def test_feature_pipeline_end_to_end(tiny, tmp_path, capsys):
    model, folder = tiny
    tok = llama.Tokenizer(folder)
    rows = [{"id": f"k-{i}", "kind": "k", "split": sp, "prompt": f"say {i} twice: abc {i} abc {i}"}
            for i, sp in enumerate(["train"] * 6 + ["val"] * 2 + ["test"] * 2)]
    probe_mod.generate_completions(model, tok, rows, tmp_path / "c.jsonl", max_new_tokens=12)
    probe_mod.generate_completions(model, tok, rows, tmp_path / "c.jsonl", max_new_tokens=12)  # resumes: no-op
    comps = data.read_jsonl(tmp_path / "c.jsonl")
    assert [c["id"] for c in comps] == [r["id"] for r in rows]
    data.extract_features(model, comps, tmp_path / "features", kappa=2)
    attn = data.open_features(tmp_path / "features", "attn")
    n = sum(len(c["output_ids"]) for c in comps)
    assert attn.shape == (model.args.n_layers, n, model.args.dim)
    c = comps[3]  # the features are the hidden states at the completion tokens
    ids, P = c["prompt_ids"] + c["output_ids"], len(c["prompt_ids"])
    mask, pos = llama.causal_mask(len(ids), 0)
    _, hid = model(torch.tensor(ids), pos, mask, model.new_cache(len(ids)), [("attn", 2)])
    a = sum(len(x["output_ids"]) for x in comps[:3])
    np.testing.assert_allclose(attn[2, a:a + len(ids) - P], hid["attn", 2][P:].numpy(), rtol=1e-2, atol=1e-2)
    report, weights = probe_mod.train_layers(tmp_path / "features", log=lambda *_: None)
    assert len(report["layers"]) == 2 * model.args.n_layers and set(weights) == {
        (p, l) for p in ("attn", "mlp") for l in range(model.args.n_layers)}
    best = probe_mod.select(report)  # the errors command reads the same stored features
    switchsd.Probe(weights["attn", best["layer"]], best["layer"], "attn", best["tau"], 2,
                    switchsd.model_identity(model)).save(tmp_path / "p.safetensors")
    probe_mod.main(["errors", "--work", str(tmp_path), "--probe", str(tmp_path / "p.safetensors")])
    assert f"F1 {best['test_f1']:.3f}" in capsys.readouterr().out
    probe_mod.main(["alignment", "--work", str(tmp_path), "--layer", str(best["layer"])])
    lines = capsys.readouterr().out.splitlines()  # the unshifted pairing is the trainer's own probe
    assert len(lines) == 3 and f"Y_(j+0): tau {best['tau']:.2f}" in lines[1], lines
    assert f"test F1 {best['test_f1']:.3f} AUC {best['test_auc']:.4f}" in lines[1], lines
    switchsd.Probe(torch.zeros(64), 0, "attn", 0.5, 2, {"fingerprint": "0" * 16}).save(tmp_path / "q.safetensors")
    with pytest.raises(ValueError, match="made for another model"):
        probe_mod.main(["errors", "--work", str(tmp_path), "--probe", str(tmp_path / "q.safetensors")])


@pytest.mark.slow
def test_probe_eval_command(tiny, tmp_path):
    model, folder = tiny
    switchsd.Probe(torch.randn(64), 1, "attn", 0.5, 3, switchsd.model_identity(model)).save(tmp_path / "p.safetensors")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"abc{i} abc{i} abc{i}"}) + "\n"
                                                    for i in range(3)))
    r = subprocess.run([sys.executable, str(HERE / "probe.py"), "eval", "--model", str(folder), "--probe",
                        str(tmp_path / "p.safetensors"), "--prompts", str(tmp_path / "prompts.jsonl"),
                        "--max-new-tokens", "10", "--json"], capture_output=True, text=True, cwd=HERE, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"precision", "recall", "f1", "auc", "tokens", "positives", "surface_auc",
                        "kgram_precision", "kgram_recall", "kgram_f1"} and out["tokens"] > 0


# ---------------------------------------------------------------------------------------
# bench.py
# ---------------------------------------------------------------------------------------

def test_bench_pass_shapes_are_what_they_say():
    """`bench.py passes --shape`: T tokens as a chain, a drafter's chain with runner-up leaves,
    and a trie of two copy candidates; each a valid Tree (a parent before its child)."""
    import bench
    for T in range(1, 40):
        for name, shape in bench.SHAPES.items():
            parents = shape(T)
            assert len(parents) == T and parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents[1:], 1))
        children = lambda ps: [sum(p == i for p in ps) for i in range(len(ps))]
        assert bench.SHAPES["chain"](T) == list(range(-1, T - 1))
        leaves = bench.SHAPES["leaves"](T)  # a chain of (T + 1) // 2 at the front, every other node a leaf
        c = (T + 1) // 2
        assert leaves[:c] == list(range(-1, c - 1)) and all(p < c for p in leaves[c:]) and max(children(leaves)) <= 2
        trie = bench.SHAPES["trie"](T)  # the root has two children once there is a second branch
        assert children(trie)[0] == (2 if (T - 1) // 3 else min(1, T - 1)) and max(children(trie)[1:], default=0) <= 1
    assert llama.tree_mask(bench.SHAPES["leaves"](5), 0)[1].tolist() == [0, 1, 2, 1, 2]  # leaves sit at their depth


def test_bench_oracle_schedules_on_hand_built_costs():
    """bench.schedules on path costs whose best schedule is known: six tokens, a plain step
    costs 1 s; a lookup at state 0 accepts 2 (3 tokens for 1.5 s); the neural drafter accepts
    2 at state 3 for 1 s, but its first use also pays a 2.5 s prefill. Best: lookup, then three
    plain steps (4.5 s); the per-step greedy choice agrees; neither pays the prefill."""
    import bench
    ar = ("ar", 0, 1.0)
    options = [[ar, ("lookup", 2, 1.5)], [ar], [ar], [ar, ("neural", 2, 1.0)], [ar], [ar]]
    pc = {"ids": [1, 2], "out": [3, 4, 5, 6, 7, 8], "options": options, "scores": [0.0] * 6, "extra": 2.5,
          "tau": 0.5, "kappa": 5, "neural": True}
    rows = bench.schedules(pc, prefill=0.5)
    assert rows["oracle"]["seconds"] == pytest.approx(0.5 + 4.5)
    assert rows["oracle"]["paths"] == {"copy": 0, "lookup": 1, "neural": 0, "ar": 3}
    assert rows["oracle, per step"]["seconds"] == pytest.approx(5.0)
    pc["extra"] = 0.0  # a free prefill: the neural step (3 tokens for 1 s) now beats three plain steps
    assert bench.schedules(pc, prefill=0.5)["oracle"]["seconds"] == pytest.approx(0.5 + 1.5 + 1.0)
    assert all(r["tokens"] == 6 and r["seconds"] >= rows["oracle"]["seconds"] - 1e-9 for r in rows.values())
    # The replay's regret, each choice's loss against the best schedule from its state, adds up to
    # its distance from the oracle; the oracle's own is nil. The policy's one loss: a plain first
    # step where the oracle takes the lookup (unscored at its first pick, so not yet offered).
    for name in ("oracle", "SwitchSD, replayed"):
        assert sum(rows[name]["regret"].values()) == pytest.approx(rows[name]["seconds"] - rows["oracle"]["seconds"])
    assert {k: v for k, v in rows["SwitchSD, replayed"]["regret"].items() if v} == pytest.approx({("ar", "lookup"): 1.5})
    # Fixed rules on the same costs: a lookup wherever found, else a plain step, takes the best
    # schedule; the drafter at its first chance pays its prefill; a lookup only where the probe
    # is on (it is off everywhere here) leaves six plain steps, until the probe reads copy intent.
    assert bench.fixed_rule(pc | {"extra": 2.5}, 0.5, "always", "ar") == pytest.approx(0.5 + 1.5 + 3.0)
    assert bench.fixed_rule(pc | {"extra": 2.5}, 0.5, "never", "neural") == pytest.approx(0.5 + 3.0 + 1.0 + 2.5)
    assert bench.fixed_rule(pc, 0.5, "on", "ar") == pytest.approx(0.5 + 6.0)
    assert bench.fixed_rule(pc | {"scores": [1.0] + [0.0] * 5}, 0.5, "on", "ar") == pytest.approx(0.5 + 1.5 + 3.0)
    # The gates replayed: the prompt ends in a recurring 5-gram, where a copy would accept 2; the
    # probe (0.0 < tau) keeps its gate shut there, the kappa-gram alone opens it.
    gated = pc | {"ids": [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5], "options": [[ar, ("copy", 2, 1.0)]] + options[1:]}
    copies = lambda gate: bench.schedules(gated, 0.5, gate=gate)["SwitchSD, replayed"]["paths"]["copy"]
    assert (copies("probe"), copies("kgram")) == (0, 1)
    assert bench.fixed_rule(gated | {"scores": [1.0] * 6}, 0.5, "never", "ar") == pytest.approx(0.5 + 1.0 + 3.0)
    assert bench.fixed_rule(gated | {"scores": [1.0] * 6}, 0.5, "never", "ar", gate=False) == pytest.approx(0.5 + 6.0)
    # On the live clock: AR took 13 s live, twice its 6.5 s under these costs (0.5 s prefill + six
    # 1 s plain steps), so every schedule takes twice as long, and its speedup over AR is kept.
    pc["plain"] = 1.0
    live = bench.live_clock(rows, pc, 0.5, 13.0)
    assert live["oracle"]["seconds"] == pytest.approx(2 * rows["oracle"]["seconds"])
    assert live["oracle"]["tps"] / (6 / 13.0) == pytest.approx(rows["oracle"]["tps"] / (6 / 6.5))


def test_bench_hf_rows_follow_methods():
    """table1 --hf: the transformers rows --methods names, else all those the run has models for."""
    import bench
    assert bench.hf_rows(["PLD", "HF-PLD"], "draft") == ["HF-PLD"]
    assert bench.hf_rows(["PLD"], "draft") == bench.hf_rows(None, "draft") == ["HF-PLD", "HF-assisted"]
    assert bench.hf_rows(None, None) == ["HF-PLD"]


def test_bench_keeps_each_methods_fastest_round(monkeypatch):
    """With --repeats, a method's time on a prompt is its fastest round, and its speedup is
    taken against AR's fastest round: load from other tenants only adds time. The speedup
    after the first step leaves out the time to the first emitted tokens (0.5 s here, 1 token).
    Each of our methods first runs once untimed, a short warm-up."""
    import bench
    seconds = {"AR": [4.0, 2.0], "PLD": [1.0, 2.0], "HF-PLD": [3.0, 1.5]}  # round 1, round 2
    warm = []

    class Setup:
        tok = type("Tok", (), {"prompt_ids": staticmethod(lambda text: [1, 2])})
        prompt_ids = staticmethod(lambda text: [1, 2])

        def run(self, name, ids, max_new):
            if max_new != 4:  # the warm-up: not timed, not counted
                warm.append(name)
                return switchsd.Result(ids, [7], [switchsd.Step("ar", 0, 0, 9.0)], seconds=9.0)
            steps = [switchsd.Step("ar", 0, 0, 0.0)] * 4
            return switchsd.Result(ids, [7, 8, 9, 10], steps, seconds=seconds[name].pop(0), prefill_seconds=0.5)

    monkeypatch.setattr(bench, "task_prompts", lambda task, n: ["one prompt"])
    res = bench.side_by_side(Setup(), ["PLD"], ["humaneval"], 1, 4, repeats=2,
                             hf={"HF-PLD": lambda ids: ([7, 8, 9, 10], seconds["HF-PLD"].pop(0), (0.5, 1))})
    rows = res["humaneval"]
    assert (rows["AR"]["tps"], rows["PLD"]["tps"], rows["HF-PLD"]["tps"]) == (2.0, 4.0, 4 / 1.5)
    assert rows["PLD"]["speedups"] == [2.0] and rows["HF-PLD"]["speedup"] == pytest.approx(4 / 3)
    assert rows["AR"]["round_tps"] == [[1.0, 2.0]] and rows["PLD"]["round_tps"] == [[4.0, 2.0]]
    # 3 tokens after the first: AR 3 / 1.5 s, PLD 3 / 0.5 s, HF-PLD 3 / 1.0 s at best
    assert rows["PLD"]["decode_speedup"] == pytest.approx(3.0)
    assert rows["HF-PLD"]["decode_speedups"] == [1.5]
    assert all(not v for v in seconds.values())  # every method ran in both rounds
    assert warm == ["AR", "PLD"]


def test_bench_pool_equals_one_run_over_all_prompts(monkeypatch, tmp_path):
    """`bench.py pool` over a run on prompt 1 and a run on prompts 2-3 gives the table of one
    run over all three: the same medians, step statistics and agreement counts."""
    import bench

    class Setup:
        tok = type("Tok", (), {"prompt_ids": staticmethod(lambda text: [len(text)])})
        prompt_ids = staticmethod(lambda text: [len(text)])

        def run(self, name, ids, max_new):
            n = ids[0]  # each prompt its own speed, output and copy steps
            steps = [switchsd.Step("copy" if name == "PLD" and i % 2 else "ar", 3, i % 3, 0.0) for i in range(n + 1)]
            sec = n if name == "AR" else n / (1 + n % 3)
            return switchsd.Result(ids, list(range(n + 3)), steps, seconds=sec, prefill_seconds=0.1)

    prompts = ["a", "bb", "cccc"]
    monkeypatch.setattr(bench, "task_prompts", lambda task, n: prompts[bench.SKIP:bench.SKIP + n])
    run = lambda skip, n: (monkeypatch.setattr(bench, "SKIP", skip),
                           bench.side_by_side(Setup(), ["PLD"], ["humaneval", "cnndm"], n, 8))[1]
    whole, parts = run(0, 3), [run(0, 1), run(1, 2)]
    files = []
    for i, part in enumerate(parts):
        files.append(tmp_path / f"r{i}.json")
        files[-1].write_text(json.dumps(part))
    monkeypatch.setattr(sys, "argv", ["bench.py", "pool", *map(str, files), "--out", str(tmp_path / "pooled")])
    bench.main()
    pooled = json.loads((tmp_path / "pooled.json").read_text())
    assert pooled["cnndm"]["PLD"]["speedups"] == [2.0, 3.0, 2.0]
    for task in whole:
        for m, row in whole[task].items():
            for k, v in row.items():
                # (rel: the saved per-prompt figures are rounded to 3 decimals)
                assert pooled[task][m][k] == (pytest.approx(v, rel=1e-3) if isinstance(v, float) else v), (task, m, k)
    old = tmp_path / "old.json"  # a run saved before the counts: refused, not pooled wrongly
    old.write_text(json.dumps({t: {m: {k: v for k, v in r.items() if k != "counts"} for m, r in rows.items()}
                               for t, rows in parts[0].items()}))
    monkeypatch.setattr(sys, "argv", ["bench.py", "pool", str(old), str(files[1])])
    with pytest.raises(SystemExit, match="old.json: no step counts"):
        bench.main()


@pytest.mark.slow
def test_bench_quick_smoke_run(tmp_path):
    src = make_checkpoint(tmp_path / "t", max_position_embeddings=4096)
    target = llama.Model.from_pretrained(src, torch.float32)
    draft = noisy_copy(tmp_path / "d", src, 0.1)
    eagle, _ = make_eagle(tmp_path / "e", target)
    planted = switchsd.Probe(torch.zeros(64), 1, "attn", 0.5, 5, switchsd.model_identity(target))
    planted.save(tmp_path / "p.safetensors")  # score 0.5 >= tau: the gate is the kappa-gram alone
    rows = [{"prompt": f"def f{i}(x):\n    return x + x + {i}\n"} for i in range(2)]
    (tmp_path / "he.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = [{"problem": f"What is {i} + {i} + {i}?"} for i in range(2)]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([sys.executable, str(HERE / "bench.py"), "table1", "--quick", "--model", str(src),
                        "--draft-model", str(draft), "--eagle", str(eagle), "--probe", str(tmp_path / "p.safetensors"),
                        "--tasks", "humaneval", "math500", "--data", f"humaneval={tmp_path / 'he.jsonl'}",
                        f"math500={tmp_path / 'math.jsonl'}", "--dtype", "float32", "--oracle", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=HERE, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "table1_t_quick.json").read_text())
    assert set(res) == {"humaneval", "math500"}
    assert list(res["humaneval"]) == ["AR", "PLD", "CopySpec[SPS]", "copy", "SPS", "SPS gamma=8", "EAGLE3", "BanditSpec[SPS]",
                                      "BanditSpec[EAGLE3]", "SwitchSD[SPS]", "SwitchSD[EAGLE3]", "SwitchSD[SPS] gamma=8",
                                      "oracle", "oracle, per step", "SwitchSD, replayed"]
    # --oracle's path costs, saved: the oracle rows replayed from them are the table's
    import bench
    paths = json.loads((tmp_path / "out" / "table1_t_quick_paths.json").read_text())
    assert [p["task"] for p in paths] == ["humaneval"] * 2 + ["math500"] * 2
    for p, task, i in zip(paths, ["humaneval"] * 2 + ["math500"] * 2, [0, 1] * 2):
        assert len(p["options"]) == len(p["out"]) and all(o[0][0] == "ar" for o in p["options"])
        rows = bench.live_clock(bench.schedules(p, p["prefill"]), p, p["prefill"], p["ar_seconds"])
        assert rows["oracle"]["tps"] == pytest.approx(res[task]["oracle"]["round_tps"][i][0], abs=1e-3)
    r = subprocess.run([sys.executable, str(HERE / "bench.py"), "replay", str(tmp_path / "out" / "table1_t_quick_paths.json")],
                       capture_output=True, text=True, cwd=HERE, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.splitlines()[0]  # the default policy replayed: the table's row
    assert line.startswith("HumanEval: oracle") and f"ar {res['humaneval']['SwitchSD, replayed']['speedup']:.2f}x" in line
    assert sum(l.startswith("  the gate, else a lookup") for l in r.stdout.splitlines()) == 6  # the fixed rules
    assert any(l.startswith("Where the replay loses time to the oracle") for l in r.stdout.splitlines())
    room = r.stdout.split("against the faster of the drafter alone and lookups-else-plain-steps ")[1].split("\n")[0]
    assert all(float(x.rstrip("x")) >= 1.0 for x in room.split(" / "))  # the oracle's schedule includes theirs
    lookups = next(l for l in r.stdout.splitlines() if l.startswith("HumanEval, a lookup's mean accepted length"))
    assert "probe on match" in lookups and "probe off" not in lookups  # the planted probe reads 0.5 >= tau everywhere
    assert all(row["agreement"] == "2/2" for task in res.values() for row in task.values())
    for row in (r for task in res.values() for r in task.values() if r["copy_rate"] is not None):
        assert row["copy_per_100"] == pytest.approx(100 * row["copy_rate"] / row["mean_accepted"])
    assert res["humaneval"]["SPS"]["copy_per_100"] == 0 and res["humaneval"]["PLD"]["copy_per_100"] > 0
    assert (tmp_path / "out" / "table1_t_quick.svg").read_text().startswith("<svg")
    r = subprocess.run([sys.executable, str(HERE / "bench.py"), "table1", "--quick", "--model", str(src),
                        "--draft-model", str(draft), "--probe", str(tmp_path / "p.safetensors"), "--dtype", "float32",
                        "--methods", "PLD", "SwitchSD[SPS] paper switch"], capture_output=True, text=True, cwd=HERE,
                       timeout=600)  # an ablation row without --ablations: refused, not dropped
    assert r.returncode != 0 and "'SwitchSD[SPS] paper switch'" in r.stderr and "--ablations" in r.stderr
    r = subprocess.run([sys.executable, str(HERE / "bench.py"), "heads", "--model", str(src), "--eagle", str(eagle),
                        "--tasks", "humaneval", "--data", f"humaneval={tmp_path / 'he.jsonl'}", "--tokens", "16",
                        "--dtype", "float32", "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=HERE,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "out" / "heads_t.md").read_text().count("| e | HumanEval |") == 1


# ---------------------------------------------------------------------------------------
# fetch.py: GGUF -> Hugging Face folder
# ---------------------------------------------------------------------------------------

def test_bench_ar_runs_and_sps_sweeps_refuse_no_draft(tmp_path):
    """`bench.py ar` (ours against transformers) writes its table; an experiment with SPS rows
    run with --draft-model none, or one that reads the probe run on a model without one, stops
    with a one-line reason instead of a traceback."""
    src = make_checkpoint(tmp_path / "t")
    r = subprocess.run([sys.executable, str(HERE / "bench.py"), "ar", "--models", str(src), "--prompts", "1",
                        "--tokens", "4"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"| {src} |" in (tmp_path / "runs" / "bench_ar.md").read_text()
    for cmd, why in (("kernels", "this run has SPS rows and no SPS draft model: give --draft-model"),
                     ("analysis", f"the section 4.2 analysis needs a probe for {src} (probes/<name>.safetensors)")):
        r = subprocess.run([sys.executable, str(HERE / "bench.py"), cmd, "--model", str(src), "--draft-model", "none",
                            "--tasks", "humaneval", "--prompts", "1", "--tokens", "4"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"bench.py: {why}"], r.stderr[-3000:]


def test_bench_trace_prints_each_methods_steps(tmp_path, monkeypatch, capsys):
    import argparse
    import bench
    src = make_checkpoint(tmp_path / "t", max_position_embeddings=4096)
    draft = noisy_copy(tmp_path / "d", src, 0.1)
    (tmp_path / "he.jsonl").write_text(json.dumps({"prompt": "def f(x):\n    return x + x\n"}) + "\n")
    monkeypatch.setitem(bench.TASK_FILES, "humaneval", tmp_path / "he.jsonl")
    bench.bench_trace(argparse.Namespace(model=str(src), draft_model=str(draft), task="humaneval", index=0, tokens=12,
                                         kernels="exact", methods=["AR", "PLD", "SPS"]))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("HumanEval prompt 0:") and [l.split(":")[0] for l in out[1::2]] == ["AR", "PLD", "SPS"]
    assert all(len(l.split()) >= 1 and all(w[0] in "acln" for w in l.split()) for l in out[2::2])
    tokens, steps = re.search(r"(\d+) tokens; ar (\d+) steps", out[1]).groups()
    assert tokens == steps and 1 <= int(tokens) <= 12  # AR: one token a step (a random model may end early)


def test_text_page_colours_every_path(tmp_path):
    """The picture of a run (bench.py picture): every kind switchsd.provenance gives has its own
    colour, and a kind it does not know is refused, not drawn as the target's own."""
    import figures
    kinds = ["copy", "lookup", "neural", "target"]
    figures.text_page(tmp_path / "p.svg", ["a", "b", "c", "d"], kinds, [False] * 4, "t")
    svg = (tmp_path / "p.svg").read_text()
    assert all(svg.count(figures.PATHS[k][0]) >= 2 for k in kinds[:3])  # the legend's swatch and the token's
    with pytest.raises(KeyError):
        figures.text_page(tmp_path / "q.svg", ["a"], ["ar"], [False], "t")


def test_imports_go_one_way():
    """Each module imports, at its top, only the modules before it in the layer order (the
    README's code map) and the two leaves, which import none: no cycle, no import hidden in a
    function."""
    import ast
    order, leaves = ["llama", "data", "drafters", "switchsd", "probe", "bench"], ["fetch", "figures"]
    for i, name in enumerate(order + leaves):
        tree = ast.parse((HERE / f"{name}.py").read_text())
        allowed = set(order[:i]) | set(leaves) if name in order else set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                ours = {m.split(".")[0] for m in mods} & set(order + leaves)
                assert ours <= allowed, f"{name}.py line {node.lineno} imports {ours - allowed}"
                assert not ours or node in tree.body, f"{name}.py line {node.lineno}: import inside a function"


def test_gguf_conversion_round_trip(tmp_path):
    """A llama model written to GGUF as llama.cpp writes it (q/k rows permuted, a Q8_0
    tensor, the vocabulary as metadata) converts back to the same logits and tokenizer."""
    gguf = pytest.importorskip("gguf")
    import fetch
    src = make_checkpoint(tmp_path / "src", "llama", rope_scaling=None, num_attention_heads=4,
                          num_key_value_heads=2, hidden_size=64)
    from safetensors.torch import load_file
    weights = {k: v.bfloat16().float() for k, v in load_file(str(src / "model.safetensors")).items()}
    cfg = json.loads((src / "config.json").read_text())
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(64)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    gguf_names = {v: k for k, v in fetch.GLOBAL_TENSORS.items()}
    layer_names = {v: k for k, v in fetch.LAYER_TENSORS.items()}
    for name, t in weights.items():
        a = t.numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's permutation
            n = 4 if "q_proj" in name else 2
            a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        g = gguf_names.get(name) or f"blk.{name.split('.')[2]}." + layer_names[name.split(".", 3)[3]]
        if g == "blk.0.ffn_up.weight":  # quantized: the reference gets the dequantized values
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(g, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            deq = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
            weights[name] = torch.from_numpy(deq.reshape(a.shape)).bfloat16().float()
        else:
            w.add_tensor(g, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(weights, str(src / "model.safetensors"))  # the values the converter must reproduce
    fetch.convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    ours = llama.Model.from_pretrained(tmp_path / "out", torch.float32)
    ref = llama.Model.from_pretrained(src, torch.float32)
    ids = list(range(3, 60))
    torch.testing.assert_close(full_logits(ours, ids), full_logits(ref, ids), rtol=1e-4, atol=1e-4)
    tok, ref_tok = llama.Tokenizer(tmp_path / "out"), llama.Tokenizer(src)
    assert tok.tok.get_vocab(with_added_tokens=True) == vocab
    text = "def f(x):\n    return x  # ünïcode"
    assert tok.encode(text) == ref_tok.encode(text) and tok.decode(tok.encode(text)) == text
    assert tok.prompt_ids("hi") == ref_tok.encode(tok.chat("hi"), special=False)

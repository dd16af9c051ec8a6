"""SwitchSD: speculative decoding that copies only when the model itself says it is copying.

References:
  Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
  Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling" (SPS);
  Miao et al. 2024, "SpecInfer" (verifying a token tree in one pass).

The whole method is one loop (generate). Each step:
  1. a policy picks a drafter: copy from the context, or the neural drafter;
  2. the drafter proposes a Tree of candidate tokens below the current token;
  3. verify() runs the target once over the tree, accepts the longest verified path
     plus one token of the target's own, and compacts the KV cache to that path.
Greedy output is token-identical to autoregressive decoding; sampling is lossless.
"""
import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import llama
from drafters import CopyDrafter, CopySpec, DraftModel, Eagle3, Eagle3Head, PromptLookup, Tree, probs
from probe import Probe


MAX_TREE = 512  # most tokens one verification pass may carry (root + drafts)


@dataclass
class Step:
    """One target forward: every statistic in the benchmarks is derived from these."""
    path: str  # "ar", "copy" or "neural"
    drafted: int  # candidate tokens sent to the target besides the current one
    accepted: int  # drafted tokens accepted (the target's own bonus token comes on top)
    seconds: float


@dataclass
class Result:
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    stop: str = "length"  # "eos", "length" (max_new_tokens) or "context" (model's limit)
    probe_scores: list | None = None  # per output token with a probe; None for the last token
    seconds: float = 0.0
    prefill_seconds: float = 0.0


# ---------------------------------------------------------------------------------------
# Verification: one target pass over a tree of candidates, then the acceptance rule
# ---------------------------------------------------------------------------------------

def verify(model, cache, tree: Tree, temperature, top_p, gen, capture=()):
    """Run the target over `tree`, accept a path, compact the cache to it.

    Returns (accepted node indices, the bonus token, hidden states of [root] + accepted).
    """
    n = cache.n
    mask, pos = llama.tree_mask(tree.parents, n, model.device)
    ids = torch.tensor(tree.tokens, device=model.device)
    logits, hidden = model(ids, pos, mask, cache, capture)  # (T, V)
    path, bonus = accept(logits, tree, temperature, top_p, gen)
    rows = [0, *path]
    cache.keep(n, rows)
    return path, bonus, {k: h[rows] for k, h in hidden.items()}


def accept(logits, tree: Tree, temperature, top_p, gen):
    """Walk the tree from the root while the target agrees; return (path, bonus token).

    Greedy: follow the child equal to the target's argmax. Sampling (SpecInfer's
    multi-candidate rejection sampling, Leviathan et al. 2023 for one candidate): at a
    node with target distribution p, try its children x in order, each drafted from q:
        accept x with probability min(1, p(x) / q(x))
        else p <- norm(max(0, p - q))
    and when no child is accepted, the bonus token is sampled from what is left of p.
    A copied token is a deterministic draft, q = one-hot(x): accept with p(x), else zero
    p(x) and renormalise. Either way every emitted token is distributed exactly as p.
    """
    children = [[] for _ in tree.tokens]
    for i, parent in enumerate(tree.parents[1:], start=1):
        children[parent].append(i)
    node, path = 0, []
    if temperature == 0:
        top = logits.argmax(-1).tolist()
        while True:
            nxt = next((c for c in children[node] if tree.tokens[c] == top[node]), None)
            if nxt is None:
                return path, top[node]
            path.append(nxt)
            node = nxt
    while True:
        p = probs(logits[node], temperature, top_p)
        for c in children[node]:
            x, q = tree.tokens[c], tree.q[c]
            qx = 1.0 if q is None else q[x].item()
            if torch.rand((), generator=gen, device=p.device).item() * qx < p[x].item():
                path.append(c)
                node = c
                break
            if q is None:
                p[x] = 0.0
            else:
                p = (p - q).clamp_min(0.0)
            p = p / p.sum()
        else:
            return path, torch.multinomial(p, 1, generator=gen).item()


# ---------------------------------------------------------------------------------------
# The decode loop
# ---------------------------------------------------------------------------------------

def generate(model, prompt_ids, method="ar", copier=None, neural=None, probe=None,
             max_new_tokens=128, temperature=0.0, top_p=1.0, seed=0, stop_ids=(),
             on_tokens=None) -> Result:
    """Decode up to max_new_tokens after prompt_ids; on_tokens(new ids) streams output.

    copier: a copy drafter (CopyDrafter, PromptLookup, CopySpec) or None.
    neural: a neural drafter (DraftModel for SPS, Eagle3 for EAGLE3), or None for plain
            autoregressive steps whenever the policy does not copy.
    probe:  the copy-intent probe (probe.Probe); SwitchSD's gate, and per-token scores.
    method: the policy: "switchsd" and "banditspec" gate the copier, the others copy
            whenever the copier finds a match ("ar", "sps" and "eagle3" have no copier).
    """
    limit = model.args.max_seq_len
    if not prompt_ids:
        raise ValueError("prompt is empty")
    if len(prompt_ids) >= limit:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens; the model's context is {limit}")
    if method == "switchsd" and (probe is None or copier is None):
        raise ValueError("switchsd needs a probe and a copy drafter")
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    max_len = min(limit, len(prompt_ids) + max_new_tokens) + MAX_TREE
    cache = model.new_cache(max_len)
    for d in (copier, neural):
        if d is not None:
            d.reset(max_len)
    bandit = UCB1(["copy", "neural"]) if method == "banditspec" else None
    capture = ((probe.capture,) if probe else ()) + (neural.capture if neural else ())
    res = Result(prompt_ids=list(prompt_ids))
    ctx = list(prompt_ids)  # ctx[-1] is the current token: sampled, not yet run by the target
    scores = []  # probe score of each output token, from the pass that ran it
    t0 = time.perf_counter()

    with torch.inference_mode():
        # Prefill everything but the current token; its logits come with the first step.
        hidden = {}
        if len(ctx) > 1:
            mask, pos = llama.causal_mask(len(ctx) - 1, 0, dev)
            _, hidden = model(torch.tensor(ctx[:-1], device=dev), pos, mask, cache, capture,
                              logits_at=slice(0, 0))
        if neural:
            neural.observe(hidden)  # EAGLE3 reads the prompt's features here
        score = probe.score(hidden[probe.capture][-1]).item() if probe and hidden else 0.0
        res.prefill_seconds = time.perf_counter() - t0

        while True:
            budget = min(max_new_tokens - len(res.output_ids), limit - len(ctx))
            if budget <= 0:
                res.stop = "length" if len(res.output_ids) >= max_new_tokens else "context"
                break
            ts = time.perf_counter()
            # 1. The policy. SwitchSD copies iff the probe reads copy intent in the last
            #    hidden state (score >= tau) AND the kappa-gram ending here occurred before.
            arm = None
            if method == "switchsd":
                use_copy = score >= probe.tau and copier.matches(ctx)
            elif method == "banditspec":  # UCB1 picks an arm whenever copying is possible
                arm = bandit.pick() if copier.matches(ctx) else None
                use_copy = arm == "copy"
            else:  # PLD, CopySpec and unguarded copy: whenever they find a match
                use_copy = copier is not None
            # 2. Draft at most budget - 1 tokens deep, so accepted + bonus fit the budget.
            depth = budget - 1
            tree = copier.propose(ctx, depth) if use_copy and depth > 0 else None
            kind = "copy" if tree else "neural" if neural else "ar"
            if tree is None:
                tree = neural.propose(ctx, depth, temperature, top_p, gen) if neural and depth > 0 \
                    else Tree([ctx[-1]])
            # 3. Verify the whole tree in one target pass and accept the longest agreed path.
            path, bonus, hidden = verify(model, cache, tree, temperature, top_p, gen, capture)
            if neural:
                neural.observe(hidden)  # features of the accepted tokens, for its next draft
            if probe:
                s = probe.score(hidden[probe.capture]).tolist()  # rows: current + accepted
                scores += s if res.output_ids else s[1:]  # the first current token is the prompt's
                score = s[-1]
            new = [tree.tokens[i] for i in path] + [bonus]
            res.steps.append(Step(kind, len(tree) - 1, len(path), time.perf_counter() - ts))
            if arm:
                bandit.update(arm, len(new) / res.steps[-1].seconds)
            # An end-of-sequence token, drafted or not, ends generation right after it.
            end = next((i + 1 for i, t in enumerate(new) if t in stop_ids), None)
            new = new[:end]
            ctx += new
            res.output_ids += new
            if on_tokens:
                on_tokens(new)
            if end is not None:
                res.stop = "eos"
                break
    n = len(res.output_ids)
    if probe:  # the last token never ran through the target: it has no score
        res.probe_scores = (scores + [None] * n)[:n]
    res.seconds = time.perf_counter() - t0
    return res


class UCB1:
    """BanditSpec's UCBSpec (Hou et al. 2025) over drafting arms, with UCB1 (Auer et al. 2002):
    play each arm once, then the arm maximising mean reward + sqrt(c ln t / n_arm).

    Reward: tokens emitted per second in the round, divided by the best rate seen so far, so
    rewards lie in [0, 1] as UCB1 assumes. c = 2, the constant of UCB1's regret bound.
    """
    c = 2.0

    def __init__(self, arms):
        self.arms = list(arms)
        self.n = {a: 0 for a in self.arms}
        self.raw = {a: [] for a in self.arms}  # tokens/s of each round, before normalising
        self.best = 0.0

    def pick(self) -> str:
        for a in self.arms:
            if self.n[a] == 0:
                return a
        t = sum(self.n.values())
        mean = {a: sum(self.raw[a]) / self.n[a] / self.best for a in self.arms}
        return max(self.arms, key=lambda a: mean[a] + math.sqrt(self.c * math.log(t) / self.n[a]))

    def update(self, arm: str, tokens_per_second: float):
        self.n[arm] += 1
        self.raw[arm].append(tokens_per_second)
        self.best = max(self.best, tokens_per_second)


def summary(res: Result) -> dict:
    """The --json statistics, all derived from the step records."""
    n, steps = len(res.output_ids), res.steps
    copy = [s.accepted for s in steps if s.path == "copy"]
    hist = [0] * (max((s.accepted for s in steps), default=0) + 1)
    by_path = {}  # mean drafted tokens accepted per step, by path
    for s in steps:
        hist[s.accepted] += 1
        by_path.setdefault(s.path, []).append(s.accepted)
    return {
        "prompt_ids": res.prompt_ids,
        "output_ids": res.output_ids,
        "new_tokens": n,
        "seconds": round(res.seconds, 4),
        "prefill_seconds": round(res.prefill_seconds, 4),
        "tokens_per_second": round(n / res.seconds, 3) if res.seconds else 0.0,
        "target_forwards": len(steps) + (len(res.prompt_ids) > 1),
        "stop": res.stop,
        "mean_accepted": round(n / len(steps), 4) if steps else 0.0,  # tokens per decode forward
        "accept_hist": hist,  # steps by number of drafted tokens accepted
        "copy_attempts": len(copy),
        "copy_zero_accept": copy.count(0),  # the speculation tax: passes that copied nothing
        "copy_accepted_mean": round(sum(copy) / len(copy), 4) if copy else 0.0,
        "copy_steps": len(copy),
        "neural_steps": sum(s.path == "neural" for s in steps),
        "copy_rate": round(len(copy) / len(steps), 4) if steps else 0.0,  # activation rate
        "accepted_by_path": {p: round(sum(a) / len(a), 4) for p, a in by_path.items()},
        **({"probe_scores": res.probe_scores} if res.probe_scores is not None else {}),
    }


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def provenance(res: Result) -> list[str]:
    """How each output token was produced: "copy", "neural" (drafted, then verified) or
    "target" (the target's own token: every step's bonus token)."""
    kinds = []
    for s in res.steps:
        kinds += [s.path] * s.accepted + ["target"]
    return kinds[:len(res.output_ids)]


def show(tok, res: Result, mode: str) -> str:
    """The output with ANSI background colours: by provenance, or shaded by probe score."""
    colour = {"copy": "\x1b[30;43m", "neural": "\x1b[30;46m", "target": ""}
    kinds, pieces = provenance(res), []
    for i, piece in enumerate(tok.pieces(res.output_ids)):
        if mode == "path":
            c = colour[kinds[i]]
        else:
            s = res.probe_scores[i]
            c = "" if s is None else f"\x1b[30;48;2;255;{int(255 - 200 * s)};{int(255 - 255 * s)}m"
        pieces.append(c + piece + ("\x1b[0m" if c else ""))
    legend = ("\n\n[\x1b[30;43mcopied\x1b[0m \x1b[30;46mneural draft\x1b[0m target's own]"
              if mode == "path" else "\n\n[background: probe score, white 0 -> red 1]")
    return "".join(pieces) + legend


METHODS = ["ar", "pld", "copyspec", "copy", "sps", "eagle3", "banditspec", "switchsd"]
# The neural drafters' defaults, each chosen with `bench.py neural` on prompts Table 1 does
# not use (README): "gamma", the lookahead (SPS: 6 with the int8 draft, README "The gamma
# sweep"), "threshold", the early stop (a token with q below it ends a draft), and "topk"
# (greedy), the drafter's choices per depth, runners-up verified as leaves (topk 1 = the
# papers' plain chain).
DRAFTER = {"sps": {"gamma": 6, "threshold": 0.7, "topk": 2},
           "eagle3": {"gamma": 4, "threshold": 0.7, "topk": 2}}
# The SPS draft's output layer: the lowest ids of the vocabulary plus the context's tokens
# (drafters.DraftModel); `bench.py neural --vocabs` and `bench.py passes --vocabs` (README).
SPS_VOCAB = 65536
# The SPS draft's weights: int8 halves a draft forward's bytes (llama.Int8Linear); `bench.py
# neural --quants` (README, "The draft's weights").
SPS_QUANT, QUANTS = "int8", ("int8", "none")


DTYPES = ("auto", "bfloat16", "float32")


def dtype_of(name: str, device="cpu") -> torch.dtype:
    """A --dtype choice as a torch dtype ("auto": llama.default_dtype)."""
    return llama.default_dtype(device) if name == "auto" else getattr(torch, name)


def drafter_option(kind: str, name: str, given):
    """A drafter's ("sps" or "eagle3") option `name`: the value given, else its default."""
    return given if given is not None else DRAFTER[kind][name]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="HF folder or a demo name (default: %(default)s)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    ap.add_argument("--method", default="ar", choices=METHODS)
    ap.add_argument("--copy-kappa", type=int, help="kappa-gram length that triggers a copy "
                    "(default: the probe's, else 5)")
    ap.add_argument("--copy-width", type=int, default=4, help="W: candidates verified per copy step")
    ap.add_argument("--copy-depth", type=int, default=20, help="D: longest copied candidate")
    ap.add_argument("--draft-model", help="SPS draft model (HF folder or demo name), same tokenizer")
    ap.add_argument("--eagle", help="EAGLE-3 head folder (official checkpoint layout)")
    ap.add_argument("--gamma", type=int, help="most tokens per neural draft (default: "
                    f"{DRAFTER['sps']['gamma']} for SPS, {DRAFTER['eagle3']['gamma']} for EAGLE-3)")
    ap.add_argument("--draft-threshold", type=float,
                    help="stop a draft after a token the drafter gives less than this probability "
                    f"(0 = always gamma tokens; default: {DRAFTER['sps']['threshold']} for SPS, "
                    f"{DRAFTER['eagle3']['threshold']} for EAGLE-3)")
    ap.add_argument("--draft-vocab", type=int, default=SPS_VOCAB,
                    help="SPS: draft among the N lowest token ids and the context's tokens (0 = all)")
    ap.add_argument("--draft-quant", default=SPS_QUANT, choices=QUANTS,
                    help="SPS: the draft model's weights, int8 or as --dtype (default: %(default)s)")
    ap.add_argument("--topk", type=int, help="greedy: the drafter's top-k at each depth, runners-up "
                    "verified as leaves beside the chain (1 = a plain chain; default: "
                    f"{DRAFTER['sps']['topk']} for SPS, {DRAFTER['eagle3']['topk']} for EAGLE-3)")
    ap.add_argument("--probe", help="probe file (default for switchsd: probes/<demo model>.safetensors)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto", choices=DTYPES,
                    help="auto: bfloat16 where the hardware has it, else float32 (llama.default_dtype)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text")
    ap.add_argument("--json", action="store_true", help="print one JSON object, no streaming")
    ap.add_argument("--show", nargs="?", const="path", choices=["path", "probe"],
                    help="colour the printed text by how each token was produced, or by probe score")
    return ap.parse_args(argv)


def check_same_vocab(target_tok, draft_tok, n_target: int, where: str):
    """A drafter must mean the same token by every id the target can emit."""
    t, d = target_tok.tok.get_vocab(with_added_tokens=True), draft_tok.tok.get_vocab(with_added_tokens=True)
    t = {k: v for k, v in t.items() if v < n_target}
    d = {k: v for k, v in d.items() if v < n_target}
    if t != d:
        diff = sorted(set(t.items()) ^ set(d.items()), key=lambda kv: kv[1])[:2]
        raise ValueError(f"{where}: tokenizer differs from the target's (e.g. {diff}); "
                         "a draft model must share the target's vocabulary")


def build(a):
    """Load the target and whatever the method needs: copier, neural drafter, probe."""
    from fetch import resolve
    folder = resolve(a.model)
    dtype = dtype_of(a.dtype, a.device)
    model, tok = llama.Model.from_pretrained(folder, dtype, a.device), llama.Tokenizer(folder)
    probe = None
    if a.probe or a.method == "switchsd":
        path = a.probe or Path(__file__).resolve().parent / "probes" / f"{Path(a.model).name}.safetensors"
        if not a.probe and not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no shipped probe for this model; pass --probe FILE "
                                    "(python probe.py train makes one)")
        probe = Probe.load(path, model)
    kappa = a.copy_kappa or (probe.kappa if probe else 5)
    if kappa < 1 or a.copy_width < 1 or a.copy_depth < 1 or a.copy_width * a.copy_depth >= MAX_TREE:
        raise ValueError(f"need --copy-kappa, --copy-width, --copy-depth >= 1 and W*D < {MAX_TREE}")
    copier = {"pld": PromptLookup(), "copyspec": CopySpec()}.get(a.method)
    if a.method in ("copy", "banditspec", "switchsd"):
        copier = CopyDrafter(kappa, a.copy_width, a.copy_depth)
    if a.method == "sps" and not a.draft_model:
        raise ValueError("--method sps needs --draft-model")
    if a.method == "eagle3" and not a.eagle:
        raise ValueError("--method eagle3 needs --eagle")
    if a.draft_model and a.eagle:
        raise ValueError("give --draft-model or --eagle, not both")
    if (a.draft_model or a.eagle) and a.method in ("ar", "pld"):
        raise ValueError(f"--method {a.method} uses no neural drafter (--draft-model, --eagle)")
    if any(v is not None and v < 1 for v in (a.gamma, a.topk)) or not 0 <= (a.draft_threshold or 0) < 1:
        raise ValueError("need --gamma >= 1, --topk >= 1 and 0 <= --draft-threshold < 1")
    neural = None
    if a.draft_model:
        dfolder = resolve(a.draft_model)
        draft = llama.Model.from_pretrained(dfolder, dtype, a.device, int8=a.draft_quant == "int8")
        check_same_vocab(tok, llama.Tokenizer(dfolder), model.args.vocab_size, str(dfolder))
        if draft.args.vocab_size > model.args.vocab_size:
            raise ValueError(f"{dfolder}: vocabulary of {draft.args.vocab_size} exceeds the target's "
                             f"{model.args.vocab_size}")
        neural = DraftModel(draft, drafter_option("sps", "gamma", a.gamma),
                            drafter_option("sps", "threshold", a.draft_threshold),
                            a.draft_vocab, drafter_option("sps", "topk", a.topk))
    if a.eagle:
        neural = Eagle3(Eagle3Head.load(a.eagle, model), model, drafter_option("eagle3", "gamma", a.gamma),
                        drafter_option("eagle3", "topk", a.topk),
                        drafter_option("eagle3", "threshold", a.draft_threshold))
    return model, tok, copier, neural, probe


def main(argv=None):
    a = parse_args(argv)
    if a.max_new_tokens < 1 or a.temperature < 0 or not 0 < a.top_p <= 1:
        raise ValueError("need --max-new-tokens >= 1, --temperature >= 0 and 0 < --top-p <= 1")
    if a.prompt_file:
        try:
            with open(a.prompt_file) as f:
                a.prompt = f.read()
        except OSError as e:
            raise FileNotFoundError(f"{a.prompt_file}: {e.strerror}") from None
    model, tok, copier, neural, probe = build(a)
    if a.show == "probe" and probe is None:
        raise ValueError("--show probe needs a probe (--probe or --method switchsd)")
    prompt_ids = tok.prompt_ids(a.prompt, chat=not a.no_chat)
    printed, out = "", []

    def stream(new):  # print the decoded difference; hold back half a UTF-8 character
        nonlocal printed
        out.extend(new)
        text = tok.decode(out)
        if not text.endswith("\ufffd"):
            print(text[len(printed):], end="", flush=True)
            printed = text

    res = generate(model, prompt_ids, a.method, copier, neural, probe, max_new_tokens=a.max_new_tokens,
                   temperature=a.temperature, top_p=a.top_p, seed=a.seed, stop_ids=tok.eos_ids,
                   on_tokens=None if a.json or a.show else stream)
    info = summary(res)
    if a.json:
        print(json.dumps({**info, "text": tok.decode(res.output_ids)}))
        return
    if a.show:
        print(show(tok, res, a.show))
    print(f"\n[{info['new_tokens']} tokens, {info['tokens_per_second']} tok/s, "
          f"{info['target_forwards']} target forwards, {info['mean_accepted']} tokens/forward, "
          f"stop: {res.stop}]", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")

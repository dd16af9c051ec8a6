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
import sys
import time
from dataclasses import dataclass, field

import torch

import llama
from drafters import CopyDrafter, CopySpec, PromptLookup, Tree, probs


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

def generate(model, prompt_ids, method="ar", copier=None, max_new_tokens=128, temperature=0.0,
             top_p=1.0, seed=0, stop_ids=(), on_tokens=None) -> Result:
    """Decode up to max_new_tokens after prompt_ids; on_tokens(new ids) streams output.

    method picks the policy below; copier is the copy drafter it uses (CopyDrafter,
    PromptLookup or CopySpec), or None for plain autoregressive decoding.
    """
    limit = model.args.max_seq_len
    if not prompt_ids:
        raise ValueError("prompt is empty")
    if len(prompt_ids) >= limit:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens; the model's context is {limit}")
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = model.new_cache(min(limit, len(prompt_ids) + max_new_tokens) + MAX_TREE)
    res = Result(prompt_ids=list(prompt_ids))
    ctx = list(prompt_ids)  # ctx[-1] is the current token: sampled, not yet run by the target
    t0 = time.perf_counter()

    with torch.inference_mode():
        # Prefill everything but the current token; its logits come with the first step.
        if len(ctx) > 1:
            mask, pos = llama.causal_mask(len(ctx) - 1, 0, dev)
            model(torch.tensor(ctx[:-1], device=dev), pos, mask, cache, logits_at=slice(0, 0))
        res.prefill_seconds = time.perf_counter() - t0

        while True:
            budget = min(max_new_tokens - len(res.output_ids), limit - len(ctx))
            if budget <= 0:
                res.stop = "length" if len(res.output_ids) >= max_new_tokens else "context"
                break
            ts = time.perf_counter()
            # 1. The policy: PLD, CopySpec and unguarded copy draft whenever they find a match.
            use_copy = copier is not None
            # 2. Draft: at most budget - 1 tokens deep, so accepted + bonus fit the budget.
            tree = copier.propose(ctx, budget - 1) if use_copy and budget > 1 else None
            path_name = "copy" if tree else "ar"
            tree = tree or Tree([ctx[-1]])
            # 3. Verify the whole tree in one target pass and accept the longest agreed path.
            path, bonus, _ = verify(model, cache, tree, temperature, top_p, gen)
            new = [tree.tokens[i] for i in path] + [bonus]
            res.steps.append(Step(path_name, len(tree) - 1, len(path), time.perf_counter() - ts))
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
    res.seconds = time.perf_counter() - t0
    return res


def summary(res: Result) -> dict:
    """The --json statistics, all derived from the step records."""
    n, steps = len(res.output_ids), res.steps
    copy = [s.accepted for s in steps if s.path == "copy"]
    hist = [0] * (max((s.accepted for s in steps), default=0) + 1)
    for s in steps:
        hist[s.accepted] += 1
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
    }


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="HF folder or a demo name (default: %(default)s)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    ap.add_argument("--method", default="ar", choices=["ar", "pld", "copyspec", "copy"])
    ap.add_argument("--copy-kappa", type=int, default=5, help="kappa-gram length that triggers a copy")
    ap.add_argument("--copy-width", type=int, default=4, help="W: candidates verified per copy step")
    ap.add_argument("--copy-depth", type=int, default=20, help="D: longest copied candidate")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text")
    ap.add_argument("--json", action="store_true", help="print one JSON object, no streaming")
    return ap.parse_args(argv)


def load(name_or_path, dtype, device):
    from fetch import resolve
    folder = resolve(name_or_path)
    return llama.Model.from_pretrained(folder, getattr(torch, dtype), device), llama.Tokenizer(folder)


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
    if a.copy_kappa < 1 or a.copy_width < 1 or a.copy_depth < 1 or a.copy_width * a.copy_depth >= MAX_TREE:
        raise ValueError(f"need --copy-kappa, --copy-width, --copy-depth >= 1 and W*D < {MAX_TREE}")
    copier = {"pld": PromptLookup, "copyspec": CopySpec, "ar": lambda: None,
              "copy": lambda: CopyDrafter(a.copy_kappa, a.copy_width, a.copy_depth)}[a.method]()
    model, tok = load(a.model, a.dtype, a.device)
    prompt_ids = tok.prompt_ids(a.prompt, chat=not a.no_chat)
    printed, out = "", []

    def stream(new):  # print the decoded difference; hold back half a UTF-8 character
        nonlocal printed
        out.extend(new)
        text = tok.decode(out)
        if not text.endswith("\ufffd"):
            print(text[len(printed):], end="", flush=True)
            printed = text

    res = generate(model, prompt_ids, a.method, copier, a.max_new_tokens, a.temperature, a.top_p,
                   a.seed, stop_ids=tok.eos_ids, on_tokens=None if a.json else stream)
    info = summary(res)
    if a.json:
        print(json.dumps({**info, "text": tok.decode(res.output_ids)}))
    else:
        print(f"\n[{info['new_tokens']} tokens, {info['tokens_per_second']} tok/s, "
              f"{info['target_forwards']} target forwards, stop: {res.stop}]", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")

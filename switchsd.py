"""SwitchSD: speculative decoding that copies only when the model itself says it is copying.

References:
  Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
  Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling" (SPS);
  Miao et al. 2024, "SpecInfer" (verifying a token tree in one pass).

The whole method is one loop (generate). Each step:
  1. the policy picks a path: copy from the context (the probe's gate), or else the neural
     drafter, a surface lookup or a plain step, whichever this run has found fastest;
  2. the drafter proposes a Tree of candidate tokens below the current token;
  3. verify() runs the target once over the tree, accepts the longest verified path
     plus one token of the target's own, and compacts the KV cache to that path.
Greedy output is token-identical to autoregressive decoding: with llama's exact kernels (the
default) a token's logits do not depend on its verification pass; with torch's own
(`--kernels fast`) a pass may round differently at a near-tie. Sampling is lossless.

Reading order: generate -> verify / accept -> choose / gate_open / CostSwitch -> llama.tree_mask
-> drafters.CopyDrafter -> Probe (below), then probe.py for how the probe is trained.

    python switchsd.py --model DIR|NAME --method switchsd --prompt "..."
"""
import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import llama
from drafters import (CopyConfig, CopyDrafter, CopySpec, DraftModel, Eagle3, Eagle3Config, Eagle3Head,
                      PromptLookup, QUANTS, SPSConfig, Tree, common_prefix, probs)
from fetch import resolve


MAX_TREE = 512  # most tokens one verification pass may carry (root + drafts)
POLICIES = ("cost", "paper")  # switchsd when the gate does not copy: fastest path (CostSwitch), or neural
GATES = ("probe", "kgram", "surface")  # switchsd's copy gate and its two ablations (gate_open)
SURFACE_MIN = 8  # the "surface" gate: a recurring suffix this long (data.surface_scores' cap)


# ---------------------------------------------------------------------------------------
# The probe's read-out: is the model copying right now?
# ---------------------------------------------------------------------------------------

@dataclass
class Probe:
    """The copy-intent probe (probe.py trains it): p(j) = sigmoid(w . H_j), H_j the residual
    stream at one layer and position. At decode time it is one dot product on a hidden state
    the target computed anyway; the file (safetensors) carries w, the layer, tau, kappa and
    the identity of the model it was trained for."""
    w: torch.Tensor  # (dim,) float32
    layer: int
    position: str  # "attn" (after the attention sublayer) or "mlp" (after the MLP)
    tau: float
    kappa: int
    meta: dict = field(default_factory=dict)  # the model's identity and validation figures

    @property
    def capture(self):
        return (self.position, self.layer)

    def score(self, h):
        """p(j) for hidden states h (..., dim)."""
        return torch.sigmoid(h.float() @ self.w.to(h.device))

    def save(self, path):
        meta = {"layer": self.layer, "position": self.position, "tau": self.tau, "kappa": self.kappa,
                **self.meta}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file({"w": self.w.float().contiguous()}, str(path),
                  metadata={k: json.dumps(v) for k, v in meta.items()})

    @classmethod
    def load(cls, path, model=None) -> "Probe":
        """Read a probe file; with a model, refuse a probe that was trained for another one."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: probe file not found")
        try:
            with safe_open(str(path), framework="pt") as f:
                w, raw = f.get_tensor("w"), f.metadata() or {}
            meta = {k: json.loads(v) for k, v in raw.items()}
            probe = cls(w.float(), int(meta.pop("layer")), meta.pop("position"),
                        float(meta.pop("tau")), int(meta.pop("kappa")), meta)
        except Exception as e:
            raise ValueError(f"{path}: not a probe file ({type(e).__name__}: {e})") from None
        if probe.position not in ("attn", "mlp") or w.ndim != 1:
            raise ValueError(f"{path}: not a probe file (position {probe.position!r}, w {tuple(w.shape)})")
        if model is not None:
            a, m = model.args, probe.meta
            for key, value in model_identity(model).items():
                if key != "model" and key in m and m[key] != value:
                    raise ValueError(f"{path}: probe made for a model with {key} {m[key]!r}, "
                                     f"this model has {value!r}")
            if len(w) != a.dim or not 0 <= probe.layer < a.n_layers:
                raise ValueError(f"{path}: probe of width {len(w)} at layer {probe.layer} does not "
                                 f"fit this model ({a.dim} wide, {a.n_layers} layers)")
        return probe


def model_identity(model, name="") -> dict:
    """What a probe file records of its model, so that it is never read against another."""
    a = model.args
    return {"model": name, "arch": a.arch, "hidden_size": a.dim, "n_layers": a.n_layers,
            "fingerprint": model.fingerprint()}


@dataclass
class Step:
    """One target forward: every statistic in the benchmarks is derived from these."""
    path: str  # "ar", "copy", "lookup" (CostSwitch's surface match) or "neural"; banditspec's copy
    #            arm is "copy" even when it found nothing
    drafted: int  # candidate tokens sent to the target besides the current one
    accepted: int  # drafted tokens accepted and emitted (a stop token cuts them; the bonus comes on top)
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

    Returns (accepted node indices, the bonus token, hidden states of [root] + accepted, and
    the target's top-token probability at those rows: in greedy decoding, its probability of
    each token emitted, CostSwitch's forecast of how well a drafter would do here).
    """
    n = cache.n
    mask, pos = llama.tree_mask(tree.parents, n, model.device)
    ids = torch.tensor(tree.tokens, device=model.device)
    logits, hidden = model(ids, pos, mask, cache, capture)  # (T, V)
    path, bonus = accept(logits, tree, temperature, top_p, gen)
    rows = [0, *path]
    cache.keep(n, rows)
    top = logits[rows].float().softmax(-1).amax(-1)  # (len(rows),)
    return path, bonus, {k: h[rows] for k, h in hidden.items()}, top.tolist()


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

    The residual max(0, p - q) has mass sum(max(0, p - q)) = P(reject): where that is zero up
    to rounding (q == p), a rejection had probability zero and only rounding produced it; p
    itself then stands in for the residual (0 / 0 otherwise), which moves the output
    distribution by at most that mass (below 1e-6).
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
            r = p.clone()
            if q is None:
                r[x] = 0.0
            else:
                r = (p - q).clamp_min(0.0)
            mass = r.sum()
            if mass > 1e-6:
                p = r / mass
        else:
            return path, torch.multinomial(p, 1, generator=gen).item()


# ---------------------------------------------------------------------------------------
# The decode loop
# ---------------------------------------------------------------------------------------

def generate(model, prompt_ids, method="ar", copier=None, neural=None, probe=None,
             max_new_tokens=128, temperature=0.0, top_p=1.0, seed=0, stop_ids=(),
             on_tokens=None, policy="cost", gate="probe") -> Result:
    """Decode up to max_new_tokens after prompt_ids; on_tokens(new ids) streams output.

    copier: a copy drafter (CopyDrafter, PromptLookup, CopySpec) or None.
    neural: a neural drafter (DraftModel for SPS, Eagle3 for EAGLE3), or None for plain
            autoregressive steps whenever the policy does not copy.
    probe:  the copy-intent probe (Probe, above); SwitchSD's gate, and per-token scores.
    method: which path drafts each step (see choose): "switchsd" copies where its gate opens
            and otherwise asks its `policy` ("cost": CostSwitch's fastest path; "paper": the
            neural drafter); "banditspec" lets UCBSpec pick copy or neural at every step; the
            others copy whenever the copier finds a match ("ar", "sps" and "eagle3" have none).
    gate:   switchsd's copy gate, "probe" as the paper, or an ablation (see gate_open).
    """
    limit = model.args.max_seq_len
    if not prompt_ids:
        raise ValueError("prompt is empty")
    if len(prompt_ids) >= limit:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens; the model's context is {limit}")
    if policy not in POLICIES or gate not in GATES:
        raise ValueError(f"policy {policy!r}, gate {gate!r}: expected one of {POLICIES}, {GATES}")
    if method == "switchsd" and (copier is None or gate == "probe" and probe is None):
        raise ValueError("switchsd needs a copy drafter, and a probe for its gate")
    if method == "banditspec" and copier is None:
        raise ValueError("banditspec needs a copy drafter")
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    max_len = min(limit, len(prompt_ids) + max_new_tokens) + MAX_TREE
    cache = model.new_cache(max_len)
    for d in (copier, neural):
        if d is not None:
            d.reset(max_len)
    switch = (UCBSpec(["copy", "neural"]) if method == "banditspec" else
              CostSwitch(["lookup", "neural", "ar"] if neural else ["lookup", "ar"])
              if method == "switchsd" and policy == "cost" else None)
    capture = ((probe.capture,) if probe else ()) + (neural.capture if neural else ())
    res = Result(prompt_ids=list(prompt_ids))
    ctx = list(prompt_ids)  # ctx[-1] is the current token: sampled, not yet run by the target
    scores = []  # probe score of each output token, from the pass that ran it
    t0 = time.perf_counter()

    with torch.inference_mode():
        # Prefill everything but the current token; its logits come with the first step. Every
        # method runs this same pass, so it needs no batch-invariant kernels, which would read
        # the weights once per 32 prompt tokens (llama.tiled; docs/performance.md).
        hidden = {}
        if len(ctx) > 1:
            mask, pos = llama.causal_mask(len(ctx) - 1, 0, dev)
            _, hidden = model(torch.tensor(ctx[:-1], device=dev), pos, mask, cache, capture,
                              logits_at=slice(0, 0), exact=False)
        if neural:
            neural.observe(hidden)  # EAGLE3 reads the prompt's features here
        score = probe.score(hidden[probe.capture][-1]).item() if probe and hidden else 0.0
        res.prefill_seconds = time.perf_counter() - t0
        if isinstance(switch, CostSwitch) and neural:  # a step's cost and a prefill's go by weights:
            share = CostSwitch.share(neural, model)
            switch.price = res.prefill_seconds * share  # the drafter's prefill, to come
            switch.measure(neural.gamma, share)

        while True:
            budget = min(max_new_tokens - len(res.output_ids), limit - len(ctx))
            if budget <= 0:
                res.stop = "length" if len(res.output_ids) >= max_new_tokens else "context"
                break
            ts = time.perf_counter()
            depth = budget - 1  # drafts at most this deep, so that accepted + bonus fit the budget
            # 1. The policy: which path drafts this step? (Nothing to choose when there is no
            #    room to draft.)
            arm = choose(method, ctx, depth, score, copier, probe, switch, gate) if depth > 0 else None
            kind = arm or "ar"
            # 2. Draft. A copier that finds nothing hands the step to the neural drafter, except
            #    the bandit's copy arm: its empty draft is an AR step on the copy arm's account.
            tree = (copier.propose(ctx, depth) if kind == "copy" else
                    switch.draft(arm, model.step_rows) if arm in ("lookup", "ar") else None)
            if kind == "copy" and tree is None and method != "banditspec":
                kind = "neural"
            if kind == "neural" and neural is None:
                kind = "ar"
            if kind == "neural":
                tree = neural.propose(ctx, depth, temperature, top_p, gen)
            if tree is None:
                tree = Tree([ctx[-1]])
            # 3. Verify the whole tree in one target pass and accept the longest agreed path.
            path, bonus, hidden, top = verify(model, cache, tree, temperature, top_p, gen, capture)
            if neural:
                neural.observe(hidden)  # features of the accepted tokens, for its next draft
            if probe:
                s = probe.score(hidden[probe.capture]).tolist()  # rows: current + accepted
                scores += s if res.output_ids else s[1:]  # the first current token is the prompt's
                score = s[-1]
            new = [tree.tokens[i] for i in path] + [bonus]
            # An end-of-sequence token, drafted or not, ends generation right after it; the
            # step's record and the bandit's reward count only the tokens emitted.
            end = next((i + 1 for i, t in enumerate(new) if t in stop_ids), None)
            new = new[:end]
            res.steps.append(Step(kind, len(tree) - 1, min(len(path), len(new)), time.perf_counter() - ts))
            if switch and arm in switch.arms:  # (CostSwitch does not choose the gate's copies)
                switch.update(arm, len(new), res.steps[-1].seconds, top[:len(new)])
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


def choose(method, ctx, depth, score, copier, probe, switch, gate="probe") -> str:
    """The path that drafts this step: "copy", "lookup", "neural" or "ar".

    SwitchSD: copy where the gate opens (gate_open, the paper's rule); elsewhere the paper
    always drafts with the neural drafter (policy "paper", switch None), and CostSwitch picks
    the path this run has found fastest (policy "cost"). BanditSpec, the baseline the SwitchSD
    paper ran: UCBSpec picks copy or neural at every step without looking at the context, and
    the copy arm drafts whatever a surface match finds (here PLD's n-gram lookup), possibly
    nothing. PLD, CopySpec and unguarded copy try whenever they find a match.
    """
    if method == "switchsd":
        if gate_open(gate, ctx, score, copier, probe):
            return "copy"
        on = score >= probe.tau if gate == "probe" else True  # the ablations use no probe anywhere
        return switch.pick(ctx, depth, on) if switch else "neural"
    if method == "banditspec":
        return switch.pick()
    return "copy" if copier is not None else "neural"


def gate_open(gate, ctx, score, copier, probe) -> bool:
    """SwitchSD's gate, the paper's decision rule: copy iff the probe reads copy intent in the
    last hidden state, score >= tau, AND the kappa-gram ending at the current token occurred
    before. Two ablations measure what the probe adds (docs/results.md): "kgram" drops it,
    "surface" puts the string's own evidence in its place, a recurring suffix of SURFACE_MIN
    tokens (the surface score probe.py ranks the label with, data.surface_scores)."""
    if not copier.matches(ctx):
        return False
    if gate == "probe":
        return score >= probe.tau
    if gate == "surface":
        return copier.match_length(ctx, SURFACE_MIN) >= SURFACE_MIN
    return True


class CostSwitch:
    """SwitchSD's choice where the gate does not copy (policy "cost"): the path with the most
    tokens per second so far in this run, its lookups read through the probe.

    The paper's switch drafts with the neural drafter whenever it does not copy, which assumes
    a draft nearly free beside the target's pass, as on a GPU. On a CPU a step of the 0.5B SPS
    draft costs ~2.4 target steps and a surface lookup ~1.05 (docs/performance.md). The paths:
        lookup  PLD's surface match (drafters.PromptLookup), offered only where it finds one;
        neural  the neural drafter (when the run has one);
        ar      a plain target step; where PLD finds a match, the rows the exact kernels compute
                anyway (llama.Model.step_rows: 4 in float32 on a CPU) carry its first tokens.
    A path's rate is tokens emitted / seconds spent over its steps, the older ones decayed by
    `decay` per step, so that the estimate follows the text.

    A lookup needs no trial: once the text has passed a lookup's draft, its agreement with the
    tokens emitted there is what it would have accepted (exactly in greedy decoding; in
    sampling, with the very probability the target samples it). So every lookup found is
    scored, played or not (`shadows`), its scores kept apart by what predicts them (does the
    probe read copy intent, PLD's match length 1-3), and none is played where it would accept
    nothing. Its seconds come from its own plays, before the first from the fastest step so far.

    The neural drafter is bought, not tried: its first step also runs its own prefill of the
    prompt (17 target steps for a 700-token article in float32), sunk once paid. By the
    ski-rental rule (Karlin et al. 1988) it is offered once the steps without it have lost
    (`spent`: their time beyond what the drafter, accepting all it drafts, would have taken
    for their tokens) as much as that prefill costs (`price`, the target's prefill scaled by
    weights). A forecast moves that point (Purohit et al. 2018): the target's mean top-token
    probability a over the emitted tokens forecasts a draft step's tokens, sum_{i<=gamma} a^i,
    per `cost` plain steps; the drafter is bought at price x `trust` where that beats what the
    steps without it earned, at price / `trust` where not, which keeps the total within
    1 + 1 / trust of the best choice's. Once bought, its step replaces the plain step: it stops
    after a token it doubts (drafters.SPSConfig.threshold), so where it fails it costs about a
    plain step. The other paths are tried `trials` times; the drafter is played again when left
    unplayed for `stale` picks. What each piece is worth, replayed: docs/results.md, "The
    switch". The choice never changes what is emitted: every draft is verified as before.
    """
    decay, trials, stale, trust = 0.8, 2, 32, 0.5

    def __init__(self, arms):
        self.arms = list(arms)
        self.lookup, self.found = PromptLookup(), None  # found: this pick's lookup draft
        self.tokens, self.seconds, self.steps = ({a: 0.0 for a in self.arms} for _ in range(3))  # decayed sums
        self.plays, self.last = dict.fromkeys(self.arms, 0), dict.fromkeys(self.arms, 0)  # last: the pick it last played
        self.shadows = []  # (len(ctx), draft, key) of lookup drafts the text has not yet passed
        self.scored, self.n = {}, {}  # key -> decayed tokens a lookup step would have emitted, and their count
        self.t, self.fastest, self.key = 0, math.inf, None  # picks so far; the fastest step so far, in seconds
        self.primed = False  # has the neural drafter run its prefill?
        self.price, self.gamma, self.cost = 0.0, 0, 1.0  # its prefill's seconds; its step's drafts and plain steps
        self.spent = 0.0  # seconds the steps before its prefill took beyond what it would have at best
        self.sure, self.emitted = 0.0, 0.0  # decayed sums: the target's top-token probabilities, tokens

    def score_shadows(self, ctx):
        """Score the lookup drafts that the emitted text `ctx` has passed: accepted + 1 tokens."""
        waiting = []
        for at, draft, key in self.shadows:
            out = ctx[at:at + len(draft)]
            accepted = common_prefix(draft, out)
            if accepted == len(out) < len(draft):  # agreed so far, and the text has not passed it
                waiting.append((at, draft, key))
                continue
            self.scored[key] = self.decay * self.scored.get(key, 0.0) + accepted + 1
            self.n[key] = self.decay * self.n.get(key, 0.0) + 1
        self.shadows = waiting

    def rate(self, arm: str) -> float:
        if arm == "lookup":
            seconds = self.seconds["lookup"] / self.steps["lookup"] if self.plays["lookup"] else self.fastest
            return self.scored[self.key] / self.n[self.key] / seconds
        if self.plays[arm] < self.trials:
            return math.inf
        return self.tokens[arm] / max(self.seconds[arm], 1e-9)

    def pick(self, ctx, depth, on: bool) -> str:
        """The path for this step; on: does the probe read copy intent?"""
        self.t += 1
        self.score_shadows(ctx)
        self.found = self.lookup.propose(ctx, depth) if "lookup" in self.arms else None
        if self.primed:  # bought: its prefill is sunk, and its step replaces the plain step
            offered = ["neural"]
        else:
            offered = [a for a in self.arms if a != "lookup" and (a != "neural" or self.spent >= self.threshold())]
        if self.found is not None:
            self.key = (on, self.lookup.matched)
            self.shadows.append((len(ctx), self.found.tokens[1:], self.key))
            if self.key in self.n:  # scored before: its rate is known
                offered.insert(0, "lookup")
        if "neural" in offered and self.plays["neural"] and self.t - self.last["neural"] > self.stale:
            return "neural"
        return max(offered, key=self.rate)  # ties (an untried drafter) go to the first

    def plain(self) -> float:
        """Seconds of a plain step: as measured, or before the first the fastest step so far."""
        return self.seconds["ar"] / self.steps["ar"] if self.plays["ar"] else self.fastest

    @staticmethod
    def share(neural, target) -> float:
        """A draft pass's cost in target passes, and a draft prefill's in the target's: by weights."""
        return neural.weights / llama.n_weights(target)

    def measure(self, gamma: int, share: float):
        """The neural drafter's step: gamma drafts, each a pass of `share` of the target's weights."""
        self.gamma, self.cost = gamma, 1 + gamma * share  # in plain steps

    def threshold(self) -> float:
        """The loss at which the neural drafter is bought: its price, scaled by the forecast."""
        renters = [k for k in self.arms if k != "neural"]
        if not self.emitted or not any(self.plays[k] for k in renters):
            return self.price  # nothing to forecast from yet
        a = self.sure / self.emitted  # the target's mean confidence
        forecast = sum(a ** i for i in range(self.gamma + 1)) / self.cost  # tokens per plain step, bought
        renting = sum(self.tokens[k] for k in renters) * self.plain() / sum(self.seconds[k] for k in renters)
        return self.price * self.trust if forecast > renting else self.price / self.trust

    def draft(self, arm: str, rows: int):
        """The draft of a step of `arm` ("lookup" or "ar") at this pick: the lookup's whole, or
        its first rows - 1 tokens in a plain step's spare rows (llama.Model.step_rows)."""
        if self.found is None or arm == "lookup":
            return self.found
        return Tree.chain(self.found.tokens[0], self.found.tokens[1:rows])

    def update(self, arm: str, tokens: int, seconds: float, top=()):
        """A step of `arm`, picked at the last pick, emitted `tokens` in `seconds`; top: the
        target's top-token probability at each (verify)."""
        self.last[arm] = self.t
        self.sure = self.decay * self.sure + sum(top)
        self.emitted = self.decay * self.emitted + len(top)
        if arm == "neural" and not self.primed:  # its prefill: sunk, not a cost of its next steps
            self.primed = True
            return
        self.fastest = min(self.fastest, seconds)
        self.plays[arm] += 1
        self.tokens[arm] = self.decay * self.tokens[arm] + tokens
        self.seconds[arm] = self.decay * self.seconds[arm] + seconds
        self.steps[arm] = self.decay * self.steps[arm] + 1
        if not self.primed:  # the rent: what the drafter, accepting all it drafts, could have saved
            self.spent += seconds - tokens * self.cost / (self.gamma + 1) * self.plain()


class UCBSpec:
    """UCBSpec, the UCB algorithm of BanditSpec (Hou et al. 2025, "BanditSpec: Adaptive
    Speculative Decoding via Bandit Algorithms"), over drafting arms.

    Every step plays one arm, and its reward is the step's raw throughput: tokens emitted /
    seconds spent drafting and verifying, unnormalised, as the authors' code measures it
    (github.com/sail-sg/BanditSpec, generate_utils.py, ucb_length_spec_generate). Each arm is
    played `warmup` times in turn, then the arm with the largest upper confidence bound
        mean_a + sqrt(c ln t / n_a),   c = 6 (the code's exploration_weight),
    t the steps played so far and n_a those of arm a.

    Where this differs from the authors' code:
      - the arms: copy or neural drafting, the BanditSpec baseline of the SwitchSD paper;
        the code's arms are EAGLE draft lengths gamma = 1..4;
      - the bonus divides by n_a, as UCB1 (Auer et al. 2002) does; the code divides by all the
        steps played, which gives every arm the same bonus, so that after its warm-up it
        always plays the best mean and never revisits an arm that started badly;
      - the warm-up plays each arm twice in turn; the code plays gamma 1, 2, 3, 4, 1, 2, 3.
    Rewards are not scaled to [0, 1] as UCB1's analysis assumes: the bonus, a few units,
    decides only between arms within a few tokens per second of each other.
    """
    c = 6.0
    warmup = 2

    def __init__(self, arms):
        self.arms = list(arms)
        self.n = {a: 0 for a in self.arms}
        self.total = {a: 0.0 for a in self.arms}  # summed rewards, tokens per second

    def pick(self) -> str:
        first = min(self.arms, key=self.n.get)  # the least played, the first of a tie
        if self.n[first] < self.warmup:
            return first
        t = sum(self.n.values())
        return max(self.arms, key=lambda a: self.total[a] / self.n[a] + math.sqrt(self.c * math.log(t) / self.n[a]))

    def update(self, arm: str, tokens: int, seconds: float, top=()):
        """A step of `arm` emitted `tokens` in `seconds` (top, the target's confidence that
        CostSwitch reads, is not part of the bandit's reward)."""
        self.n[arm] += 1
        self.total[arm] += tokens / max(seconds, 1e-9)


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
        "copy_attempts": len(copy),  # banditspec: every step of its copy arm, found or not
        "copy_zero_accept": copy.count(0),  # the speculation tax: passes that copied nothing
        "copy_accepted_mean": round(sum(copy) / len(copy), 4) if copy else 0.0,
        "copy_steps": len(copy),
        "neural_steps": sum(s.path == "neural" for s in steps),
        "lookup_steps": sum(s.path == "lookup" for s in steps),  # switchsd's CostSwitch
        "copy_rate": round(len(copy) / len(steps), 4) if steps else 0.0,  # activation rate
        "accepted_by_path": {p: round(sum(a) / len(a), 4) for p, a in by_path.items()},
        **({"probe_scores": res.probe_scores} if res.probe_scores is not None else {}),
    }


# ---------------------------------------------------------------------------------------
# Methods: which drafters each one uses
# ---------------------------------------------------------------------------------------

METHODS = ["ar", "pld", "copyspec", "copy", "sps", "eagle3", "banditspec", "switchsd"]
DTYPES = ("auto", "bfloat16", "float32")
KERNELS = {"exact": True, "fast": False}  # --kernels -> llama.Model.from_pretrained(exact=)


def dtype_of(name: str, device="cpu") -> torch.dtype:
    """A --dtype choice as a torch dtype ("auto": llama.default_dtype)."""
    return llama.default_dtype(device) if name == "auto" else getattr(torch, name)


def quant_of(name: str, device="cpu") -> str:
    """A --draft-quant choice as "int8" or "none" ("auto": llama.default_quant)."""
    return llama.default_quant(device) if name == "auto" else name


def make_drafters(method: str, target, *, copy=CopyConfig(), draft=None, sps=SPSConfig(), head=None,
                  eagle=Eagle3Config()):
    """The drafters a method uses, (copier, neural): the one place that maps methods to drafters.

    draft: an SPS draft model (llama.Model), head: an Eagle3Head; with neither, the neural
    path is plain autoregressive steps (so "switchsd" alone is the copy path plus AR steps).
    copy: SwitchSD's retriever ("copy", "switchsd"). BanditSpec's copy arm drafts from a
    surface match, as in the SwitchSD paper's baseline: PLD's n-gram lookup is our choice.
    """
    if draft is not None and head is not None:
        raise ValueError("give --draft-model or --eagle, not both")
    if (draft is not None or head is not None) and method in ("ar", "pld"):
        raise ValueError(f"--method {method} uses no neural drafter (--draft-model, --eagle)")
    if method == "sps" and draft is None:
        raise ValueError("--method sps needs --draft-model")
    if method == "eagle3" and head is None:
        raise ValueError("--method eagle3 needs --eagle")
    copier = {"pld": PromptLookup(), "copyspec": CopySpec(), "banditspec": PromptLookup()}.get(method)
    if method in ("copy", "switchsd"):
        copier = CopyDrafter(copy)
    neural = (DraftModel(draft, sps, target.args.vocab_size) if draft is not None
              else Eagle3(head, target, eagle) if head is not None else None)
    return copier, neural


def check_same_vocab(target_tok, draft_tok, n_target: int, where: str):
    """A drafter must mean the same token by every id the target can emit."""
    t, d = target_tok.tok.get_vocab(with_added_tokens=True), draft_tok.tok.get_vocab(with_added_tokens=True)
    t = {k: v for k, v in t.items() if v < n_target}
    d = {k: v for k, v in d.items() if v < n_target}
    if t != d:
        diff = sorted(set(t.items()) ^ set(d.items()), key=lambda kv: kv[1])[:2]
        raise ValueError(f"{where}: tokenizer differs from the target's (e.g. {diff}); "
                         "a draft model must share the target's vocabulary")


def load_draft(folder, target, tok, dtype, device, quant: str):
    """An SPS draft model, refused unless it shares the target's tokenizer."""
    draft = llama.Model.from_pretrained(folder, dtype, device, int8=quant_of(quant, device) == "int8",
                                        exact=False)  # only proposes
    check_same_vocab(tok, llama.Tokenizer(folder), target.args.vocab_size, str(folder))
    if draft.args.vocab_size > target.args.vocab_size:
        raise ValueError(f"{folder}: vocabulary of {draft.args.vocab_size} exceeds the target's "
                         f"{target.args.vocab_size}")
    return draft


def shipped_probe(model_name: str) -> Path:
    """probes/<name>.safetensors: the probe shipped for a demo model."""
    return Path(__file__).resolve().parent / "probes" / f"{Path(model_name).name}.safetensors"


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def provenance(res: Result) -> list[str]:
    """How each output token was produced: "copy", "lookup", "neural" (drafted, then verified) or
    "target" (the target's own token: every step's bonus token). A plain step's drafted tokens
    are the lookup's head, carried in its spare rows (CostSwitch.draft): "lookup"."""
    kinds = []
    for s in res.steps:
        kinds += ["lookup" if s.path == "ar" else s.path] * s.accepted + ["target"]
    return kinds[:len(res.output_ids)]


def show(tok, res: Result, mode: str) -> str:
    """The output with ANSI background colours: by provenance, or shaded by probe score."""
    colour = {"copy": "\x1b[30;43m", "lookup": "\x1b[30;42m", "neural": "\x1b[30;46m", "target": ""}
    kinds, pieces = provenance(res), []
    for i, piece in enumerate(tok.pieces(res.output_ids)):
        if mode == "path":
            c = colour[kinds[i]]
        else:
            s = res.probe_scores[i]
            c = "" if s is None else f"\x1b[30;48;2;255;{int(255 - 200 * s)};{int(255 - 255 * s)}m"
        pieces.append(c + piece + ("\x1b[0m" if c else ""))
    legend = ("\n\n[\x1b[30;43mcopied\x1b[0m \x1b[30;42mlooked up\x1b[0m \x1b[30;46mneural draft\x1b[0m target's own]"
              if mode == "path" else "\n\n[background: probe score, white 0 -> red 1]")
    return "".join(pieces) + legend


def parse_args(argv=None):
    C, S, E = CopyConfig(), SPSConfig(), Eagle3Config()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="HF folder or a demo name (default: %(default)s)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file (UTF-8)")
    ap.add_argument("--method", default="ar", choices=METHODS)
    ap.add_argument("--copy-kappa", type=int, help=f"kappa-gram length that triggers a copy "
                    f"(default: the probe's, else {C.kappa})")
    ap.add_argument("--copy-width", type=int, default=C.width, help="W: candidates verified per copy step")
    ap.add_argument("--copy-depth", type=int, default=C.depth, help="D: longest copied candidate")
    ap.add_argument("--copy-rows", type=int, default=C.rows,
                    help="most tokens in a copy step's pass; later candidates are cut to fit (default: %(default)s)")
    ap.add_argument("--draft-model", help="SPS draft model (HF folder or demo name), same tokenizer")
    ap.add_argument("--eagle", help="EAGLE-3 head folder (official checkpoint layout)")
    ap.add_argument("--gamma", type=int, help=f"most tokens per neural draft (default: {S.gamma} for SPS, "
                    f"{E.gamma} for EAGLE-3)")
    ap.add_argument("--draft-threshold", type=float,
                    help="stop a draft after a token the drafter gives less than this probability "
                    f"(0 = always gamma tokens; default: {S.threshold} for SPS, {E.threshold} for EAGLE-3)")
    ap.add_argument("--draft-vocab", type=int, default=S.vocab,
                    help="SPS: draft among the N lowest token ids and the context's tokens (0 = all)")
    ap.add_argument("--draft-quant", default=S.quant, choices=QUANTS,
                    help="SPS: the draft model's weights, int8 or as --dtype; auto: int8 on a CPU with VNNI "
                    "(default: %(default)s)")
    ap.add_argument("--topk", type=int, help="greedy: the drafter's top-k at each depth, runners-up "
                    f"verified as leaves beside the chain (1 = a plain chain; default: {S.topk} for SPS, "
                    f"{E.topk} for EAGLE-3)")
    ap.add_argument("--probe", help="probe file (default for switchsd: probes/<demo model>.safetensors)")
    ap.add_argument("--policy", default="cost", choices=POLICIES,
                    help="switchsd where its gate does not copy: cost = the fastest of neural draft, surface "
                    "lookup and plain step, timed on this run (CostSwitch); paper = always the neural drafter")
    ap.add_argument("--gate", default="probe", choices=GATES,
                    help="switchsd's copy gate: probe AND kappa-gram (the paper); kgram = the kappa-gram alone; "
                    f"surface = a recurring suffix of {SURFACE_MIN} tokens (ablations)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto", choices=DTYPES,
                    help="auto: bfloat16 where the hardware has it, else float32 (llama.default_dtype)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kernels", default="exact", choices=KERNELS,
                    help="exact: batch-invariant products and attention, so a token's logits do not depend "
                    "on its verification pass; fast: torch's own (llama.Model.set_exact)")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text")
    ap.add_argument("--json", action="store_true", help="print one JSON object, no streaming")
    ap.add_argument("--show", nargs="?", const="path", choices=["path", "probe"],
                    help="colour the printed text by how each token was produced, or by probe score")
    ap.add_argument("--compare", action="store_true",
                    help="also decode autoregressively and print the speedup and whether the text is the same")
    return ap.parse_args(argv)


def given(cfg, **options):
    """cfg with the options the command line set (None: not given, the config's default stays)."""
    return replace(cfg, **{k: v for k, v in options.items() if v is not None})


def check_args(a):
    """Refuse a bad flag value in one line that names the flag."""
    def need(ok, flag, value, rule):
        if not ok:
            raise ValueError(f"{flag} {value}: must be {rule}")
    need(a.max_new_tokens >= 1, "--max-new-tokens", a.max_new_tokens, ">= 1")
    need(a.temperature >= 0, "--temperature", a.temperature, ">= 0")
    need(0 < a.top_p <= 1, "--top-p", a.top_p, "in (0, 1]")
    need(a.copy_kappa is None or a.copy_kappa >= 1, "--copy-kappa", a.copy_kappa, ">= 1")
    need(a.copy_width >= 1, "--copy-width", a.copy_width, ">= 1")
    need(a.copy_depth >= 1, "--copy-depth", a.copy_depth, ">= 1")
    need(2 <= a.copy_rows <= MAX_TREE, "--copy-rows", a.copy_rows, f"in [2, {MAX_TREE}] (tokens one "
         "verification pass may carry)")
    need(a.gamma is None or a.gamma >= 1, "--gamma", a.gamma, ">= 1")
    need(a.topk is None or a.topk >= 1, "--topk", a.topk, ">= 1")
    gamma, topk = a.gamma or SPSConfig.gamma, a.topk or SPSConfig.topk
    if a.eagle:
        gamma, topk = a.gamma or Eagle3Config.gamma, a.topk or Eagle3Config.topk
    need(gamma * topk < MAX_TREE, "--gamma x --topk", gamma * topk,
         f"< {MAX_TREE} (tokens one verification pass may carry)")
    need(a.draft_threshold is None or 0 <= a.draft_threshold < 1, "--draft-threshold", a.draft_threshold,
         "in [0, 1)")
    need(a.draft_vocab >= 0, "--draft-vocab", a.draft_vocab, ">= 0 (0 = the whole vocabulary)")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {a.device}: CUDA is not available on this machine (use --device cpu)")


def build(a):
    """Load the target and whatever the method needs: copier, neural drafter, probe."""
    folder = resolve(a.model)
    dtype = dtype_of(a.dtype, a.device)
    model = llama.Model.from_pretrained(folder, dtype, a.device, exact=KERNELS[a.kernels])
    tok = llama.Tokenizer(folder)
    probe = None
    if a.probe or a.method == "switchsd" and a.gate == "probe":
        path = a.probe or shipped_probe(a.model)
        if not a.probe and not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no shipped probe for this model; pass --probe FILE "
                                    "(python probe.py train makes one)")
        probe = Probe.load(path, model)
    kappa = a.copy_kappa if a.copy_kappa is not None else probe.kappa if probe else None
    copy = given(CopyConfig(), kappa=kappa, width=a.copy_width, depth=a.copy_depth, rows=a.copy_rows)
    neural = dict(gamma=a.gamma, threshold=a.draft_threshold, topk=a.topk)
    draft = load_draft(resolve(a.draft_model), model, tok, dtype, a.device, a.draft_quant) if a.draft_model else None
    head = Eagle3Head.load(a.eagle, model) if a.eagle else None
    copier, neural = make_drafters(a.method, model, copy=copy, draft=draft, head=head,
                                   sps=given(SPSConfig(), vocab=a.draft_vocab, quant=a.draft_quant, **neural),
                                   eagle=given(Eagle3Config(), **neural))
    return model, tok, copier, neural, probe


def read_prompt(a) -> str:
    if not a.prompt_file:
        return a.prompt
    try:
        with open(a.prompt_file, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise FileNotFoundError(f"{a.prompt_file}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{a.prompt_file}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def main(argv=None):
    a = parse_args(argv)
    check_args(a)
    text = read_prompt(a)
    model, tok, copier, neural, probe = build(a)
    if a.show == "probe" and probe is None:
        raise ValueError("--show probe needs a probe (--probe or --method switchsd)")
    prompt_ids = tok.prompt_ids(text, chat=not a.no_chat)

    def run(method, copier, neural, probe, n=a.max_new_tokens, on_tokens=None):
        return generate(model, prompt_ids, method, copier, neural, probe, max_new_tokens=n,
                        temperature=a.temperature, top_p=a.top_p, seed=a.seed, stop_ids=tok.eos_ids,
                        on_tokens=on_tokens, policy=a.policy, gate=a.gate)

    if a.compare:  # warm up, so that neither timed run pays for torch's first calls
        run(a.method, copier, neural, probe, n=8)
    printed, out = "", []

    def stream(new):  # print the decoded difference; hold back half a UTF-8 character
        nonlocal printed
        out.extend(new)
        text = tok.decode(out)
        if not text.endswith("\ufffd"):
            print(text[len(printed):], end="", flush=True)
            printed = text

    res = run(a.method, copier, neural, probe, on_tokens=None if a.json or a.show else stream)
    info = summary(res)
    if a.compare:
        ar = summary(run("ar", None, None, None))
        same = ar["output_ids"] == info["output_ids"]
        info["compare_ar"] = {"tokens_per_second": ar["tokens_per_second"], "mean_accepted": ar["mean_accepted"],
                              "identical": same}
    if a.json:
        print(json.dumps({**info, "text": tok.decode(res.output_ids)}))
        return
    if a.show:
        print(show(tok, res, a.show))
    print(f"\n[{info['new_tokens']} tokens, {info['tokens_per_second']} tok/s, "
          f"{info['target_forwards']} target forwards, {info['mean_accepted']} tokens/forward, "
          f"stop: {res.stop}]", file=sys.stderr)
    if a.compare:
        c = info["compare_ar"]
        speedup = info["tokens_per_second"] / c["tokens_per_second"] if c["tokens_per_second"] else 0.0
        print(f"[vs --method ar: {speedup:.2f}x the tokens/s ({info['tokens_per_second']} vs "
              f"{c['tokens_per_second']}), {info['mean_accepted']} vs {c['mean_accepted']} tokens per target "
              f"forward; text {'identical' if c['identical'] else 'DIFFERENT'}"
              f"{'' if c['identical'] or a.temperature == 0 else ' (sampling: expected)'}]", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")

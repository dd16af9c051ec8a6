"""SwitchSD's copy-intent probe: is the model copying from its context right now?

    p_l(j) = sigmoid(w_l . H_j^(l))                                  (the probe, no bias)
    min_w  mean_j BCE(p_l(j), Y_j) + (lambda / 2) ||w_l||^2           (its training objective)

H_j^(l) is the residual stream after layer l's attention sublayer at token j, and Y_j = 1
iff token j lies in a verbatim repeat of >= kappa tokens of its context (data.copy_labels).
One probe is trained per layer on the target's own completions; the layer with the best
validation F1 is kept, with the threshold tau that maximises F1 on the same split. At decode
time the probe is one dot product on a hidden state the target computed anyway.

The probe itself, its file and its read-out are switchsd.Probe; this file trains it.

    python probe.py train --model DIR --out probes/NAME.safetensors      # whole pipeline
    python probe.py completions --model DIR --out FILE.jsonl [--batch N]  # its first stage
    python probe.py features --model DIR --completions FILE.jsonl --out FOLDER  # its second
    python probe.py eval  --model DIR --probe FILE --prompts FILE.jsonl [--json]
    python probe.py errors --work runs/probe-NAME --probe FILE                # where it errs
    python probe.py alignment --work runs/probe-NAME --layer L     # H_j against Y_(j-1..j+1)
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import data
import figures
import llama
from drafters import CopyConfig, CopyDrafter
from fetch import resolve
from switchsd import Probe, generate, model_identity


# ---------------------------------------------------------------------------------------
# Completions: the target's own greedy answers, stored as token ids
# ---------------------------------------------------------------------------------------

def generate_completions(model, tok, prompts, out_path, max_new_tokens=160, batch=1):
    """Append the target's greedy completion of each prompt to out_path (JSON lines).

    Resumable: prompts whose id is already in out_path are skipped. With batch 1, decoding
    uses this project's lossless copy-speculative path, which is token-identical to greedy
    decoding and fast on exactly these prompts (their answers repeat their context). With
    batch > 1, `batch` prompts decode together (batched_greedy): faster on answers that do
    not repeat their prompt, equal to greedy up to bf16 near-ties.
    """
    if batch < 1:
        raise ValueError(f"--batch must be at least 1, not {batch}")
    out_path = Path(out_path)
    done = {r["id"] for r in data.read_jsonl(out_path)} if out_path.exists() else set()
    todo = [p for p in prompts if p["id"] not in done]
    t0, new_tokens, seconds = time.time(), 0, 0.0
    with open(out_path, "a", encoding="utf-8") as f:
        for i in range(0, len(todo), batch):
            data.progress(i, len(todo), t0, f"completions ({new_tokens / max(seconds, 1e-9):.1f} tok/s)")
            group = todo[i:i + batch]
            ids = [tok.prompt_ids(p["prompt"]) for p in group]
            t1 = time.perf_counter()
            if batch == 1:
                outs = [generate(model, ids[0], "copy", CopyDrafter(), max_new_tokens=max_new_tokens,
                                 stop_ids=tok.eos_ids).output_ids]
            else:
                outs = batched_greedy(model, ids, max_new_tokens, tok.eos_ids)
            spent = time.perf_counter() - t1
            new_tokens += sum(map(len, outs))
            seconds += spent
            for p, pi, out in zip(group, ids, outs):
                row = {k: p[k] for k in ("id", "kind", "split")}
                f.write(json.dumps({**row, "prompt_ids": pi, "output_ids": out,
                                    "seconds": round(spent / len(group), 3)}) + "\n")
            f.flush()
    data.progress(len(todo), len(todo), t0, "completions")
    if seconds:
        print(f"{new_tokens} tokens in {seconds:.0f} s of decoding: {new_tokens / seconds:.2f} tok/s",
              file=sys.stderr)


def batched_greedy(model, prompts, max_new_tokens, stop_ids=()) -> list[list[int]]:
    """Greedy completions of several prompts, decoded together.

    The KV cache is one sequence (batch 1), but the model obeys any mask, so the prompts
    share it packed end to end: a token attends only to its own prompt's slots, and each
    decode pass carries one new token per unfinished prompt. That pass reads the weights
    once for all of them, and reading the weights is what a batch-1 CPU step waits on
    (`bench.py passes`: 21 tokens cost 1.34x one). A completion ends at max_new_tokens or
    with a stop token, which it keeps (as switchsd.generate does).
    """
    limit = model.args.max_seq_len
    for i, ids in enumerate(prompts):
        if not ids or len(ids) >= limit:
            raise ValueError(f"prompt {i} is {len(ids)} tokens; the model's context is {limit}")
    budget = [min(max_new_tokens, limit - len(ids)) for ids in prompts]
    cache = model.new_cache(sum(len(ids) for ids in prompts) + sum(budget))
    owner = torch.empty(0, dtype=torch.long)  # which prompt each cache slot belongs to
    nxt, outs = [], [[] for _ in prompts]  # nxt[i]: the token prompt i feeds next
    with torch.inference_mode():
        for i, ids in enumerate(prompts):  # prefill: causal within the prompt, blind to the others
            T = len(ids)
            mask = torch.cat([torch.zeros(T, cache.n, dtype=torch.bool),
                              torch.ones(T, T, dtype=torch.bool).tril()], 1)
            logits, _ = model(torch.tensor(ids, device=model.device), torch.arange(T, device=model.device),
                              mask.to(model.device), cache, logits_at=slice(-1, None))
            owner = torch.cat([owner, torch.full((T,), i)])
            nxt.append(int(logits[-1].argmax()))
        live = list(range(len(prompts)))
        while True:
            for i in live:
                outs[i].append(nxt[i])
            live = [i for i in live if nxt[i] not in stop_ids and len(outs[i]) < budget[i]]
            if not live:
                return outs
            rows = torch.tensor(live)
            # row r sees its prompt's slots and itself: (len(live), cache.n + len(live))
            mask = torch.cat([owner[None, :] == rows[:, None], torch.eye(len(live), dtype=torch.bool)], 1)
            pos = [len(prompts[i]) + len(outs[i]) - 1 for i in live]  # nxt[i] is outs[i][-1]
            logits, _ = model(torch.tensor([nxt[i] for i in live], device=model.device),
                              torch.tensor(pos, device=model.device), mask.to(model.device), cache)
            owner = torch.cat([owner, rows])
            for r, i in enumerate(live):
                nxt[i] = int(logits[r].argmax())


# ---------------------------------------------------------------------------------------
# Metrics, in numpy
# ---------------------------------------------------------------------------------------

def roc_auc(s, y) -> float:
    """P(score of a random positive > score of a random negative), ties counting half
    (the Mann-Whitney U statistic, from average ranks)."""
    s, y = np.asarray(s, dtype=np.float64), np.asarray(y).astype(bool)
    P, N = y.sum(), (~y).sum()
    if P == 0 or N == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    ranks[order] = np.arange(1, len(s) + 1)
    uniq, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    ranks = (sums / counts)[inv]  # average rank within ties
    return float((ranks[y].sum() - P * (P + 1) / 2) / (P * N))


def roc_curve(s, y):
    """False- and true-positive rates at every threshold, from the highest score down."""
    s, y = np.asarray(s), np.asarray(y).astype(bool)
    order = np.argsort(-s, kind="mergesort")
    tp, fp = np.cumsum(y[order]), np.cumsum(~y[order])
    return np.r_[0, fp / max(fp[-1], 1)], np.r_[0, tp / max(tp[-1], 1)]


def prf(s, y, tau) -> dict:
    pred, y = np.asarray(s) >= tau, np.asarray(y).astype(bool)
    tp, fp, fn = (pred & y).sum(), (pred & ~y).sum(), (~pred & y).sum()
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": float(p), "recall": float(r), "f1": float(2 * p * r / (p + r)) if p + r else 0.0}


def best_threshold(s, y):
    """The threshold tau maximising F1 of (s >= tau), over every distinct score."""
    s, y = np.asarray(s), np.asarray(y).astype(bool)
    order = np.argsort(-s, kind="mergesort")
    s_sorted, tp = s[order], np.cumsum(y[order])
    fp = np.arange(1, len(s) + 1) - tp
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]  # cut only between distinct scores
    f1 = np.where(last, 2 * tp / (tp + fp + y.sum()), -1)
    i = int(np.argmax(f1))
    return float(s_sorted[i]), float(f1[i])


def surface_report(surface, y, kappa: int) -> dict:
    """What the tokens alone tell (data.surface_scores): the surface score's AUC, and the
    kappa-gram condition (score >= kappa) as a classifier, the gate's other half."""
    return {"surface_auc": roc_auc(surface, y),
            **{f"kgram_{k}": v for k, v in prf(surface, y, kappa).items()}}


def places(y, starts) -> np.ndarray:
    """Where each token sits relative to the runs of Y = 1 in its completion (starts: the
    first row of each completion). Y = 1: its index in the run (0 = the run's first token);
    Y = 0: minus the tokens since the last run ended, or 0 when no run came before."""
    y, p = np.asarray(y).astype(bool), np.zeros(len(y), dtype=np.int64)
    first = np.zeros(len(y), dtype=bool)
    first[np.asarray(starts, dtype=np.int64)] = True
    for j in range(len(y)):
        if first[j]:
            continue  # a completion starts afresh: 0 either way
        if y[j]:
            p[j] = p[j - 1] + 1 if y[j - 1] else 0
        else:
            p[j] = -1 if y[j - 1] else (p[j - 1] - 1 if p[j - 1] < 0 else 0)
    return p


PLACES = [  # (name, Y, test on the place)
    ("copy: a run's 1st token", 1, lambda p: p == 0), ("copy: 2nd", 1, lambda p: p == 1),
    ("copy: 3rd-5th", 1, lambda p: (p >= 2) & (p <= 4)), ("copy: 6th on", 1, lambda p: p >= 5),
    ("no copy: 1-4 tokens after a run", 0, lambda p: (p <= -1) & (p >= -4)),
    ("no copy: 5+ after a run", 0, lambda p: p <= -5), ("no copy: no run before", 0, lambda p: p == 0)]


def error_places(s, y, tau, starts) -> list[dict]:
    """Where the probe's errors fall. Errors at a run's edges point at the label's verbatim
    cut-off (an edit inside a copy ends a run; a run's first token has no match behind it
    yet) rather than at a missed copy."""
    s, y = np.asarray(s), np.asarray(y).astype(bool)
    p, wrong = places(y, starts), (s >= tau) != y
    out = []
    for name, label, test in PLACES:
        m = (y == bool(label)) & test(p)
        out.append({"place": name, "tokens": int(m.sum()), "errors": int(wrong[m].sum()),
                    "mean_score": float(s[m].mean()) if m.any() else float("nan")})
    return out


def print_places(rows):
    n = sum(r["errors"] for r in rows)
    print(f"{'where':34s} {'tokens':>7s} {'errors':>7s} {'rate':>6s} {'share':>6s} {'mean p':>7s}")
    for r in rows:
        print(f"{r['place']:34s} {r['tokens']:7d} {r['errors']:7d} {r['errors'] / max(1, r['tokens']):6.3f} "
              f"{r['errors'] / max(1, n):6.3f} {r['mean_score']:7.3f}")


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------

def fit(X: torch.Tensor, y: torch.Tensor, l2: float = 1e-4, iters: int = 200) -> torch.Tensor:
    """Minimise mean BCE(sigmoid(X w), y) + l2/2 ||w||^2 over w by L-BFGS. X: (N, dim).

    X is divided by its RMS first so one l2 suits every layer (residual norms grow with
    depth); the scale is folded back into w, so the probe reads raw hidden states.
    """
    scale = X.pow(2).mean().sqrt().clamp_min(1e-6)
    Xs, y = X / scale, y.float()
    w = torch.zeros(X.shape[1], requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=iters, history_size=20,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-6)

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(Xs @ w, y) + 0.5 * l2 * w.dot(w)
        loss.backward()
        return loss

    opt.step(closure)
    return (w.detach() / scale).float()


def layer_scores(X, w):
    return torch.sigmoid(X @ w).numpy()


def split_rows(info: dict, split: str):
    """The rows of one split in a features folder (index.json's info), and where each of its
    completions starts among those rows."""
    off = info["offsets"]
    spans = [(off[i], off[i + 1]) for i, sp in enumerate(info["splits"]) if sp == split]
    rows = np.concatenate([np.arange(a, b) for a, b in spans] or [np.zeros(0, dtype=np.int64)])
    return rows, np.cumsum([0] + [b - a for a, b in spans[:-1]])


def train_layers(folder, positions=("attn", "mlp"), l2=1e-4, log=print) -> dict:
    """Fit one probe per (position, layer) on the train split of a data.extract_features
    folder; evaluate on val (choosing tau) and test. Returns the report and the weights."""
    folder = Path(folder)
    info = json.loads((folder / "index.json").read_text())
    if info["done"] != len(info["ids"]):
        raise ValueError(f"{folder}: features are incomplete ({info['done']}/{len(info['ids'])})")
    labels = np.load(folder / "labels.npy")
    rows = {sp: split_rows(info, sp)[0] for sp in ("train", "val", "test")}
    report, weights = {"tokens": {sp: int(len(r)) for sp, r in rows.items()},
                       "positives": {sp: int(labels[r].sum()) for sp, r in rows.items()},
                       "layers": []}, {}
    for pos in positions:
        feats = data.open_features(folder, pos)
        for l in range(info["n_layers"]):
            t = time.time()
            X = torch.from_numpy(np.asarray(feats[l], dtype=np.float32))  # (N, dim)
            w = fit(X[rows["train"]], torch.from_numpy(labels[rows["train"]]), l2)
            s = {sp: layer_scores(X[r], w) for sp, r in rows.items()}
            tau, _ = best_threshold(s["val"], labels[rows["val"]])
            row = {"position": pos, "layer": l, "tau": tau}
            for sp in ("val", "test"):
                m = prf(s[sp], labels[rows[sp]], tau)
                row.update({f"{sp}_{k}": v for k, v in m.items()})
                row[f"{sp}_auc"] = roc_auc(s[sp], labels[rows[sp]])
            report["layers"].append(row)
            weights[pos, l] = w
            log(f"{pos} layer {l:2d}: val F1 {row['val_f1']:.3f} AUC {row['val_auc']:.4f} | "
                f"test F1 {row['test_f1']:.3f} AUC {row['test_auc']:.4f} ({time.time() - t:.1f}s)")
    return report, weights


def select(report: dict, position="attn") -> dict:
    """The layer with the best validation F1 (its tau was chosen on the same split)."""
    return max((r for r in report["layers"] if r["position"] == position), key=lambda r: r["val_f1"])


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------

def cmd_train(a):
    folder = resolve(a.model)
    name = Path(a.model).name
    work = Path(a.work or f"runs/probe-{name}")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = llama.Model.from_pretrained(folder, exact=False)  # see cmd_completions
    tok = llama.Tokenizer(folder)
    prompts = data.subset(data.read_prompts(a.prompts), {"train": a.train, "val": a.val, "test": a.test})
    generate_completions(model, tok, prompts, work / "completions.jsonl", a.max_new_tokens, a.batch)
    t1 = time.time()
    done = {r["id"]: r for r in data.read_jsonl(work / "completions.jsonl")}
    data.extract_features(model, [done[p["id"]] for p in prompts], work / "features", a.kappa)
    t2 = time.time()
    report, weights = train_layers(work / "features", l2=a.l2)
    t3 = time.time()
    best = select(report)
    test = [done[p["id"]] for p in prompts if p["split"] == "test"]
    surf, ys = [], []  # the surface baseline on the same test tokens
    for r in test:
        ids, P = r["prompt_ids"] + r["output_ids"], len(r["prompt_ids"])
        surf.append(data.surface_scores(ids, P, max(8, a.kappa)))
        ys.append(data.copy_labels(ids, P, a.kappa))
    surface = surface_report(np.concatenate(surf), np.concatenate(ys), a.kappa) if test else {}
    probe = Probe(weights["attn", best["layer"]], best["layer"], "attn", best["tau"], a.kappa,
                  {**model_identity(model, name), "val_f1": best["val_f1"], "val_auc": best["val_auc"],
                   "test_f1": best["test_f1"], "test_auc": best["test_auc"]})
    probe.save(a.out)
    report.update(selected=best, surface_test=surface, seconds={"completions": t1 - t0, "features": t2 - t1,
                                          "probes": t3 - t2, "total": t3 - t0})
    (work / "report.json").write_text(json.dumps(report, indent=1))
    draw(report, work, model, tok, probe, test)
    print(f"layer {best['layer']} of {model.args.n_layers}, tau {best['tau']:.3f}: val F1 {best['val_f1']:.3f} "
          f"AUC {best['val_auc']:.4f}; test F1 {best['test_f1']:.3f} AUC {best['test_auc']:.4f} -> {a.out}")
    if surface:
        print(f"no hidden state, on the same test tokens: surface AUC {surface['surface_auc']:.4f}; "
              f"kappa-gram alone P {surface['kgram_precision']:.3f} R {surface['kgram_recall']:.3f} "
              f"F1 {surface['kgram_f1']:.3f}")
    print(f"wall time: completions {t1 - t0:.0f}s, features {t2 - t1:.0f}s, probes {t3 - t2:.0f}s")


def draw(report, work, model, tok, probe, test_rows):
    """probe_layers.svg (F1 and AUC per layer), roc.svg (the chosen layer, test split) and
    page.svg (a test completion shaded by probe score, true copy spans underlined)."""
    work = Path(work)
    series = {}
    for pos in ("attn", "mlp"):
        rows = [r for r in report["layers"] if r["position"] == pos]
        if rows:
            series[f"val F1 ({pos})"] = ([r["layer"] for r in rows], [r["val_f1"] for r in rows])
            series[f"val AUC ({pos})"] = ([r["layer"] for r in rows], [r["val_auc"] for r in rows])
    figures.line_chart(work / "probe_layers.svg", series, "Copy-intent probe by layer", "layer",
                       "validation score", ylim=(0.5, 1))
    s = np.concatenate([teacher_forced_scores(model, probe, r["prompt_ids"] + r["output_ids"])[len(r["prompt_ids"]):]
                        for r in test_rows])
    y = np.concatenate([data.copy_labels(r["prompt_ids"] + r["output_ids"], len(r["prompt_ids"]), probe.kappa)
                        for r in test_rows])
    fpr, tpr = roc_curve(s, y)
    keep = np.unique(np.linspace(0, len(fpr) - 1, 400).astype(int))  # enough points to draw
    figures.line_chart(work / "roc.svg", {f"layer {probe.layer} (AUC {roc_auc(s, y):.3f})":
                                          (fpr[keep].tolist(), tpr[keep].tolist()), "chance": ([0, 1], [0, 1])},
                       "ROC of the chosen probe, test split", "false positive rate", "true positive rate",
                       ylim=(0, 1), markers=False)
    # the page: the test completion whose labels are most mixed
    r = max(test_rows, key=lambda r: min(*np.bincount(data.copy_labels(
        r["prompt_ids"] + r["output_ids"], len(r["prompt_ids"]), probe.kappa), minlength=2)))
    ids, P = r["prompt_ids"] + r["output_ids"], len(r["prompt_ids"])
    sc = teacher_forced_scores(model, probe, ids)[P:]
    marks = data.copy_labels(ids, P, probe.kappa).astype(bool).tolist()
    pieces = tok.pieces(ids[P:])
    figures.text_page(work / "page.svg", pieces, sc.tolist(), marks,
                      f"Probe score per token (layer {probe.layer}, tau = {probe.tau:.2f}), {r['id']}")


def cmd_ablation(a):
    """Paper section 4.3. Training data: probes trained on ConstructedCopy, on natural text
    and on the CopyDiversity set (the train command's data), each choosing its layer and
    tau on its own validation split, all scored on the same CopyDiversity test split.
    Representation: the attention- vs MLP-sublayer residual, layer by layer (train's report)."""
    folder = resolve(a.model)
    name = Path(a.model).name
    work = Path(a.work or f"runs/probe-{name}")
    report = json.loads((work / "report.json").read_text())
    model = llama.Model.from_pretrained(folder)
    tok = llama.Tokenizer(folder)
    main = work / "features"
    info = json.loads((main / "index.json").read_text())
    labels = np.load(main / "labels.npy")
    test, _ = split_rows(info, "test")
    comps = data.read_jsonl(work / "completions.jsonl")
    vocab = data.draft_vocabulary(comps, 4096)  # random tokens, drawn from ones the model uses
    sources = {"ConstructedCopy": data.constructed_copy(vocab, a.sequences, seed=1),
               "NaturalText": data.natural_text(tok, a.sequences, seed=1)}
    rows = {}
    for src, seqs in sources.items():
        data.extract_features(model, seqs, work / f"ablation-{src}", kinds=("attn",))
        rep, weights = train_layers(work / f"ablation-{src}", positions=("attn",), l2=a.l2)
        best = select(rep)
        X = torch.from_numpy(np.asarray(data.open_features(main, "attn")[best["layer"]][test], dtype=np.float32))
        s = layer_scores(X, weights["attn", best["layer"]])
        rows[src] = {"layer": best["layer"], "tau": best["tau"], "train_tokens": rep["tokens"]["train"],
                     **prf(s, labels[test], best["tau"]), "auc": roc_auc(s, labels[test])}
    sel = report["selected"]
    rows["CopyDiversity"] = {"layer": sel["layer"], "tau": sel["tau"], "train_tokens": report["tokens"]["train"],
                             "precision": sel["test_precision"], "recall": sel["test_recall"],
                             "f1": sel["test_f1"], "auc": sel["test_auc"]}
    lines = [f"Probe training data ({name}; F1 and AUC on the CopyDiversity test split, "
             f"{len(test)} tokens; paper: 0.65 / 0.81 / 0.87)\n",
             "| training data | train tokens | layer | tau | precision | recall | F1 | AUC |", "|---" * 8 + "|"]
    for src, r in rows.items():
        lines.append(f"| {src} | {r['train_tokens']} | {r['layer']} | {r['tau']:.2f} | {r['precision']:.3f} | "
                     f"{r['recall']:.3f} | {r['f1']:.3f} | {r['auc']:.4f} |")
    lines += ["", f"Representation ({name}, probes per layer; test split, tau from val)\n",
              "| layer | attn F1 | attn AUC | mlp F1 | mlp AUC |", "|---|---|---|---|---|"]
    by = {(r["position"], r["layer"]): r for r in report["layers"]}
    for l in range(model.args.n_layers):
        at, ml = by.get(("attn", l)), by.get(("mlp", l))
        if at and ml:
            lines.append(f"| {l} | {at['test_f1']:.3f} | {at['test_auc']:.4f} | {ml['test_f1']:.3f} | {ml['test_auc']:.4f} |")
    (work / "ablation.json").write_text(json.dumps(rows, indent=1))
    (work / "ablation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cmd_errors(a):
    """The probe's errors on a split of stored features (the train command's folder), by
    place relative to the copy runs."""
    probe = Probe.load(a.probe)
    folder = Path(a.work) / "features"
    info = json.loads((folder / "index.json").read_text())
    if (info["dim"] != probe.w.numel() or info["n_layers"] <= probe.layer
            or probe.meta.get("fingerprint", info["fingerprint"]) != info["fingerprint"]):
        raise ValueError(f"{a.probe}: made for another model than the features in {folder}")
    labels = np.load(folder / "labels.npy")
    rows, starts = split_rows(info, a.split)
    X = torch.from_numpy(np.asarray(data.open_features(folder, probe.position)[probe.layer][rows], dtype=np.float32))
    s, y = layer_scores(X, probe.w), labels[rows]
    print(f"{a.probe} on the {a.split} split of {folder}: {len(y)} tokens, {int(y.sum())} copy; "
          f"F1 {prf(s, y, probe.tau)['f1']:.3f} AUC {roc_auc(s, y):.4f}")
    print_places(error_places(s, y, probe.tau, starts))


def cmd_alignment(a):
    """Which token's state reads copy intent best: a probe on row j (the state where token j
    is the input) fit to Y_(j+s) for s = -1, 0, +1; s = 0 is what the decode loop reads. The
    train split's own AUC bounds what a linear read-out of that layer separates."""
    folder = Path(a.work) / "features"
    info = json.loads((folder / "index.json").read_text())
    labels, off = np.load(folder / "labels.npy"), info["offsets"]
    X = torch.from_numpy(np.asarray(data.open_features(folder, a.position)[a.layer], dtype=np.float32))
    for s in (-1, 0, 1):
        rows = {sp: np.concatenate([np.arange(off[i] + max(0, -s), off[i + 1] - max(0, s))
                                    for i, x in enumerate(info["splits"]) if x == sp])
                for sp in ("train", "val", "test")}
        y = {sp: labels[r + s] for sp, r in rows.items()}
        w = fit(X[rows["train"]], torch.from_numpy(y["train"]), a.l2)
        sc = {sp: layer_scores(X[r], w) for sp, r in rows.items()}
        tau, _ = best_threshold(sc["val"], y["val"])
        print(f"{a.position} layer {a.layer}, row j -> Y_(j{s:+d}): tau {tau:.2f} | " + " | ".join(
            f"{sp} F1 {prf(sc[sp], y[sp], tau)['f1']:.3f} AUC {roc_auc(sc[sp], y[sp]):.4f}" for sp in rows))


def teacher_forced_scores(model, probe, ids):
    """Probe scores at every position of ids, from one forward pass."""
    _, hid = model.forward_sequence(ids, (probe.capture,), logits_at=slice(0, 0))
    return probe.score(hid[probe.capture]).cpu().numpy()


def cmd_eval(a):
    folder = resolve(a.model)
    model = llama.Model.from_pretrained(folder)
    tok = llama.Tokenizer(folder)
    probe = Probe.load(a.probe, model)
    s_all, y_all, surf = [], [], []
    for row in data.read_prompts(a.prompts):
        ids = tok.prompt_ids(row["prompt"])
        res = generate(model, ids, "copy", CopyDrafter(CopyConfig(kappa=probe.kappa)),
                       max_new_tokens=a.max_new_tokens, stop_ids=tok.eos_ids)
        full = ids + res.output_ids
        s_all.append(teacher_forced_scores(model, probe, full)[len(ids):])
        y_all.append(data.copy_labels(full, len(ids), probe.kappa))
        surf.append(data.surface_scores(full, len(ids), max(8, probe.kappa)))
    s, y = np.concatenate(s_all), np.concatenate(y_all)
    out = {**prf(s, y, probe.tau), "auc": roc_auc(s, y), "tokens": int(len(y)), "positives": int(y.sum()),
           **surface_report(np.concatenate(surf), y, probe.kappa)}
    if a.json:
        print(json.dumps(out))
    else:
        print(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()))
        print_places(error_places(s, y, probe.tau, np.cumsum([0] + [len(v) for v in y_all[:-1]])))


def cmd_completions(a):
    folder = resolve(a.model)
    prompts = data.subset(data.read_prompts(a.prompts), {"train": a.train, "val": a.val, "test": a.test})
    # torch's own kernels: training data need no bit-exactness, and batched_greedy's packed
    # prompts would defeat it anyway, each row then recomputed alone (llama.exact_layout).
    generate_completions(llama.Model.from_pretrained(folder, exact=False), llama.Tokenizer(folder), prompts,
                         a.out, a.max_new_tokens, a.batch)


def cmd_features(a):
    data.extract_features(llama.Model.from_pretrained(resolve(a.model)), data.read_jsonl(a.completions), a.out,
                          a.kappa)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def completion_args(p):
        p.add_argument("--prompts", default="data/prompts.jsonl", help="JSON lines (data.read_prompts)")
        for split, n in (("train", 960), ("val", 120), ("test", 120)):
            p.add_argument(f"--{split}", type=int, default=n, help=f"prompts from the {split} split")
        p.add_argument("--max-new-tokens", type=int, default=160)
        p.add_argument("--batch", type=int, default=1,
                       help="prompts decoded together (batched_greedy; 1: one at a time, copy-speculative)")

    p = sub.add_parser("train", help="completions -> features -> per-layer probes -> probe file")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="probe file to write (.safetensors)")
    p.add_argument("--work", help="folder for completions and features (default runs/probe-NAME)")
    completion_args(p)
    p.add_argument("--kappa", type=int, default=data.KAPPA)
    p.add_argument("--l2", type=float, default=1e-4)
    p = sub.add_parser("completions", help="the target's greedy completions (resumable)")
    p.add_argument("--model", required=True, help="HF folder or demo name")
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    completion_args(p)
    p = sub.add_parser("features", help="per-layer hidden states and labels (resumable)")
    p.add_argument("--model", required=True)
    p.add_argument("--completions", required=True)
    p.add_argument("--out", required=True, help="folder for the memmaps")
    p.add_argument("--kappa", type=int, default=data.KAPPA)
    p = sub.add_parser("eval", help="completions of new prompts, labelled, scored by a probe")
    p.add_argument("--model", required=True)
    p.add_argument("--probe", required=True)
    p.add_argument("--prompts", required=True, help="JSON lines with a 'prompt' key")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("errors", help="where a probe errs on stored features, relative to the copy runs")
    p.add_argument("--work", required=True, help="the train command's folder (runs/probe-NAME)")
    p.add_argument("--probe", required=True)
    p.add_argument("--split", default="test", choices=("train", "val", "test"))
    p = sub.add_parser("ablation", help="section 4.3: training data and representation ablations")
    p.add_argument("--model", required=True)
    p.add_argument("--work", help="the train command's folder (default runs/probe-NAME)")
    p.add_argument("--sequences", type=int, default=200, help="sequences per ablation source")
    p.add_argument("--l2", type=float, default=1e-4)
    p = sub.add_parser("alignment", help="which token's state to pair with Y_j, on stored features")
    p.add_argument("--work", required=True, help="the train command's folder (runs/probe-NAME)")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--position", default="attn", choices=("attn", "mlp"))
    p.add_argument("--l2", type=float, default=1e-4)
    a = ap.parse_args(argv)
    {"train": cmd_train, "completions": cmd_completions, "features": cmd_features, "eval": cmd_eval,
     "errors": cmd_errors, "ablation": cmd_ablation, "alignment": cmd_alignment}[a.cmd](a)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")

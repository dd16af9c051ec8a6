"""The data and its files: copy labels, the probe's prompt set, feature files, ablation sets.

The probe reads the target's hidden state at completion token j and predicts Y_j = 1 iff
token j lies inside a verbatim span of at least kappa = 5 tokens that occurred earlier in the
context (prompt + completion so far): copy_labels, first below. For both labels to be common,
the target answers prompts whose good answers repeat parts of their own context: return the
whole edited function, convert a table, quote a sentence, restate an equation at each step.

The prompts are written here: no API call, nothing downloaded, no evaluation benchmark
(HumanEval, MATH-500, CNN/DailyMail), only material that every machine with Python has:

  code      functions of 8-40 lines from CPython's standard library sources, via `ast`
  prose     /usr/share/common-licenses/* when present, the Python docs in
            pydoc_data/topics.py, stdlib module, class and function docstrings
  records   tables drawn by a seeded RNG; names from /usr/share/dict/words when present,
            stdlib module names otherwise
  math      polynomials and equations drawn by the same RNG

The files made from a target's completions (probe.py makes the completions):

  features     every layer's residual stream at every completion token, fp16 memmaps
  EAGLE-3      the target's fused-layer inputs and top-k logits, to train a head on
  ablations    ConstructedCopy (random tokens with planted repeats) and natural text

Usage:
    python data.py prompts [--n 1200] [--seed 0] [--out data/prompts.jsonl]
"""
import argparse
import ast
import json
import platform
import random
import re
import sys
import sysconfig
import textwrap
import time
from datetime import date
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

import llama

KAPPA = 5  # the paper's kappa: a copy is a verbatim repeat of at least this many tokens


# ---------------------------------------------------------------------------------------
# Labels: Y_j = 1 iff token j lies in a verbatim repeat of >= kappa tokens
# ---------------------------------------------------------------------------------------

def copy_labels(ids, start: int, kappa: int = KAPPA) -> np.ndarray:
    """Y_j for the tokens ids[start:] (the completion; ids[:start] is the prompt).

    A span of >= kappa tokens that occurred earlier is covered by kappa-token windows that
    each occurred earlier (at the same offset), so Y_j = 1 iff some kappa-window containing
    j starts at a, and the same window also starts at some a' < a. One pass with a rolling
    hash (O(1) per window) finds those windows; hash hits are confirmed token by token.
    """
    n, M, B = len(ids), (1 << 61) - 1, 1_000_003
    top = pow(B, kappa - 1, M)
    starts: dict[int, list[int]] = {}  # hash -> start positions of distinct windows
    cover = np.zeros(n + 1, dtype=np.int32)  # +1 at a window's start, -1 past its end
    h = 0
    for i, x in enumerate(ids):
        if i >= kappa:
            h = (h - (ids[i - kappa] + 1) * top) % M  # drop the token leaving the window
        h = (h * B + x + 1) % M
        a = i - kappa + 1
        if a < 0:
            continue
        same = starts.setdefault(h, [])
        if any(ids[b:b + kappa] == ids[a:i + 1] for b in same):
            cover[a] += 1
            cover[i + 1] -= 1
        else:
            same.append(a)
    return (np.cumsum(cover)[start:n] > 0).astype(np.uint8)


def surface_scores(ids, start: int, longest: int = 8) -> np.ndarray:
    """A past-only, surface baseline for Y_j (tokens ids[start:]): the length of the longest
    suffix ending at token j that occurred earlier in ids, capped at `longest`. It reads no
    hidden state, so a probe that ranks Y no better than it has learned no more than n-gram
    matching. A score >= kappa is SwitchSD's kappa-gram condition, and it implies Y_j = 1
    (that kappa-gram is itself a repeat of kappa tokens containing j)."""
    seen = [set() for _ in range(longest + 1)]  # seen[L]: the L-grams ending before j
    out = np.zeros(max(0, len(ids) - start), dtype=np.int64)
    for j in range(len(ids)):
        m = 0
        for L in range(1, min(longest, j + 1) + 1):
            g = tuple(ids[j - L + 1:j + 1])
            if m == L - 1 and g in seen[L]:
                m = L
            seen[L].add(g)
        if j >= start:
            out[j - start] = m
    return out


# ---------------------------------------------------------------------------------------
# Prompt sets
# ---------------------------------------------------------------------------------------

MAX_CHARS = 1400  # longest prompt: keeps a CPU target's prefill cheap
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "ensurepip", "__pycache__"}
LICENSES = Path("/usr/share/common-licenses")
DICT_WORDS = Path("/usr/share/dict/words")
FIRST_NAMES = ["Ana", "Bilal", "Chen", "Dara", "Elif", "Femi", "Greta", "Hugo", "Ines", "Jonas", "Kenji",
               "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Wen"]
CITIES = ["Lisbon", "Nairobi", "Osaka", "Lima", "Oslo", "Pune", "Quito", "Tallinn", "Accra", "Hanoi",
          "Porto", "Denver", "Leeds", "Bergen", "Cusco", "Perth"]
NEW_NAMES = ["result", "item", "current", "buffer", "entry", "chunk", "total", "parts", "acc", "node",
             "piece", "record", "elem", "target"]
SWAPS = {"software": "program", "license": "licence", "function": "routine", "object": "item",
         "value": "quantity", "may": "can", "must": "shall", "work": "creation", "copy": "duplicate",
         "distribute": "share", "module": "package", "argument": "parameter", "returns": "gives back",
         "statement": "instruction", "expression": "formula", "program": "application"}
# (text, replacement): one operator flipped on purpose for the "fix the bug" prompts
BUGS = [(" == ", " != "), (" != ", " == "), (" < ", " <= "), (" > ", " >= "), (" is None", " is not None"),
        (" is not None", " is None"), (" + 1", " - 1"), (" - 1", " + 1"), (" and ", " or "), (" or ", " and ")]


# ---------------------------------------------------------------------------------------
# Material: functions, passages and words found on this machine
# ---------------------------------------------------------------------------------------

def _read(path):
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # an unreadable file is one source fewer, not a crash


def _sentences(para):
    return re.split(r'(?<=[.!?])\s+(?=[A-Z"(])', para)


def _paragraphs(text):
    """Prose paragraphs of 250-900 chars. Indented lines after the first are code: skip."""
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").splitlines()
        if not lines or lines[0].startswith("   ") or any(l[:1].isspace() for l in lines[1:]):
            continue
        para = " ".join(l.strip() for l in lines)
        plain = sum(c.isalnum() or c in " ,.;:'\"()-" for c in para)
        if 250 <= len(para) <= 900 and plain > 0.97 * len(para) and para.endswith(".") \
                and len(_sentences(para)) > 1:
            yield para


def _functions(rel, text, tree):
    """Functions of 8-40 lines (docstring aside) in one file, with what the tasks need to know."""
    lines, kinds = text.splitlines(), (ast.FunctionDef, ast.AsyncFunctionDef)
    defs = [(n, n.name) for n in tree.body if isinstance(n, kinds)]
    defs += [(n, f"{c.name}.{n.name}") for c in tree.body if isinstance(c, ast.ClassDef)
             for n in c.body if isinstance(n, kinds)]
    for node, qual in defs:
        # = ast.get_source_segment(text, node, padded=True) dedented, without its rescan of the file
        seg = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno])).splitlines()
        nodoc = seg
        if ast.get_docstring(node) is not None:
            doc = node.body[0]
            if len(node.body) < 2 or doc.lineno == node.lineno:
                continue
            nodoc = seg[:doc.lineno - node.lineno] + seg[doc.end_lineno - node.lineno + 1:]
        code = "\n".join(seg)
        if not 8 <= len(nodoc) <= 40 or len(code) > 1000 or max(map(len, seg)) > 100 or "\t" in code:
            continue
        args = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        args = [a for a in args if a not in ("self", "cls")]
        stores = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        yield dict(source=f"stdlib:{rel}:{qual}", file=rel, qual=qual, name=node.name,
                   module=rel[:-3].replace("/", ".").removesuffix(".__init__"),
                   code=code, nodoc="\n".join(nodoc), method="." in qual, args=args,
                   names=sorted(n for n in stores | set(args) if len(n) > 1),
                   signature=f"def {node.name}({ast.unparse(node.args)}):")


def load_material(seed=0, n_files=200, per_file=8):
    """Everything the prompt generators draw from; deterministic given the seed and machine."""
    rng = random.Random(seed)
    files = sorted(p.relative_to(STDLIB).as_posix() for p in STDLIB.rglob("*.py")
                   if not SKIP_DIRS & set(p.relative_to(STDLIB).parts[:-1]))
    functions, passages = [], []
    for rel in rng.sample(files, min(n_files, len(files))):
        text = _read(STDLIB / rel)
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, TypeError):  # TypeError: text is None
            continue
        found = list(_functions(rel, text, tree))
        functions += rng.sample(found, min(per_file, len(found)))  # no file dominates
        for node in ast.walk(tree):  # module, class and function docstrings
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"stdlib:{rel}:{getattr(node, 'name', 'module')} docstring"
                passages += [(where, p) for p in _paragraphs(ast.get_docstring(node) or "")]
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    for name in sorted(topics):
        passages += [(f"stdlib:pydoc_data/topics.py:topics[{name!r}]", p) for p in _paragraphs(topics[name])]
    for path in sorted(LICENSES.glob("*")) if LICENSES.is_dir() else []:
        passages += [(str(path), p) for p in _paragraphs(_read(path) or "")]
    words = (_read(DICT_WORDS) or "").split()
    words = sorted({w for w in words if w.isalpha() and w.islower() and 4 <= len(w) <= 9})
    if len(words) < 200:  # no dictionary: stdlib module names read as short names too
        mods = getattr(sys, "stdlib_module_names", [Path(f).stem for f in files])
        words = sorted({w for w in mods if w.isalpha() and w.islower() and len(w) >= 3})
    unique = {}  # GPL and GPL-3 (and others) are the same file: keep each paragraph once
    for src, p in passages:
        unique.setdefault(p, src)
    passages = [(src, p) for p, src in unique.items()]
    return dict(files=files, functions=functions, passages=passages, words=words)


# ---------------------------------------------------------------------------------------
# Prompt generators: each draws (source, prompt) from the material, or None if it cannot
# ---------------------------------------------------------------------------------------

# kind -> [(what the material must offer, ask)]. Every ask wants the material back, edited.
TASKS = {
    "code-edit": [
        ("bug", "This function from `{file}` has a bug: one operator was changed. Fix it and return "
                "the full corrected function."),
        ("bug", "Find the bug in this function and show the whole function with the fix applied."),
        ("local", "Rename the variable `{local}` to `{new}` and return the full function."),
        ("append", "Convert the loop that builds a list into a list comprehension; show the full function."),
        ("format", "Replace the old-style string formatting with f-strings. Show the complete function."),
        ("arg", "Add a check at the top that raises TypeError if `{arg}` is None; return the whole function."),
        ("method", "Turn this method into a module-level function whose first argument `obj` is the "
                   "instance. Return the complete function."),
        ("", "Add a `logging.debug` call at the start that logs the arguments. Return the full function."),
        ("", "Refactor this function to use early returns where that helps; give the complete function.")],
    "code-annotate": [
        ("nodoc", "Add a docstring to this function. Return the whole function."),
        ("nodoc", "Write a Google-style docstring for this function and show the function with it."),
        ("", "Add type hints to the parameters and return value, changing nothing else. Show the function."),
        ("nodoc", "Write `unittest` tests for this function. Repeat the function first, then the tests."),
        ("nodoc", "Write pytest tests for `{name}` below. Start with `from {module} import {name}`."),
        ("arg", "Rename the parameter `{arg}` to `{arg}_in` everywhere and return the function in full."),
        ("local", "Rename every occurrence of `{local}` to `{new}` and show the renamed function.")],
    "code-walkthrough": [
        ("nodoc", "Go through this function line by line: quote each line, then explain it in one sentence."),
        ("nodoc", "Add a short comment above each statement and return the commented function."),
        ("nodoc", "Quote every line of this function that can raise an exception, exactly, and say why."),
        ("nodoc", "Explain what `{name}` does. Quote the lines you refer to."),
        ("nodoc", "Rewrite this function with a comment at the end of every line; keep the code unchanged.")],
    "quote": [
        ("", "Quote the last sentence of this passage exactly, then explain it in your own words."),
        ("", "Copy the first two sentences below word for word, then summarize the rest in one line."),
        ("unique", 'Quote the sentence that mentions "{unique}", word for word.'),
        ("unique", 'Which sentence of this text talks about "{unique}"? Answer with the exact sentence.'),
        ("unique", 'What does the passage say about "{unique}"? Answer with a direct quote, then explain.'),
        ("common", 'Extract every sentence containing the word "{common}", verbatim, as a bulleted list.')],
    "rewrite": [
        ("swap", "Rewrite this paragraph replacing '{old}' with '{new}' everywhere, changing nothing else."),
        ("swap", 'Repeat the text below, but use the word "{new}" instead of "{old}".'),
        ("typos", "Correct the typos in this text and return the corrected text."),
        ("typos", "Proofread the following paragraph. Give the fixed paragraph, then the words you changed."),
        ("word", 'Return this paragraph with every "{word}" in bold (**{word}**), otherwise unchanged.'),
        ("", "Repeat this paragraph with each sentence on its own numbered line."),
        ("", "Print the sentences of this paragraph in reverse order, one per line.")],
}


def _pick(rng, kind, have):
    """A task of this kind whose need the material meets, its ask filled in."""
    need, ask = rng.choice([t for t in TASKS[kind] if t[0] == "" or have.get(t[0])])
    return need, ask.format(**{k: v for k, v in have.items() if isinstance(v, str)})


def _plant_bug(rng, code):
    """Flip one operator outside strings and comments, or None if there is none to flip."""
    lines = code.splitlines()
    spots = [(i, a, b) for i, line in enumerate(lines[1:], 1) for a, b in BUGS
             if a in line and not any(q in line for q in "'\"#")]
    if not spots:
        return None
    i, a, b = rng.choice(spots)
    return "\n".join(lines[:i] + [lines[i].replace(a, b, 1)] + lines[i + 1:])


def _code(rng, m, kind):
    f = rng.choice(m["functions"])
    have = dict(f, bug=_plant_bug(rng, f["nodoc"]), local=rng.choice(f["names"] or [""]),
                arg=rng.choice(f["args"] or [""]), new=rng.choice([n for n in NEW_NAMES if n not in f["code"]]),
                append=re.search(r"for .*:\n\s+\w+\.append\(", f["code"]),
                format=re.search(r"[\"'] % |\.format\(", f["code"]))
    need, ask = _pick(rng, kind, have)
    code = have[need] if need in ("bug", "nodoc") else rng.choice([f["code"], f["nodoc"]])
    layout = rng.choice(["{0}\n\n```python\n{1}\n```", "```python\n{1}\n```\n\n{0}"])
    return f["source"], layout.format(ask, code)


def _typo(rng, word):
    i = rng.randrange(1, len(word) - 2)  # first and last letters stay: still readable
    return rng.choice([word[:i] + word[i + 1] + word[i] + word[i + 2:], word[:i] + word[i + 1:],
                       word[:i] + word[i] + word[i:]])


def _text(rng, m, kind):
    src, para = rng.choice(m["passages"])
    sents = _sentences(para)
    words = sorted(set(re.findall(r"\b[a-z]{6,}\b", para)))
    count = {w: sum(w in s for s in sents) for w in words}
    typod = para
    for w in rng.sample(words, min(len(words), rng.randint(2, 4))):
        typod = re.sub(rf"\b{w}\b", _typo(rng, w), typod, count=1)
    old = rng.choice([w for w in SWAPS if re.search(rf"\b{w}\b", para)] or [""])
    have = dict(unique=rng.choice([w for w in words if count[w] == 1] or [""]),
                common=rng.choice([w for w in words if count[w] > 1] or [""]),
                word=rng.choice(words or [""]), swap=old, old=old, new=SWAPS.get(old, ""),
                typos=typod if len(words) > 3 else "")
    need, ask = _pick(rng, kind, have)
    text = typod if need == "typos" else para
    return src, rng.choice(["{0}\n\n{1}", "{1}\n\n{0}", '{0}\n\n"""\n{1}\n"""']).format(ask, text)


def _records(rng, m):
    """3-8 records of 3-6 fields; the first field names the record."""
    draw = {"city": lambda k, n: rng.choice(CITIES), "price": lambda k, n: round(rng.uniform(1, 500), 2),
            "quantity": lambda k, n: rng.randint(1, 60), "score": lambda k, n: rng.randint(0, 100),
            "active": lambda k, n: rng.random() < 0.6, "tag": lambda k, n: rng.choice(m["words"]),
            "date": lambda k, n: f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "email": lambda k, n: f"{n.lower()}@example.org", "id": lambda k, n: 100 + 7 * k}
    first, fields = rng.choice(["name", "item", "service"]), rng.sample(sorted(draw), rng.randint(2, 5))
    names = rng.sample(FIRST_NAMES if first == "name" else m["words"], rng.randint(3, 8))
    return [{first: n, **{f: draw[f](k, n) for f in fields}} for k, n in enumerate(names)]


def _render(rows, fmt):
    fields = list(rows[0])
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "yaml":
        val = lambda v: str(v).lower() if isinstance(v, bool) else v
        return "\n".join(f"{'  ' if i else '- '}{f}: {val(r[f])}" for r in rows for i, f in enumerate(fields))
    if fmt == "csv":  # no value holds a comma or a quote
        return "\n".join([",".join(fields)] + [",".join(str(r[f]) for f in fields) for r in rows])
    head = "| " + " | ".join(fields) + " |\n|" + "---|" * len(fields)
    return head + "".join("\n| " + " | ".join(str(r[f]) for f in fields) + " |" for r in rows)


def _format_convert(rng, m, kind):
    a, b = rng.sample(["json", "yaml", "csv", "markdown"], 2)
    name = {"json": "JSON", "yaml": "YAML", "csv": "CSV", "markdown": "a markdown table"}
    ask = rng.choice([f"Convert this {name[a]} data to {name[b]}.",
                      f"Rewrite the following as {name[b]}, keeping every value.",
                      f"Here is some data as {name[a]}. Give me the same records as {name[b]}.",
                      f"Turn this into {name[b]}, then list the first field of each record."])
    data = _render(_records(rng, m), a)
    return f"generated:records:{a}->{b}", f"{ask}\n\n```{'text' if a == 'markdown' else a}\n{data}\n```"


def _table_edit(rng, m, kind):
    rows, fmt = _records(rng, m), rng.choice(["csv", "markdown"])
    fields = list(rows[0])
    num = [f for f in fields if type(rows[0][f]) in (int, float)]  # bools aside
    asks = [f"Reorder the columns to: {', '.join(rng.sample(fields, len(fields)))}. Output the whole table.",
            f"Write one SQL INSERT statement per row of this table, into a table `{rng.choice(m['words'])}`.",
            f"Drop the `{fields[-1]}` column and print the remaining table.",
            "Write a CREATE TABLE statement for this data, then the INSERT statements for every row."]
    asks += [f"Sort the rows by `{f}` in descending order and output the full table." for f in num[:1]]
    asks += ["Keep only the rows where active is true, unchanged, in the same format."] * ("active" in fields)
    if {"price", "quantity"} <= set(fields):
        asks += ["Add a `total` column equal to price times quantity; output the table."]
    return f"generated:records:{fmt}", f"{rng.choice(asks)}\n\n{_render(rows, fmt)}"


def _poly(coefs):
    """[3, 0, -2, 7] -> '3x^3 - 2x + 7'."""
    out, deg = "", len(coefs) - 1
    for k, c in enumerate(coefs):
        p = deg - k
        if c:
            term = ("" if abs(c) == 1 and p else str(abs(c))) + ("x" if p == 1 else f"x^{p}" if p else "")
            out += (" - " if c < 0 else " + ") + term if out else ("-" if c < 0 else "") + term
    return out or "0"


def _math(rng, m, kind):
    r = lambda lo, hi: rng.choice([v for v in range(lo, hi + 1) if v])
    task = rng.choice(["expand", "solve", "fractions", "evaluate", "derivative"])
    p = _poly([r(-9, 9)] + [rng.randint(-9, 9) for _ in range(rng.randint(2, 4))])
    if task == "expand":
        e = f"({_poly([r(1, 6), r(-9, 9)])})({_poly([r(1, 5), r(-9, 9)])})"
        asks = [f"Expand {e} and simplify. Show each step.", f"Multiply out {e} using FOIL, line by line."]
    elif task == "solve":
        x, a, b = r(-10, 10), r(-9, 9), r(-20, 20)
        c = rng.choice([v for v in range(-9, 10) if v != a])
        eq = f"{_poly([a, b])} = {_poly([c, (a - c) * x + b])}"  # solved by the integer x
        asks = [f"Solve {eq} for x step by step, writing the equation again after each step.",
                f"Solve the linear equation {eq}. Show your work and check the answer by substitution."]
    elif task == "fractions":
        qs = [Fraction(a, rng.randint(a + 1, 12)) for a in (r(1, 11) for _ in range(rng.randint(3, 5)))]  # < 1
        items = ", ".join(f"{q.numerator * k}/{q.denominator * k}" for q in qs for k in [rng.randint(2, 9)])
        asks = [f"Simplify each fraction, writing the answer as `a/b = c/d`: {items}",
                f"Reduce these fractions to lowest terms, showing the common factor for each: {items}"]
    elif task == "evaluate":
        xs = ", ".join(map(str, sorted(rng.sample(range(-4, 6), rng.randint(3, 5)))))
        asks = [f"Evaluate p(x) = {p} at x = {xs}. Show the substitution for each point.",
                f"Make a table of p(x) = {p} for x = {xs}, writing out each substitution."]
    else:
        asks = [f"Differentiate f(x) = {p} term by term, stating the rule used for each term.",
                f"Find f'(x) and f''(x) for f(x) = {p}. Restate f(x) first."]
    return f"generated:math:{task}", rng.choice(asks)


def _templates(rng, m, kind):
    k, task = rng.randint(3, 6), rng.choice(["people", "stubs", "services", "categories", "messages"])
    fs = rng.sample(m["functions"], k)
    src = f"{fs[0]['source']} and {k - 1} more" if task in ("stubs", "categories") else f"generated:{task}"
    if task == "people":
        tpl = rng.choice(["Name: {name}\nAge: {age}\nCity: {city}\nStatus: pending review",
                          "Dear {name},\nThanks for registering for the {city} meetup. We have you down as "
                          "{age} years old; reply if that is wrong.\nBest regards,\nThe organizers"])
        people = "\n".join(f"- {n}, {rng.randint(19, 70)}, {rng.choice(CITIES)}"
                           for n in rng.sample(FIRST_NAMES, k))
        return src, f"Fill in this template for each of the following people.\n\nTemplate:\n{tpl}\n\n" \
                    f"People:\n{people}"
    if task == "stubs":
        return src, ("For each function signature listed, write a stub with the same signature, a one-line "
                     "docstring and `raise NotImplementedError`.\n\n" + "\n".join(f["signature"] for f in fs))
    if task == "services":
        ex = rng.choice(['[service.NAME]\nimage = "registry.local/NAME:latest"\nport = PORT\nreplicas = N',
                         'NAME:\n  image: registry.local/NAME:latest\n  ports:\n    - "PORT:PORT"\n'
                         '  replicas: N'])
        services = "\n".join(f"- {n}: port {rng.randrange(3000, 9000)}, replicas {rng.randint(1, 5)}"
                             for n in rng.sample(m["words"], k))
        return src, ("Generate the config block for each of these services, following the example.\n\n"
                     f"Example:\n{ex}\n\nServices:\n{services}")
    if task == "categories":
        return src, ("Write a bulleted list repeating each of these names with its module as the category, "
                     "as `- name (module)`.\n\n" + "\n".join(f"{f['module']}.{f['qual']}" for f in fs))
    dates = ", ".join(f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" for _ in range(k))
    msg = (f"Hi {rng.choice(FIRST_NAMES)}, this is a reminder that your appointment at the "
           f"{rng.choice(CITIES)} office is on DATE. Please bring your ID and arrive ten minutes early.")
    return src, f"Write this message once for each date below, changing only the date.\n\n{msg}\n\n" \
                f"Dates: {dates}"


def _list_ops(rng, m, kind):
    fs = rng.sample(m["functions"], rng.randint(5, 8))
    src, names = f"{fs[0]['source']} and {len(fs) - 1} more", [f"{f['module']}.{f['qual']}" for f in fs]
    task = rng.randrange(4)
    if task == 0:
        paths = "\n".join(rng.sample(m["files"], rng.randint(5, 10)))
        return "stdlib:file names", f"Sort these file paths alphabetically, one per line.\n\n{paths}"
    if task == 1:
        rows = "\n".join(f"{n}: {rng.randint(1, 99)}" for n in names)
        return src, f"Sort these lines by the number, highest first, otherwise unchanged.\n\n{rows}"
    if task == 2:
        names = rng.sample(names + rng.sample(names, 2), len(names) + 2)
        return src, ("Remove the duplicates from this list, keeping the first occurrence of each, and print "
                     f"the result as a Python list.\n\n{json.dumps(names)}")
    names = "\n".join(names)
    return src, f"Turn this list into a markdown checklist, one `- [ ]` per name, in reverse order.\n\n{names}"


KINDS = {"code-edit": _code, "code-annotate": _code, "code-walkthrough": _code, "quote": _text,
         "rewrite": _text, "format-convert": _format_convert, "table-edit": _table_edit, "math": _math,
         "templates": _templates, "list-ops": _list_ops}


def build_prompts(seed=0, n=1200):
    """n prompts, spread evenly over KINDS. Each kind has its own RNG, so adding one changes no other."""
    m = load_material(seed)
    if not m["passages"] or not m["functions"]:
        raise RuntimeError(f"no usable standard library sources under {STDLIB}")
    prompts = []
    for k, (kind, gen) in enumerate(KINDS.items()):
        rng, seen, mine = random.Random(f"{seed}:{kind}"), set(), []
        want = n // len(KINDS) + (k < n % len(KINDS))
        for _ in range(100 * want):
            if len(mine) == want:
                break
            got = gen(rng, m, kind)
            if got and len(got[1]) <= MAX_CHARS and got[1] not in seen:
                seen.add(got[1])
                mine.append(dict(id=f"{kind}-{len(mine):05d}", kind=kind, split="train",
                                 source=got[0], prompt=got[1]))
        order = np.random.default_rng([seed, k]).permutation(len(mine))  # stratified 80/10/10
        n_eval = round(0.1 * len(mine))
        for rank, i in enumerate(order[:2 * n_eval]):
            mine[i]["split"] = "val" if rank < n_eval else "test"
        prompts += mine
    return prompts


def write_prompts(path="data/prompts.jsonl", manifest="data/manifest.json", seed=0, n=1200):
    prompts = build_prompts(seed, n)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts)
    kinds = {}
    for p in prompts:
        c = kinds.setdefault(p["kind"], {"train": 0, "val": 0, "test": 0, "sources": set()})
        c[p["split"]] += 1
        c["sources"].add(p["source"])
    info = dict(n=len(prompts), seed=seed, python=platform.python_version(), stdlib=str(STDLIB),
                date=date.today().isoformat(), total_chars=sum(len(p["prompt"]) for p in prompts),
                splits={s: sum(p["split"] == s for p in prompts) for s in ("train", "val", "test")},
                kinds={k: {**c, "sources": len(c["sources"])} for k, c in kinds.items()})
    Path(manifest).parent.mkdir(parents=True, exist_ok=True)
    Path(manifest).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def read_prompts(path):
    """The rows of a jsonl file; a line that is not an object with a string "prompt" is an error.
    Spec-Bench rows ({"question_id", "category", "turns"}) read as their first turn, with
    every 10th question in the validation split (general chat data for EAGLE-3 heads)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
            if isinstance(row, dict) and isinstance(row.get("turns"), list) and "question_id" in row:
                q = row["question_id"]
                row = {"id": f"sb-{q}", "kind": row.get("category", "spec-bench"), "prompt": (row["turns"] or [None])[0],
                       "split": "val" if i % 10 == 0 else "train"}
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f'{path}:{i}: expected a JSON object with a string "prompt"')
            rows.append(row)
    return rows

def subset(prompts, sizes: dict) -> list[dict]:
    """The first sizes[split] prompts of each split, taking kinds in turn (stays balanced)."""
    out = []
    for split, n in sizes.items():
        by_kind = {}
        for p in prompts:
            if p["split"] == split:
                by_kind.setdefault(p["kind"], []).append(p)
        queues = list(by_kind.values())
        while n > 0 and any(queues):
            for q in queues:
                if q and n > 0:
                    out.append(q.pop(0))
                    n -= 1
    return out


# ---------------------------------------------------------------------------------------
# JSON lines
# ---------------------------------------------------------------------------------------

def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def progress(i: int, n: int, t0: float, what: str):
    """A one-line progress bar on stderr (no dependency)."""
    done = i / n if n else 1.0
    spent = time.time() - t0
    eta = spent / done - spent if done else 0
    bar = "#" * int(30 * done)
    print(f"\r{what} [{bar:30s}] {i}/{n} {spent / 60:.1f} min, eta {eta / 60:.1f} min",
          end="\n" if i == n else "", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Features: every layer's residual stream at each completion token, as fp16 memmaps
# ---------------------------------------------------------------------------------------

def open_features(folder, kind: str, mode="r"):
    """The (n_layers, n_tokens, dim) fp16 memmap of one position ("attn" or "mlp")."""
    return np.lib.format.open_memmap(Path(folder) / f"{kind}.npy", mode=mode)


def extract_features(model, completions, folder, kappa=KAPPA, kinds=("attn", "mlp")):
    """One forward pass per example; stores, for every layer, the residual after the
    attention sublayer ("attn": what the probe reads) and after the MLP ("mlp": the
    ablation), at each completion token, plus its label Y_j. Resumable per example.

    Token j's features come from the position where j is the input, the state the decode
    loop has in hand when it must decide how to draft what follows j.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    L, H = model.args.n_layers, model.args.dim
    index = folder / "index.json"
    if index.exists():
        info = json.loads(index.read_text())
        if info["ids"] != [c["id"] for c in completions]:
            raise ValueError(f"{index}: made from other completions; use a new folder")
    else:
        offsets = np.cumsum([0] + [len(c["output_ids"]) for c in completions]).tolist()
        info = {"ids": [c["id"] for c in completions], "splits": [c["split"] for c in completions],
                "kinds": [c["kind"] for c in completions], "offsets": offsets, "done": 0,
                "n_layers": L, "dim": H, "kappa": kappa, "fingerprint": model.fingerprint()}
        for kind in kinds:
            np.lib.format.open_memmap(folder / f"{kind}.npy", mode="w+", dtype=np.float16,
                                      shape=(L, offsets[-1], H))
        np.save(folder / "labels.npy", np.zeros(offsets[-1], dtype=np.uint8))
        index.write_text(json.dumps(info))
    maps = {kind: open_features(folder, kind, "r+") for kind in kinds}
    labels = np.load(folder / "labels.npy")
    capture = [(kind, l) for kind in kinds for l in range(L)]
    t0 = time.time()
    for i in range(info["done"], len(completions)):
        progress(i, len(completions), t0, "features")
        c = completions[i]
        ids, P = c["prompt_ids"] + c["output_ids"], len(c["prompt_ids"])
        a, b = info["offsets"][i], info["offsets"][i + 1]
        _, hid = model.forward_sequence(ids, capture, logits_at=slice(0, 0))
        for kind in kinds:
            for l in range(L):  # clamped into fp16's range (Qwen has large outlier dims)
                maps[kind][l, a:b] = hid[kind, l][P:].float().clamp(-65000, 65000).numpy()
        labels[a:b] = copy_labels(ids, P, kappa)
        if (i + 1) % 20 == 0 or i + 1 == len(completions):  # checkpoint for resuming
            for m in maps.values():
                m.flush()
            np.save(folder / "labels.npy", labels)
            info["done"] = i + 1
            index.write_text(json.dumps(info))
    progress(len(completions), len(completions), t0, "features")


# EAGLE-3's training data: the target's fused-layer inputs and next-token distributions.

def eagle_features(model, completions, folder, draft_ids, topk=32):
    """One forward pass per example: the inputs of layers 2, L//2 and L-3 at every position
    (the head's input), and the target's top-k logits over the draft vocabulary at every
    position (its training target). Resumable per example."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    L, H = model.args.n_layers, model.args.dim
    layers = (2, L // 2, L - 3)
    index = folder / "index.json"
    topk = min(topk, len(draft_ids))
    if index.exists():
        info = json.loads(index.read_text())
        if info["ids"] != [c["id"] for c in completions] or info["draft_ids"] != list(draft_ids):
            raise ValueError(f"{index}: made from other completions or another draft vocabulary; "
                             "use a new folder")
    else:
        lens = [len(c["prompt_ids"]) + len(c["output_ids"]) for c in completions]
        info = {"ids": [c["id"] for c in completions], "splits": [c["split"] for c in completions],
                "prompt_lens": [len(c["prompt_ids"]) for c in completions],
                "offsets": np.cumsum([0] + lens).tolist(), "done": 0, "layers": layers,
                "draft_ids": list(draft_ids), "topk": topk, "fingerprint": model.fingerprint()}
        N = info["offsets"][-1]
        np.lib.format.open_memmap(folder / "feats.npy", "w+", np.float16, (N, 3 * H))
        np.lib.format.open_memmap(folder / "top_logits.npy", "w+", np.float16, (N, topk))
        np.lib.format.open_memmap(folder / "top_ids.npy", "w+", np.int32, (N, topk))
        np.save(folder / "tokens.npy", np.concatenate([c["prompt_ids"] + c["output_ids"] for c in completions]))
        index.write_text(json.dumps(info))
    feats, tl, ti = (np.lib.format.open_memmap(folder / f, "r+") for f in ("feats.npy", "top_logits.npy", "top_ids.npy"))
    keep = torch.tensor(info["draft_ids"])
    t0 = time.time()
    for i in range(info["done"], len(completions)):
        progress(i, len(completions), t0, "eagle features")
        c = completions[i]
        ids = c["prompt_ids"] + c["output_ids"]
        a, b = info["offsets"][i], info["offsets"][i + 1]
        logits, hid = model.forward_sequence(ids, [("in", l) for l in layers])
        feats[a:b] = torch.cat([hid["in", l] for l in layers], -1).float().clamp(-65000, 65000).numpy()
        v, j = logits[:, keep].topk(info["topk"], dim=-1)  # over the draft vocabulary, as EAGLE-3 trains
        tl[a:b], ti[a:b] = v.numpy(), j.numpy()
        if (i + 1) % 20 == 0 or i + 1 == len(completions):
            for m in (feats, tl, ti):
                m.flush()
            info["done"] = i + 1
            index.write_text(json.dumps(info))
    progress(len(completions), len(completions), t0, "eagle features")


def eagle_examples(folder):
    """The features eagle_features wrote: (its index, example(i) -> one sequence's tokens,
    prompt length, features and top-k target logits, read from the memmaps)."""
    folder = Path(folder)
    info = json.loads((folder / "index.json").read_text())
    if info["done"] != len(info["ids"]):
        raise ValueError(f"{folder}: EAGLE features are incomplete ({info['done']}/{len(info['ids'])})")
    arrays = {k: np.load(folder / f"{k}.npy", mmap_mode="r") for k in ("feats", "top_logits", "top_ids")}
    tokens = np.load(folder / "tokens.npy")

    def example(i):
        a, b = info["offsets"][i], info["offsets"][i + 1]
        return {"tokens": tokens[a:b].tolist(), "prompt_len": info["prompt_lens"][i],
                **{k: torch.from_numpy(np.asarray(v[a:b], dtype=np.float32 if k != "top_ids" else np.int64))
                   for k, v in arrays.items()}}
    return info, example


# ---------------------------------------------------------------------------------------
# Ablation data (paper section 4.3): other sources of copy labels, teacher-forced
# ---------------------------------------------------------------------------------------

def constructed_copy(vocab_ids, n=200, length=256, seed=0) -> list[dict]:
    """ConstructedCopy: random token sequences with planted repeats (spans of 5-30 tokens
    copied from earlier in the sequence). The 'completion' is all but the first 16 tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        seq = [rng.choice(vocab_ids) for _ in range(16)]
        while len(seq) < length:
            if rng.random() < 0.5 and len(seq) > 40:
                a = rng.randrange(len(seq) - 30)
                seq += seq[a:a + rng.randrange(5, 31)]
            else:
                seq += [rng.choice(vocab_ids) for _ in range(rng.randrange(5, 30))]
        out.append({"id": f"constructed-{i:04d}", "kind": "constructed", "split": "train" if i % 10 else "val",
                    "prompt_ids": seq[:16], "output_ids": seq[16:length]})
    return out


def doc_texts(rng) -> list[str]:
    """Prose on every machine: the Python docs in pydoc_data and /usr/share/common-licenses,
    in an order shuffled by rng."""
    texts = []
    try:
        from pydoc_data.topics import topics
        texts += [topics[k] for k in sorted(topics)]
    except ImportError:
        pass
    if LICENSES.is_dir():
        texts += [_read(p) or "" for p in sorted(LICENSES.iterdir()) if p.is_file()]
    rng.shuffle(texts)
    return texts


def natural_text(tok, n=200, length=256, seed=0) -> list[dict]:
    """Natural text with whatever repeats it has: the Python documentation shipped in the
    stdlib (pydoc_data) and /usr/share/common-licenses, cut into windows of `length` tokens."""
    rng = random.Random(seed)
    texts = doc_texts(rng)
    out = []
    for text in texts:
        ids = tok.encode(text, special=False)
        for a in range(0, len(ids) - length + 1, length):
            i = len(out)
            out.append({"id": f"natural-{i:04d}", "kind": "natural", "split": "train" if i % 10 else "val",
                        "prompt_ids": ids[a:a + 16], "output_ids": ids[a + 16:a + length]})
            if len(out) == n:
                return out
    return out


# ---------------------------------------------------------------------------------------
# Reference text and a draft vocabulary, for EAGLE-3 heads
# ---------------------------------------------------------------------------------------

def reference_text(tok, n=600, length=384, seed=0) -> list[dict]:
    """EAGLE-1-style fixed data for a head: text the target did not write, put in an
    assistant turn so that its features and next-token distributions are the target's own.
    Half are windows of CPython standard-library sources (as a fenced Python answer), half
    of the Python docs and /usr/share licenses (prose). A target forward over a window
    costs ~20x less than generating it, so this buys the head far more data for the same
    CPU. Every 10th window is held out for validation."""
    rng = random.Random(seed)
    files = sorted(p for p in STDLIB.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(STDLIB).parts[:-1]))
    rng.shuffle(files)
    texts = doc_texts(rng)
    sources = (("code", "Show me a piece of Python's standard library.", ("```python\n" + (_read(p) or "") for p in files)),
               ("prose", "Explain this part of the Python documentation.", iter(texts)))
    out = []
    for kind, ask, docs in sources:
        prompt, quota = tok.prompt_ids(ask), len(out) + n // 2
        for text in docs:
            ids = tok.encode(text, special=False)
            for a in range(0, len(ids) - length // 2, length):  # whole windows, and a last half one
                out.append({"id": f"text-{kind}-{len(out):04d}", "kind": f"text-{kind}",
                            "split": "val" if len(out) % 10 == 9 else "train",
                            "prompt_ids": prompt, "output_ids": ids[a:a + length]})
                if kind == "code" or len(out) == quota:
                    break  # one window per source file: many files, not a few long ones
            if len(out) == quota:
                break
    return out


def draft_vocabulary(completions, n: int) -> list[int]:
    """The n most frequent tokens of the completions (EAGLE-3's draft vocabulary), sorted.
    Ties, and the tokens the completions never use, go in id order: a byte-level BPE numbers
    its tokens by merge order, i.e. by its own corpus's frequency, so a vocabulary larger
    than the data's fills up with the tokens other domains need most."""
    counts = np.bincount(np.concatenate([c["output_ids"] for c in completions]))
    return sorted(np.argsort(-counts, kind="stable")[:n].tolist())

def main(argv=None):
    ap = argparse.ArgumentParser(description="The probe's prompt set (python probe.py makes the rest).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write the prompt set and its manifest.json next to it")
    p.add_argument("--n", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="data/prompts.jsonl")
    args = ap.parse_args(argv)
    info = write_prompts(args.out, str(Path(args.out).with_name("manifest.json")), args.seed, args.n)
    print(f"{info['n']} prompts, {info['total_chars']} chars -> {args.out} "
          f"(sources: Python {info['python']} stdlib)")
    for kind, c in info["kinds"].items():
        print(f"  {kind:17s} train {c['train']:4d}  val {c['val']:3d}  test {c['test']:3d}  "
              f"sources {c['sources']}")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")

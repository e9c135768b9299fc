"""A tiny byte-level BPE tokenizer and ChatML chat template for the tiny checkpoint.

build_tiny_checkpoint writes weights and config.json only; a real engine (vLLM on the GPU probe,
tests/device/vllm_cuda_probe.sh) also needs a tokenizer and a chat template to answer a chat
completion. This one fits the tiny config exactly:

- 512 ids, the config's vocab_size: 256 byte symbols (GPT-2's byte-to-unicode alphabet, ids
  0-255), 249 merges (ids 256-504) learnt by a plain BPE pass over CORPUS below, then 7
  Qwen-style special tokens at 505-511:
  <|endoftext|> 505 (pad), <|vision_start|> 506, <|vision_end|> 507, <|image_pad|> 508,
  <|video_pad|> 509 (the config's vision ids), <|im_start|> 510, <|im_end|> 511 (the config's
  eos_token_id);
- a ChatML chat template (the same text as tiny_models.CHATML_TEMPLATE).

Standard library only, deterministic: the same files on every machine (no training library,
no timestamps). The files are what `tokenizers` / `transformers` read (tokenizer.json,
tokenizer_config.json with the template, chat_template.jinja, generation_config.json).

    python -m servefleet_dev.testing.tiny_tokenizer DIR      # write the files into DIR
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

VOCAB_SIZE = 512
N_MERGES = 249
SPECIALS = [
    "<|endoftext|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|im_start|>",
    "<|im_end|>",
]
FIRST_SPECIAL = VOCAB_SIZE - len(SPECIALS)  # 505
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MODEL_MAX_LENGTH = 4096  # the tiny config's max_position_embeddings

# What the merges are learnt from: fixed text, so the merges never change.
CORPUS = """\
servefleet provisions LLM serving nodes with pyinfra: a DGX Spark serves the BF16 checkpoint
with vLLM, an RTX 4090 serves the Q4_K_M GGUF with llama.cpp, and a depot keeps verified copies
of the models. Every node has one layout, one data contract and one health check. The health
check waits for /health, reads the engine's KV cache lines, compares them with plan-kv, sends
one chat completion and waits for the service to settle. The benchmark streams chat completions
and reports the time to the first token and the decode speed in tokens per second.
Say hello in one word. Hello! Hello, world. The model answers the user; the assistant says ok.
system user assistant tool message content role name function arguments result error warning
def main(argv): return 0 if ok else 1  # python code, json, yaml and shell lines
{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
for i in range(10): print(i, i * 2, i ** 2)  0123456789 2026 4096 3000 8000 8080 65536
The quick brown fox jumps over the lazy dog. A fleet of nodes, a node of the fleet.
"""

# GPT-2's pre-tokenizer split, with ASCII classes instead of \\p{L} / \\p{N} (close enough to
# learn merges; encoding itself uses the tokenizers library's own ByteLevel split).
_SPLIT = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=False)}


def learn_merges(corpus: str = CORPUS, n: int = N_MERGES) -> list[tuple[str, str]]:
    """Plain BPE: repeatedly merge the most frequent adjacent pair (ties: the smallest pair)."""
    table = bytes_to_unicode()
    words = Counter(
        tuple(table[b] for b in piece.encode("utf-8")) for piece in _SPLIT.findall(corpus)
    )
    merges: list[tuple[str, str]] = []
    while len(merges) < n:
        pairs: Counter = Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:], strict=False):
                pairs[(a, b)] += count
        if not pairs:
            raise ValueError(f"the corpus gives only {len(merges)} merges, {n} wanted")
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        merged: Counter = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def tokenizer_json() -> dict:
    """tokenizer.json (the `tokenizers` library's format) of the tiny tokenizer."""
    alphabet = sorted(bytes_to_unicode().values())  # the order tokenizers' BPE trainer uses
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = learn_merges()
    for a, b in merges:
        if a + b in vocab:
            raise ValueError(f"merge {a!r} + {b!r} gives a token already in the vocabulary")
        vocab[a + b] = len(vocab)
    if len(vocab) != FIRST_SPECIAL:
        raise ValueError(f"{len(vocab)} regular tokens, {FIRST_SPECIAL} wanted")
    added = [
        {
            "id": FIRST_SPECIAL + k,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for k, s in enumerate(SPECIALS)
    ]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def tokenizer_config() -> dict:
    """tokenizer_config.json: the fast tokenizer class, specials, the chat template."""
    decoder = {
        str(FIRST_SPECIAL + k): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for k, s in enumerate(SPECIALS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def generation_config() -> dict:
    return {
        "eos_token_id": FIRST_SPECIAL + SPECIALS.index(EOS),
        "pad_token_id": FIRST_SPECIAL + SPECIALS.index(PAD),
        "do_sample": False,
    }


def write_tiny_tokenizer(directory: str | Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json, chat_template.jinja and
    generation_config.json into directory (a tiny checkpoint's) and return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(),
        "generation_config.json": generation_config(),
    }
    for name, value in files.items():
        (directory / name).write_text(
            json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(write_tiny_tokenizer(sys.argv[1]))

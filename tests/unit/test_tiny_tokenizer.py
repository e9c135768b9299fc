"""The tiny checkpoint's tokenizer (servefleet_dev.testing.tiny_tokenizer): ids fit the tiny
config exactly, the files are deterministic, and `tokenizers`
and `transformers` (in the CPU loader venv, as vLLM has them) load them, round-trip text and
render the chat template."""

import json
import subprocess

from servefleet_dev.testing import tiny_models, tiny_tokenizer as tt
from servefleet_dev.testing.wheels import cache_lock, vllm_venv


def test_ids_fit_the_tiny_config(tmp_path):
    tt.write_tiny_tokenizer(tmp_path)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    config = tiny_models.tiny_config()
    vocab = tok["model"]["vocab"]
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert len(vocab) == 505 and sorted(vocab.values()) == list(range(505))
    assert len(tok["model"]["merges"]) == tt.N_MERGES
    assert len(vocab) + len(added) == config["text_config"]["vocab_size"] == 512
    assert added["<|im_end|>"] == config["text_config"]["eos_token_id"] == 511
    assert (
        added["<|vision_start|>"],
        added["<|vision_end|>"],
        added["<|image_pad|>"],
        added["<|video_pad|>"],
    ) == (
        config["vision_start_token_id"],
        config["vision_end_token_id"],
        config["image_token_id"],
        config["video_token_id"],
    )
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 511
    assert (tmp_path / "chat_template.jinja").read_text() == tiny_models.CHATML_TEMPLATE


def test_files_are_deterministic(tmp_path):
    a, b = tt.write_tiny_tokenizer(tmp_path / "a"), tt.write_tiny_tokenizer(tmp_path / "b")
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    ):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_every_merge_is_made_of_tokens_before_it():
    vocab = tt.tokenizer_json()["model"]["vocab"]
    for merge in tt.tokenizer_json()["model"]["merges"]:
        left, right = merge.split(" ")
        assert vocab[left] < vocab[left + right] and vocab[right] < vocab[left + right]


# The libraries vLLM loads the tokenizer with live in the CPU loader venv (the real vLLM 0.24.0
# wheel's closure), not in servefleet's own venv: run the checks there.
LIBRARY_CHECK = r"""
import json, sys
import tokenizers, transformers
d = sys.argv[1]
tok = tokenizers.Tokenizer.from_file(d + "/tokenizer.json")
text = "Say hello in one word. \u00dcn\u00efcode \u2713 \u4e2d\u6587\n\t  spaces"
ids = tok.encode(text).ids
hf = transformers.AutoTokenizer.from_pretrained(d)
messages = [{"role": "user", "content": "Say hello in one word."}]
print(json.dumps({
    "size": tok.get_vocab_size(with_added_tokens=True), "max_id": max(ids),
    "round_trip": tok.decode(ids) == text, "im_start": tok.encode("<|im_start|>user").ids[0],
    "len": len(hf), "eos": hf.eos_token_id, "pad": hf.pad_token_id,
    "chat": hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)}))
"""


def test_tokenizers_and_transformers_load_it(tmp_path):
    venv = vllm_venv("0.24.0")
    with cache_lock(venv.name):
        tt.write_tiny_tokenizer(tmp_path)
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", LIBRARY_CHECK, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["size"] == 512 and got["max_id"] < 505 and got["round_trip"]
    assert got["im_start"] == 510
    assert (got["len"], got["eos"], got["pad"]) == (512, 511, 505)
    assert (
        got["chat"] == "<|im_start|>user\nSay hello in one word.<|im_end|>\n<|im_start|>assistant\n"
    )

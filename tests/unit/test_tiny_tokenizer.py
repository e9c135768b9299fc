"""The tiny checkpoint's tokenizer (servefleet_dev.testing.tiny_tokenizer): ids fit the tiny
config exactly, the files are deterministic, and (where the libraries are installed) `tokenizers`
and `transformers` load them, round-trip text and render the chat template."""

import json

import pytest

from servefleet_dev.testing import tiny_models
from servefleet_dev.testing import tiny_tokenizer as tt


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
    assert (added["<|vision_start|>"], added["<|vision_end|>"], added["<|image_pad|>"],
            added["<|video_pad|>"]) == (config["vision_start_token_id"],
                                         config["vision_end_token_id"], config["image_token_id"],
                                         config["video_token_id"])
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 511
    assert (tmp_path / "chat_template.jinja").read_text() == tiny_models.CHATML_TEMPLATE


def test_files_are_deterministic(tmp_path):
    a, b = tt.write_tiny_tokenizer(tmp_path / "a"), tt.write_tiny_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "chat_template.jinja"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_every_merge_is_made_of_tokens_before_it():
    vocab = tt.tokenizer_json()["model"]["vocab"]
    for merge in tt.tokenizer_json()["model"]["merges"]:
        left, right = merge.split(" ")
        assert vocab[left] < vocab[left + right] and vocab[right] < vocab[left + right]


def test_tokenizers_round_trip(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tt.write_tiny_tokenizer(tmp_path)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 512
    text = "Say hello in one word. Ünïcode ✓ 中文\n\t  spaces"
    ids = tok.encode(text).ids
    assert max(ids) < 505 and tok.decode(ids) == text
    assert tok.encode("<|im_start|>user").ids[0] == 510


def test_transformers_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("jinja2")
    tt.write_tiny_tokenizer(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 512 and tok.eos_token_id == 511 and tok.pad_token_id == 505
    messages = [{"role": "user", "content": "Say hello in one word."}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nSay hello in one word.<|im_end|>\n<|im_start|>assistant\n")

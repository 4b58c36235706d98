"""Writes the small tokenizers the gateway tests use (committed; run again only to change them).

    python3 -m pip install tokenizers
    python3 tests/data/tokenizer/make.py

Two byte-pair encodings of 1,000 tokens, trained on the repository's README and design
notes, each with ChatML's special tokens:
- bytelevel/: GPT-2's byte-level pre-tokenizer (as Qwen and Llama 3 tokenizers use);
- metaspace/: SentencePiece's metaspace pre-tokenizer, prepending "▁" to the first piece
  only (as Llama 2 and Mistral tokenizers do).
Each directory also has a tokenizer_config.json with a ChatML chat template.
"""

import json
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent.parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "src" / "lib.rs"]

TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train(pre_tokenizer, decoder, directory):
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoder
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        if isinstance(pre_tokenizer, pre_tokenizers.ByteLevel)
        else [],
        show_progress=False,
    )
    tokenizer.train([str(p) for p in CORPUS], trainer)
    out = HERE / directory
    out.mkdir(exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": TEMPLATE,
        "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


train(
    pre_tokenizers.ByteLevel(add_prefix_space=False),
    decoders.ByteLevel(),
    "bytelevel",
)
train(
    pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
    decoders.Metaspace(replacement="▁", prepend_scheme="first"),
    "metaspace",
)

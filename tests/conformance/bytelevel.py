"""Prompts as token IDs for ``nixl_worker.py``, the way the gateway's test tokenizer makes them.

The gateway's tests read text and chat prompts with ``tests/data/tokenizer/bytelevel``: a
byte-level BPE ``tokenizer.json`` (GPT-2's pre-tokenizer regex, no normalizer, no
post-processor) and a ChatML template in ``tokenizer_config.json``. The harness's venv has
neither ``tokenizers`` nor ``jinja2``, so this module reads the same two files itself:

* ``Tokenizer.encode``: the text is cut at the added (special) tokens, each other piece is
  split by the byte-level pre-tokenizer's regex, mapped to GPT-2's byte alphabet and merged
  by the BPE's ranked merges, as ``tokenizers`` does for this configuration;
* ``render_chat``: the one template it knows (ChatML, with the default system prompt when
  the first message is not a system message), checked against the config's
  ``chat_template`` text so that another template is refused rather than guessed.

``tests/gateway/pd_vllm.rs`` compares every prompt the worker tokenized with the gateway's
own tokenization (the Rust ``tokenizers`` crate and ``minijinja``), token for token.
"""

import json
import os

import regex

# GPT-2's pre-tokenizer pattern, which ``ByteLevel(use_regex=True)`` applies.
_PRETOKENIZE = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

# The chat template this module renders (tests/data/tokenizer/*/tokenizer_config.json).
CHATML = (
    "{%- for message in messages %}{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_alphabet():
    """GPT-2's map from bytes to printable characters (``bytes_to_unicode``)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


class Tokenizer:
    def __init__(self, directory):
        with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        model = spec["model"]
        pre = spec.get("pre_tokenizer") or {}
        if (model.get("type") != "BPE" or spec.get("normalizer") is not None
                or spec.get("post_processor") is not None or pre.get("type") != "ByteLevel"
                or pre.get("add_prefix_space") or not pre.get("use_regex", True)):
            raise SystemExit(f"{directory}: not a plain byte-level BPE tokenizer")
        self.vocab = model["vocab"]
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        self.ranks = {tuple(m): i for i, m in enumerate(merges)}
        self.added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        if any(not t.get("special") or t.get("normalized") or t.get("lstrip") or t.get("rstrip")
               or t.get("single_word") for t in spec.get("added_tokens", [])):
            raise SystemExit(f"{directory}: added tokens of a kind this module does not split")
        # Longest first: a leftmost-longest match, as tokenizers' added-vocabulary split.
        self.split = regex.compile("(" + "|".join(
            regex.escape(t) for t in sorted(self.added, key=len, reverse=True)) + ")")
        self.alphabet = _byte_alphabet()
        self.cache = {}
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        self.chatml = config.get("chat_template") == CHATML

    def encode(self, text):
        ids = []
        for piece in self.split.split(text) if self.added else [text]:
            if not piece:
                continue
            if piece in self.added:
                ids.append(self.added[piece])
                continue
            for word in _PRETOKENIZE.findall(piece):
                ids.extend(self._word(word))
        return ids

    def _word(self, word):
        cached = self.cache.get(word)
        if cached is not None:
            return cached
        parts = [self.alphabet[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            ranked = [p for p in pairs if p[0] is not None]
            if not ranked:
                break
            best = min(ranked)[0]
            merged, i = [], 0
            while i < len(parts):
                if (i + 1 < len(parts) and self.ranks.get((parts[i], parts[i + 1])) == best):
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        try:
            ids = [self.vocab[p] for p in parts]
        except KeyError as e:
            raise ValueError(f"no token for {e.args[0]!r} in the vocabulary") from None
        self.cache[word] = ids
        return ids

    def render_chat(self, body):
        """The ChatML text of a chat request, as the gateway's template renders it."""
        if not self.chatml:
            raise ValueError("this worker renders only the ChatML template of the test tokenizer")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError('"messages" must be a non-empty list')
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f'"messages"[{i}] has no "role"')
            content = m.get("content")
            if content is None:
                content = ""
            elif isinstance(content, list):
                if not all(isinstance(p, dict) and p.get("type") == "text"
                           and isinstance(p.get("text"), str) for p in content):
                    raise ValueError(f'"messages"[{i}].content: only text parts are read')
                content = "\n".join(p["text"] for p in content)
            elif not isinstance(content, str):
                raise ValueError(f'"messages"[{i}].content is not text')
            if i == 0 and m["role"] != "system":
                out.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
            out.append(f"<|im_start|>{m['role']}\n{content.strip()}<|im_end|>\n")
        if body.get("add_generation_prompt", True):
            out.append("<|im_start|>assistant\n")
        return "".join(out)

"""The tokenizer, built with the ``tokenizers`` library from a GGUF file's metadata or a ``tokenizer.json``.

GGUF (``tokenizer.ggml.model == "gpt2"``: byte-level BPE, which every family the engine runs
uses): the vocabulary is ``tokenizer.ggml.tokens`` (already spelled in GPT-2's byte alphabet),
the merges ``tokenizer.ggml.merges``; tokens marked CONTROL (type 3, ``<|im_start|>``...) become
special added tokens, matched whole and dropped by ``decode(skip_special_tokens=True)``; tokens
marked USER_DEFINED (type 4, ``<think>``) are matched whole but kept. How text is split before
BPE depends on the vocabulary (``tokenizer.ggml.pre``): :data:`PRE_TOKENIZERS` maps each name to
the split its merges were learned with; an unknown name falls back to GPT-2's byte-level regex
with a warning. SmolLM2's split (``smollm``) isolates every digit before GPT-2's regex, as the
model's own ``tokenizer.json`` and llama.cpp's ``smollm`` pre-tokenizer do. transformers' GGUF
reader splits as GPT-2 alone, so a digit after a space (``" 1"``) tokenizes differently there;
everywhere else the ids are equal, and with the digit split given to transformers' tokenizer
they are equal on every text (``tests/test_engine.py``).

SentencePiece GGUF vocabularies (``tokenizer.ggml.model == "llama"``: Llama 2, Mistral v0.1)
are not built from GGUF here: load such a model from its HF folder (``tokenizer.json``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _Backend

_CONTROL, _USER_DEFINED = 3, 4

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split(pattern: str) -> Callable[[], Any]:
    return lambda: pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _gpt2() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> Any:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


#: ``tokenizer.ggml.pre`` -> the pre-tokenizer its merges were learned with.
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "default": _gpt2, "gpt2": _gpt2, "gpt-2": _gpt2,
    "smollm": _digits_then_gpt2,
    "qwen2": _split(_QWEN2), "deepseek-r1-qwen": _split(_QWEN2),
    "llama3": _split(_LLAMA3), "llama-v3": _split(_LLAMA3), "llama-bpe": _split(_LLAMA3),
    "smaug-bpe": _split(_LLAMA3),
}


class Tokenizer:
    """Encode and decode text for the engine (the subset of the transformers tokenizer API that
    slimrag uses). ``eos_token_id``: the end-of-sequence id the model files name, or None."""

    def __init__(self, backend: _Backend, eos_token_id: int | None) -> None:
        self.backend, self.eos_token_id = backend, eos_token_id

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """From GGUF metadata (see the module header)."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer {kind!r} is not supported (byte-level BPE 'gpt2' is); "
                             "load this model from its HF folder with tokenizer.json instead")
        tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
        types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        vocab = {t: i for i, t in enumerate(tokens)}
        backend = _Backend(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        if pre not in PRE_TOKENIZERS:
            warnings.warn(f"GGUF pre-tokenizer {pre!r} is unknown; splitting text as GPT-2 does, "
                          "which may tokenize differently from the model's own tokenizer", stacklevel=2)
        backend.pre_tokenizer = PRE_TOKENIZERS.get(pre, _gpt2)()
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, ty in zip(tokens, types, strict=True) if ty == _USER_DEFINED])
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(backend, None if eos is None else int(eos))

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """From an HF folder's ``tokenizer.json`` (EOS named in ``tokenizer_config.json`` or
        ``config.json``)."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json")
        backend = _Backend.from_file(str(path))
        eos: int | None = None
        conf = folder / "tokenizer_config.json"
        if conf.is_file():
            token = json.loads(conf.read_text()).get("eos_token")
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str):
                eos = backend.token_to_id(token)
        if eos is None and (folder / "config.json").is_file():
            value = json.loads((folder / "config.json").read_text()).get("eos_token_id")
            eos = value[0] if isinstance(value, list) and value else value if isinstance(value, int) else None
        return cls(backend, eos)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens written in it (``<|im_start|>``) are matched whole.
        ``add_special_tokens``: whether the tokenizer's post-processor adds BOS/EOS."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True,
               clean_up_tokenization_spaces: bool = False) -> str:
        """Text of ``ids``; special tokens dropped when ``skip_special_tokens``. Spacing is left as
        the tokens encode it (``clean_up_tokenization_spaces`` must stay False)."""
        if clean_up_tokenization_spaces:
            raise ValueError("clean_up_tokenization_spaces is not supported: it changes the text tokens encode")
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def get_vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included."""
        return dict(self.backend.get_vocab(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string, or None."""
        return self.backend.token_to_id(token)

    def __len__(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

"""The shape of a Llama-family decoder, read from a GGUF file's metadata or an HF ``config.json``.

One frozen :class:`ModelConfig` describes every architecture the engine runs; the differences
between the families are a handful of flags, not subclasses:

=============  ==========  =========  =================  ==========================================
family         qkv bias    q/k norm   tied embeddings    notes
=============  ==========  =========  =================  ==========================================
Llama, SmolLM2 no          no         often (SmolLM2)    Llama 3 RoPE scaling (``llama3``)
Mistral        no          no         no                 ``sliding_window`` caps the context
Qwen2 / 2.5    yes         no         small sizes        ``yarn`` RoPE scaling in long-context builds
Qwen3          no          yes        small sizes        RMSNorm over each head's q and k before RoPE
=============  ==========  =========  =================  ==========================================

``rope`` is a :class:`slimrag.llm.model.rope.RopeConfig` (theta, scaling type and its knobs).
``max_positions`` is the context the engine admits: the model's ``max_position_embeddings``,
capped by Mistral's sliding window (the engine attends to every key, so past the window it would
compute something the model never saw; refusing is honest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slimrag.llm.model.rope import RopeConfig

#: HF ``model_type`` / GGUF ``general.architecture`` -> the flags that family sets.
FAMILIES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "mistral": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Sizes and flags of one decoder (see the module header)."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_positions: int
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    eos_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.arch not in FAMILIES:
            raise ValueError(f"unsupported architecture {self.arch!r}; the engine runs {sorted(FAMILIES)}")
        sizes = (self.vocab_size, self.hidden_size, self.intermediate_size, self.num_layers, self.num_heads,
                 self.num_kv_heads, self.head_dim, self.max_positions)
        if min(sizes) <= 0:
            raise ValueError(f"model sizes must be positive, got {sizes}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} query heads do not group over {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token adds to the cache in float32, over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """From a transformers ``config.json`` (as a dict)."""
        arch = str(raw.get("model_type", ""))
        if arch not in FAMILIES:
            raise ValueError(f"config.json has model_type {arch!r}; the engine runs {sorted(FAMILIES)}")
        heads = int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or raw["hidden_size"] // heads)
        limit = int(raw.get("max_position_embeddings", 2048))
        window = raw.get("sliding_window") if raw.get("use_sliding_window", arch == "mistral") else None
        if window:
            limit = min(limit, int(window))
        eos = raw.get("eos_token_id")
        flags = dict(FAMILIES[arch])
        if "attention_bias" in raw:
            flags["qkv_bias"] = bool(raw["attention_bias"])
        return cls(
            arch=arch, vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads), head_dim=head_dim,
            rms_eps=float(raw.get("rms_norm_eps", 1e-6)), max_positions=limit,
            rope=RopeConfig.from_hf(raw, head_dim), tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)), **flags)

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tied: bool) -> ModelConfig:
        """From a GGUF file's metadata. ``tied``: the file has no ``output.weight`` (the
        embedding matrix doubles as the output projection)."""
        arch = str(meta.get("general.architecture", ""))
        if arch not in FAMILIES:
            raise ValueError(f"GGUF architecture {arch!r} is not one the engine runs ({sorted(FAMILIES)})")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{key}")
            return value

        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
        vocab = int(meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ())))
        limit = int(get("context_length"))
        window = meta.get(f"{arch}.attention.sliding_window")
        if window:
            limit = min(limit, int(window))
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            arch=arch, vocab_size=vocab, hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")), num_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads), head_dim=head_dim,
            rms_eps=float(get("attention.layer_norm_rms_epsilon")), max_positions=limit,
            rope=RopeConfig.from_gguf(meta, arch, head_dim), tie_embeddings=tied,
            eos_ids=() if eos is None else (int(eos),), **FAMILIES[arch])

"""Random-weight reference models for the engine's tests: built with transformers, saved as an HF folder.

transformers is the reference the engine is checked against: a tiny model of a given family is
built with seeded random weights, saved (``config.json`` + ``model.safetensors``) beside the
embedded SmolLM2's tokenizer (``tokenizer.json``, so prompts tokenize as with the real model),
and both transformers and the engine load that folder. Every transformers use sits inside
``slimrag.hf.using_transformers()`` (its lazy module is not thread-safe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimrag.hf import using_transformers
from slimrag.llm.model import Tokenizer

#: family -> (config class, model class, extra config fields)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
}


def build_reference(family: str, folder: Path, tokenizer: Tokenizer, *, seed: int = 0, layers: int = 3,
                    rope: dict[str, Any] | None = None, **overrides: Any) -> Any:
    """Save a random-weight ``family`` model into ``folder`` and return the transformers model (eval)."""
    import torch

    with using_transformers():
        import transformers

        config_name, model_name, extra = FAMILIES[family]
        fields: dict[str, Any] = {
            "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 4096, "rope_theta": 10000.0, **extra, **overrides}
        if rope is not None:
            fields["rope_scaling"] = rope
        config = getattr(transformers, config_name)(**fields)
        torch.manual_seed(seed)
        model = getattr(transformers, model_name)(config).eval()
        # random init leaves norms at 1: perturb them so a missing norm cannot pass unnoticed
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith("bias"):
                    p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(folder)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    return model

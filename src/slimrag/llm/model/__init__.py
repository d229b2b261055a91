"""The model: a Llama-family decoder in plain PyTorch (Llama/SmolLM2, Qwen2/2.5, Qwen3, Mistral).

Parts, one module each, imported one way down: ``config`` (the model's shape), ``rope``
(rotary embedding and its scalings), ``norm`` (RMSNorm), ``cache`` (the engine's K/V layout),
``attention`` (grouped-query attention over the cache), ``qlinear`` (products computed on a
GGUF's quantized blocks with ONNX Runtime's ``MatMulNBits``), ``bf16`` (a prefill's products in
bfloat16 on AMX, over a held copy of the weights), ``model`` (the decoder and its
forward), ``prefill`` (one forward for all uncached segments of a request, each segment's K/V
bitwise those of a run with its prefix cached), ``batch`` (one decode step for many sequences,
each row computed as its one-token forward would be),
``gguf`` (the GGUF reader and dequantizer), ``tokenizer`` (``tokenizers`` built from GGUF
metadata or ``tokenizer.json``), ``loader`` (a file or folder to a model and tokenizer).
No part imports transformers.
"""

from slimrag.llm.model.cache import KVCache
from slimrag.llm.model.config import ModelConfig
from slimrag.llm.model.loader import load_checkpoint
from slimrag.llm.model.model import Decoder
from slimrag.llm.model.rope import Rope, RopeConfig
from slimrag.llm.model.tokenizer import Tokenizer

__all__ = ["Decoder", "KVCache", "ModelConfig", "Rope", "RopeConfig", "Tokenizer", "load_checkpoint"]

"""Write a random-weight GGUF in a real model's shapes and llama.cpp's Q4_K_M type mix, for speed runs.

``python -m bench.make_gguf OUT.gguf [--shape llama-3.2-1b|qwen2.5-1.5b|smollm2-135m]``. The weights are random blocks
(random bytes with sane float16 scales; ``gguf.quants`` has no K-quant quantizer, and random
weights are all a speed run needs), written with the ``gguf`` package's ``GGUFWriter`` as raw
blocks. Type mix as llama.cpp's ``Q4_K_M``: Q4_K everywhere but ``attn_v`` and ``ffn_down`` of
the first and last eighth of the layers and every third layer between (Q6_K), and the embedding
table, which doubles as the output head of a tied model (Q6_K). Norms are float32 ones, Qwen2's
q/k/v biases float32 zeros (arch ``qwen2``).

The vocabulary is the embedded SmolLM2's (49,152 tokens; the metadata's tokenizer must be a real
one for both engines to load), so the embedding table and output head have 49,152 rows instead
of the shape's own vocabulary; every other tensor has the real shape. Then:
``python -m bench.engine --gguf OUT.gguf``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

#: name -> (hidden, layers, heads, kv heads, intermediate, rope theta, GGUF arch); all tie the head
SHAPES = {"llama-3.2-1b": (2048, 16, 32, 8, 8192, 500000.0, "llama"),
          "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 1000000.0, "qwen2"),
          "smollm2-135m": (576, 30, 9, 3, 1536, 100000.0, "llama")}
Q4_K, Q6_K = 12, 14
_BYTES = {Q4_K: 144, Q6_K: 210}


def random_blocks(rng: np.random.Generator, rows: int, cols: int, kind: int) -> np.ndarray:
    """``uint8 [rows, cols / 256 * bytes]`` of random K-quant super-blocks with sane scales."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, _BYTES[kind]), dtype=np.uint8)
    scale = (0.0005 + rng.random((rows, cols // 256, 1)) * 0.0005).astype(np.float16).view(np.uint8)
    if kind == Q4_K:
        blocks[:, :, 0:2], blocks[:, :, 2:4] = scale, scale
    else:
        blocks[:, :, 208:210] = scale
    return blocks.reshape(rows, -1)


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers whose attn_v and ffn_down get Q6_K in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def main() -> None:
    import gguf

    from slimrag.llm.model.gguf import GGUFFile
    from slimrag.llm.weights import default_gguf_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    hidden, layers, heads, kv_heads, inter, theta, arch = SHAPES[args.shape]
    head_dim = hidden // heads
    meta = GGUFFile(default_gguf_path()).metadata
    vocab = len(meta["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(args.out, arch)
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])

    def add(name: str, rows: int, cols: int, kind: int) -> None:
        w.add_tensor(name, random_blocks(rng, rows, cols, kind), raw_dtype=gguf.GGMLQuantizationType(kind))

    add("token_embd.weight", vocab, hidden, Q6_K)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        big = Q6_K if more_bits(i, layers) else Q4_K
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        add(f"blk.{i}.attn_q.weight", heads * head_dim, hidden, Q4_K)
        add(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden, Q4_K)
        add(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden, big)
        if arch == "qwen2":
            for t, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                w.add_tensor(f"blk.{i}.attn_{t}.bias", np.zeros(rows * head_dim, np.float32))
        add(f"blk.{i}.attn_output.weight", hidden, heads * head_dim, Q4_K)
        add(f"blk.{i}.ffn_gate.weight", inter, hidden, Q4_K)
        add(f"blk.{i}.ffn_up.weight", inter, hidden, Q4_K)
        add(f"blk.{i}.ffn_down.weight", hidden, inter, big)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: {Path(args.out).stat().st_size / 1e6:.0f} MB, {args.shape} shapes, vocabulary {vocab}")


if __name__ == "__main__":
    main()

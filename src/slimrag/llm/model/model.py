"""The Llama-family decoder in plain PyTorch: embeddings, N x (RMSNorm, attention, RMSNorm, SwiGLU MLP), RMSNorm, output.

One layer, pre-norm with residuals::

    h = x + attention(rms_norm(x))            (slimrag.llm.model.attention)
    y = h + down(silu(gate(n)) * up(n)),  n = rms_norm(h)

``gate`` and ``up`` are fused into one ``[2 * intermediate, hidden]`` matrix at load, so the MLP
is two matrix products. The weights are plain tensors in dataclasses, not ``nn.Module``\\ s: a
forward is a loop over layers calling functions, with no hooks, no module dispatch and no
keyword plumbing, which is most of the per-token overhead on a small model.

A forward (:meth:`Decoder.forward`) takes the new tokens of one sequence with their positions,
writes their K/V into the sequence's :class:`KVCache`, and returns logits for the positions
asked for (``logits="last"``: only the last, which is all generation needs; the vocabulary
projection of every prompt position would cost more than the attention). ``stop_after=L`` ends
the forward after layer ``L`` (blend's deviation scoring needs the first layers' K/V only).
Weights are read-only after load, so any number of threads may run forwards on their own caches.

Weights. A projection is a float tensor or a :class:`~slimrag.llm.model.qlinear.QuantLinear`
(a GGUF file's Q4_0/Q4_1/Q8_0 blocks, kept quantized; :mod:`slimrag.llm.model.qlinear`). A
quantized model computes decode's products on the blocks; ``dense_rows`` (default None) sends the
products of forwards of at least that many tokens (long prefills) through a float32 copy of the
weights, dequantized on first use and then held (4 bytes per weight on top of the blocks). The
choice depends only on the forward's token count, never on the cache or the batch, so cached and
uncached runs of the same segments compute the same way. A fully quantized model runs its
one-token forwards at the cache's length (decode) as one ONNX Runtime graph
(:mod:`slimrag.llm.model.step`), saved once per model under ``$SLIMRAG_HOME/steps`` and loaded beside
the first prefill or at the first one-token forward; every other forward runs here. Where the
prefill multiplies in bfloat16 (:mod:`slimrag.llm.model.bf16`, chosen by
:func:`~slimrag.llm.model.prefill.prefill_mode`), the model holds each layer's bfloat16 copy
(:meth:`Decoder.bf16_weights`) and every forward of several tokens, or with a mask, multiplies
through it, so a segment forwarded alone computes as the one-pass prefill does.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from slimrag.llm.model import bf16
from slimrag.llm.model.attention import AttentionWeights, attend
from slimrag.llm.model.cache import KVCache
from slimrag.llm.model.config import ModelConfig
from slimrag.llm.model.embedding import BlockTable, DenseTable, Table
from slimrag.llm.model.norm import rms_norm
from slimrag.llm.model.qlinear import QuantLinear, QuantPart, linear, stacked
from slimrag.llm.model.rope import Rope
from slimrag.llm.model.saved_step import SavedSteps
from slimrag.llm.model.step import StepGraph
from slimrag.llm.model.step import supports as step_supported


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer: its two norms, attention and the fused SwiGLU MLP."""

    input_norm: torch.Tensor
    attn: AttentionWeights
    post_norm: torch.Tensor
    gate_up: torch.Tensor | QuantLinear
    down: torch.Tensor | QuantLinear


def _products(layer: LayerWeights) -> tuple[torch.Tensor | QuantLinear, ...]:
    """A layer's four products, in the order of its bfloat16 copy: qkv, o, gate_up, down."""
    return layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down


def _bf16_layer(layer: LayerWeights, like: tuple[bf16.Copy, ...] | None = None) -> tuple[bf16.Copy, ...]:
    """``layer``'s four bfloat16 copies, allowed the call sizes of ``like``'s (layer 0's, checked)."""
    return tuple(bf16.copy(w, like[i] if like else None) for i, w in enumerate(_products(layer)))


def _mul(x: torch.Tensor, w: torch.Tensor | QuantLinear, w16: bf16.Copy | None,
         bias: torch.Tensor | None = None, dense: int | None = None) -> torch.Tensor:
    """``x @ w.T (+ bias)``: through the bfloat16 copy ``w16`` where one is held (bfloat16 out,
    float32 with a bias), else the weight's own product."""
    return bf16.linear(x, w16, bias) if w16 is not None else linear(x, w, bias, dense_rows=dense)


class Decoder:
    """A loaded model (see the module header). Build it with
    :func:`slimrag.llm.model.loader.load_checkpoint`, or from a name -> tensor dict in the HF
    naming with :meth:`from_state_dict`."""

    def __init__(self, config: ModelConfig, embed: torch.Tensor | BlockTable, layers: list[LayerWeights],
                 norm: torch.Tensor, lm_head: torch.Tensor | QuantLinear | None, *,
                 dense_rows: int | None = None, saved_steps: SavedSteps | None = None) -> None:
        if len(layers) != config.num_layers:
            raise ValueError(f"config says {config.num_layers} layers, got weights for {len(layers)}")
        if dense_rows is not None and dense_rows < 1:
            raise ValueError(f"dense_rows must be >= 1 or None, got {dense_rows}")
        if lm_head is None and not isinstance(embed, torch.Tensor):
            raise ValueError("a tied head needs the embedding table as a tensor or as a QuantLinear head")
        self.config, self.layers, self.norm = config, layers, norm
        #: The token lookup (:mod:`slimrag.llm.model.embedding`): the float table, or the file's blocks.
        self.embed: Table = DenseTable(embed) if isinstance(embed, torch.Tensor) else embed
        self.lm_head = embed if lm_head is None else lm_head
        self.device, self.dtype = norm.device, norm.dtype
        self.dense_rows = dense_rows
        self.rope = Rope(config.rope, config.head_dim, self.device)
        self._step: StepGraph | None = None
        self._step_lock = threading.Lock()
        self._warming: threading.Thread | None = None
        self._warm_lock = threading.Lock()
        self.fused_step = step_supported(self)  # a quantized model's one-token forwards run fused
        self.saved_steps = saved_steps if saved_steps is not None else SavedSteps()
        self._bf16: list[tuple[bf16.Copy, ...]] | None = None
        self._bf16_lock = threading.Lock()
        #: How prompts are prefilled, where the loader settled it (``prefill_mode``'s answer): the
        #: runner then takes it as it is, so one decision rules every forward of the model.
        self.settled_mode: str | None = None

    def bf16_bytes(self) -> int:
        """Bytes :meth:`bf16_weights` holds (or would): 2 per weight of every layer's four products."""
        return sum(2 * w.shape[0] * w.shape[1] for layer in self.layers for w in _products(layer))

    def bf16_weights(self, layers: int | None = None, *,
                     first: tuple[bf16.Copy, ...] | None = None) -> list[tuple[bf16.Copy, ...]]:
        """Each layer's ``(qkv, o, gate_up, down)`` as bfloat16 (a quantized weight dequantized one
        tensor at a time, never held in float32), built on the first call and then held: the
        products of a bfloat16 prefill (:mod:`slimrag.llm.model.prefill`), :meth:`bf16_bytes` on
        top of the model. Once they are held, every :meth:`forward` of two or more tokens multiplies
        through them too (blend's and one-forward-per-segment prefills compute as the one-pass
        prefill does). ``layers``: the first ``layers`` only, built afresh and not held (the
        prefill's exactness check needs layer 0's). ``first``: layer 0's copy already built that
        way (its call sizes settled: :func:`slimrag.llm.model.bf16.sizes`), taken as is where the
        copy is not held yet; every other layer's products are allowed its products' call sizes."""
        if layers is not None:
            return [_bf16_layer(layer) for layer in self.layers[:layers]]
        if first is not None and [t.shape for t in first] != [w.shape for w in _products(self.layers[0])]:
            raise ValueError("first must be layer 0's bfloat16 copy (bf16_weights(layers=1)[0])")
        with self._bf16_lock:
            if self._bf16 is None:
                built = [first] if first is not None else []
                self._bf16 = built + [_bf16_layer(layer, first) for layer in self.layers[len(built):]]
            return self._bf16

    def warm_step(self, *, wait: bool = True) -> None:
        """Make the fused one-token step ready (:mod:`slimrag.llm.model.step`: loaded from
        :attr:`saved_steps` when saved there, else built and saved: 1-2 s for SmolLM2-135M);
        nothing for a float model. ``wait=False`` does it in a background thread and returns at
        once, where a core is free of torch's threads (a prefill starts it so: the first decoded
        token then waits only for what is left; without a free core it would slow the prefill, and
        with it the first token, down)."""
        if not self.fused_step or self._step is not None:
            return
        if not wait:
            if (os.cpu_count() or 1) <= torch.get_num_threads():
                return  # no core free of torch's threads: loading beside a prefill would slow it down
            with self._warm_lock:  # not _step_lock: a build in progress holds that one
                if self._warming is None:
                    self._warming = threading.Thread(target=self.warm_step, name="slimrag-warm-step", daemon=True)
                    self._warming.start()
            return
        with self._step_lock:
            if self._step is None:
                self._step = StepGraph(self, saved=self.saved_steps)

    @classmethod
    def from_state_dict(cls, config: ModelConfig, tensors: dict[str, torch.Tensor | QuantPart | BlockTable], *,
                        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                        dense_rows: int | None = None) -> Decoder:
        """From tensors named as in HF checkpoints (``model.layers.0.self_attn.q_proj.weight``, ...);
        missing or extra names are a ValueError. ``tensors`` may be consumed (popped). A projection
        given as :class:`QuantPart`\\ s (all of q/k/v, of gate/up) stays quantized on a float32 CPU
        model (:func:`slimrag.llm.model.qlinear.stacked`); any other weight is dequantized."""
        def raw(name: str) -> torch.Tensor | QuantPart:
            t = tensors.pop(name, None)
            if t is None:
                raise ValueError(f"checkpoint lacks {name}")
            return t

        def take(name: str) -> torch.Tensor:
            out = stacked([raw(name)], dtype=dtype, device=device, quantized=False)
            assert isinstance(out, torch.Tensor)
            return out

        def proj(*names: str) -> torch.Tensor | QuantLinear:
            return stacked([raw(n) for n in names], dtype=dtype, device=device)

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            qkv = proj(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
            bias = None
            if config.qkv_bias:
                bias = torch.cat([take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")])
            q_norm = take(a + "q_norm.weight") if config.qk_norm else None
            k_norm = take(a + "k_norm.weight") if config.qk_norm else None
            attn = AttentionWeights(qkv, bias, q_norm, k_norm, proj(a + "o_proj.weight"))
            gate_up = proj(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
            layers.append(LayerWeights(take(p + "input_layernorm.weight"), attn,
                                       take(p + "post_attention_layernorm.weight"), gate_up,
                                       proj(p + "mlp.down_proj.weight")))
        blocks = tensors.get("model.embed_tokens.weight")
        embed = tensors.pop("model.embed_tokens.weight") if isinstance(blocks, BlockTable) else take("model.embed_tokens.weight")
        norm = take("model.norm.weight")
        head: torch.Tensor | QuantLinear | None = proj("lm_head.weight") if "lm_head.weight" in tensors else None
        if (isinstance(head, torch.Tensor) and isinstance(embed, torch.Tensor) and config.tie_embeddings
                and torch.equal(head, embed)):
            head = None
        if head is None and not config.tie_embeddings:
            raise ValueError("checkpoint lacks lm_head.weight and the config does not tie embeddings")
        tensors.pop("model.rotary_emb.inv_freq", None)
        extra = [n for n in tensors if not n.endswith("rotary_emb.inv_freq")]
        if extra:
            raise ValueError(f"checkpoint has tensors the engine does not use: {extra[:5]}")
        return cls(config, embed, layers, norm, head, dense_rows=dense_rows)

    def new_cache(self) -> KVCache:
        """An empty cache for one sequence, on this model's device and dtype."""
        c = self.config
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, dtype=self.dtype, device=self.device)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                mask: torch.Tensor | None = None, logits: Literal["last", "all"] = "last",
                stop_after: int | None = None) -> torch.Tensor | None:
        """Run ``ids`` (long, ``[n]``) at ``positions`` (``[n]``) on top of ``cache``, which gains
        their K/V. Returns float32 logits, ``[vocab]`` for ``"last"`` or ``[n, vocab]`` for
        ``"all"``; None when ``stop_after`` ended the forward early. ``mask``: ``[n, length + n]``
        booleans replacing the causal rule (keys in cache order)."""
        c = self.config
        if (self.fused_step and ids.shape[0] == 1 and mask is None and logits == "last" and stop_after is None
                and int(positions[0]) == cache.length):
            self.warm_step()
            assert self._step is not None
            return self._step(int(ids[0]), cache)
        if ids.shape[0] > 1:
            self.warm_step(wait=False)  # a prefill: decode comes next
        dense = self.dense_rows
        copies = self._bf16 if ids.shape[0] > 1 or mask is not None else None  # held: as a prefill multiplies
        att_dtype = torch.bfloat16 if copies is not None else None
        x = self.embed.rows(ids)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            w16 = copies[i] if copies is not None else (None,) * 4
            h = rms_norm(x, layer.input_norm, c.rms_eps)
            qkv = _mul(h, layer.attn.qkv, w16[0], layer.attn.qkv_bias, dense).float()
            att = attend(qkv, layer.attn, i, cache, self.rope, cos, sin, mask, heads=c.num_heads,
                         kv_heads=c.num_kv_heads, head_dim=c.head_dim, eps=c.rms_eps, compute_dtype=att_dtype)
            x = x + _mul(att, layer.attn.o, w16[1], dense=dense)
            h = rms_norm(x, layer.post_norm, c.rms_eps)
            gate, up = _mul(h, layer.gate_up, w16[2], dense=dense).chunk(2, dim=-1)
            x = x + _mul(F.silu(gate) * up, layer.down, w16[3], dense=dense)
            if stop_after is not None and i >= stop_after:
                cache.advance(ids.shape[0])
                return None
        cache.advance(ids.shape[0])
        if logits == "last":
            x = x[-1:]
        out = linear(rms_norm(x, self.norm, c.rms_eps), self.lm_head, dense_rows=dense).float()
        return out[0] if logits == "last" else out

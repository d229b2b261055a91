"""The engine's key/value cache: per layer one K and one V buffer, ``[1, kv_heads, capacity, head_dim]``.

The layout is the one the knowledge tree stores (:class:`slimrag.llm.kv.payload.SegmentKV`): a
segment's payload is a slice along the sequence axis, so seeding a cache from the tree is one
copy per layer and cutting a prompt into segments is one slice per layer. Keys are stored
rotated (RoPE applied at their position), as the model attends to them.

Capacity grows in blocks of :data:`BLOCK` (256) positions and is a function of the length only
(``ceil(length / BLOCK) * BLOCK``), never of how the cache got there: a cache seeded with a
cached prefix and one that computed the prefix itself have the same buffers at the same length,
so attention reads them through the same strides and gives bitwise the same numbers (the
exactness of warm generation rests on that). Growing copies the buffer, once per 256 tokens;
appending one decode token is a slice write, not a concatenation of the whole cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Positions per allocation block (see the module header).
BLOCK = 256


class KVCache:
    """The K/V of one sequence for every layer; positions ``0 .. length - 1`` in order."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype,
                 device: str | torch.device) -> None:
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.length = 0
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._reserve(0)

    @classmethod
    def seeded(cls, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], *, dtype: torch.dtype,
               device: str | torch.device) -> KVCache:
        """A cache holding ``layers`` (per layer K and V, ``[1, kv_heads, n, head_dim]``), copied."""
        k0 = layers[0][0]
        cache = cls(len(layers), int(k0.shape[1]), int(k0.shape[-1]), dtype=dtype, device=device)
        n = int(k0.shape[-2])
        cache._reserve(n)
        for i, (k, v) in enumerate(layers):
            cache._k[i][:, :, :n] = k
            cache._v[i][:, :, :n] = v
        cache.length = n
        return cache

    def _reserve(self, n: int) -> None:
        cap = max(BLOCK, -(-n // BLOCK) * BLOCK)
        if self._k and self._k[0].shape[2] >= cap:
            return
        shape = (1, self.kv_heads, cap, self.head_dim)
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        for i in range(len(self._k)):
            new_k[i][:, :, : self.length] = self._k[i][:, :, : self.length]
            new_v[i][:, :, : self.length] = self._v[i][:, :, : self.length]
        self._k, self._v = new_k, new_v

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, at: int | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the K/V of the ``n`` new positions of ``layer`` at position ``at`` (default: after
        the cached ones) and return the layer's K/V over positions ``0 .. at + n - 1`` (views).
        :meth:`advance` commits the new positions once every layer has written. ``at`` past the
        length is for a forward over several segments at once (each segment's attention sees the
        segments before it, written by the same layer just before)."""
        n = int(k.shape[-2])
        start = self.length if at is None else at
        end = start + n
        if layer == 0 or end > self._k[layer].shape[2]:
            self._reserve(end)
        self._k[layer][:, :, start:end] = k
        self._v[layer][:, :, start:end] = v
        return self._k[layer][:, :, :end], self._v[layer][:, :, :end]

    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the whole K and V buffers ``[1, kv_heads, capacity, head_dim]`` (positions
        from ``length`` on are not part of the sequence): what the fused decode step
        (:mod:`slimrag.llm.model.step`) reads and writes in place (then :meth:`advance`)."""
        return list(zip(self._k, self._v, strict=True))

    def reserve(self, n: int) -> None:
        """Make room for ``n`` positions now (a forward that writes several segments)."""
        self._reserve(n)

    def advance(self, n: int) -> None:
        """Commit ``n`` positions written by :meth:`write` on every layer."""
        self.length += n

    def truncate(self, n: int) -> None:
        """Forget every position from ``n`` on (a forward stopped part-way leaves later layers unwritten)."""
        self.length = min(self.length, n)

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) over the ``length`` cached positions (views into the buffers)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self._k, self._v, strict=True)]

"""The token embedding lookup: rows of a float table, or rows dequantized from the model file's blocks.

Why blocks: the float32 table was the one weight the engine still built whole when it loaded a
quantized GGUF (4 bytes per weight of the vocabulary's rows, dequantized at load: docs/benchmarks.md,
"Load without the float32 embedding table"), for a lookup that reads a handful of rows per forward. The dequantizers
work block by block, so a row dequantized alone is bitwise the row of the whole table: prefill,
batched decode and the fused step see the same numbers as before (``tests/test_embedding_rows.py``).

Both kinds answer :meth:`rows` (``[n, width]`` float tensor for ``[n]`` long ids) and
:meth:`row` (one token's float32 numpy row, for the fused step's input buffer). A tied model's
output head is not this: it multiplies on the same blocks through
:class:`~slimrag.llm.model.qlinear.QuantLinear`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from slimrag.llm.model.gguf import dequantize_rows


class DenseTable:
    """A float table held whole (an HF folder's weights, a model loaded unquantized)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.width = int(table.shape[1])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids``, in the table's dtype and device."""
        return F.embedding(ids, self.table)

    def row(self, token: int) -> np.ndarray:
        """One token's row as float32 numpy (a view where the table is float32 on the CPU)."""
        return self.table[token].detach().float().numpy()


class BlockTable:
    """A float32 CPU model's table left in the file's blocks: ``raw`` is ``uint8 [vocab, row_bytes]``
    (a view of the map) of ``ggml_type``, rows of ``width`` weights, dequantized by
    :func:`~slimrag.llm.model.gguf.dequantize_rows`. Ids outside ``[0, vocab)`` are an IndexError,
    as in ``F.embedding``."""

    def __init__(self, raw: np.ndarray, ggml_type: int, width: int) -> None:
        self.raw, self.ggml_type, self.width = raw, ggml_type, width

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids`` (any shape of long ids; the result adds a last dim of ``width``)."""
        flat = ids.reshape(-1).cpu().numpy()
        if flat.size == 0:
            return torch.zeros(*ids.shape, self.width)
        self._check(int(flat.min()), int(flat.max()))
        out = torch.from_numpy(dequantize_rows(np.ascontiguousarray(self.raw[flat]), self.ggml_type))
        return out.reshape(*ids.shape, self.width)

    def row(self, token: int) -> np.ndarray:
        """One token's row as float32 numpy."""
        self._check(token, token)
        return dequantize_rows(np.ascontiguousarray(self.raw[token:token + 1]), self.ggml_type).reshape(-1)

    def _check(self, low: int, high: int) -> None:
        if low < 0 or high >= self.raw.shape[0]:
            raise IndexError(f"token id {low if low < 0 else high} outside the vocabulary of {self.raw.shape[0]}")


#: What a :class:`~slimrag.llm.model.model.Decoder` looks tokens up in.
Table = DenseTable | BlockTable

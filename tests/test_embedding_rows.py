"""The token lookup reads the embedded file's blocks (`slimrag.llm.model.embedding`): every row it
gives is bitwise the row of the whole table dequantized, for prompts, batches and the fused step's
one row, and a quantized load holds no float table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slimrag.llm import weights
from slimrag.llm.model.embedding import BlockTable, DenseTable
from slimrag.llm.model.gguf import GGUFFile


def test_block_rows_equal_the_whole_table(smollm: weights.LoadedModel) -> None:
    table = smollm.model.embed
    assert isinstance(table, BlockTable)  # a quantized load keeps the table in its blocks
    file = GGUFFile(smollm.path)
    whole = torch.from_numpy(file.dequantize(file.tensors["token_embd.weight"]))
    assert table.width == whole.shape[1]
    ids = torch.tensor([0, 1, 5, 17, 49151, 5, 2048], dtype=torch.long)
    assert torch.equal(table.rows(ids), whole[ids])
    assert torch.equal(table.rows(ids.reshape(1, -1)), whole[ids].reshape(1, -1, whole.shape[1]))
    for token in (0, 333, 49151):
        assert np.array_equal(table.row(token), whole[token].numpy())


def test_dense_table_is_the_tensor_lookup() -> None:
    t = torch.randn(10, 4)
    table = DenseTable(t)
    ids = torch.tensor([3, 0, 3])
    assert torch.equal(table.rows(ids), t[ids]) and np.array_equal(table.row(9), t[9].numpy())


def test_unquantized_load_keeps_a_float_table(smollm: weights.LoadedModel) -> None:
    dense = weights.load_model(smollm.path, device="cpu", quantized=False)
    assert isinstance(dense.model.embed, DenseTable)
    ids = torch.tensor([1, 2, 300])
    assert torch.equal(dense.model.embed.rows(ids), smollm.model.embed.rows(ids))


def test_block_rows_take_no_ids_and_refuse_ids_outside_the_vocabulary(smollm: weights.LoadedModel) -> None:
    table = smollm.model.embed
    assert table.rows(torch.zeros(1, 0, dtype=torch.long)).shape == (1, 0, table.width)
    vocab = table.raw.shape[0]
    for bad in (-1, vocab):
        with pytest.raises(IndexError):
            table.rows(torch.tensor([3, bad]))
        with pytest.raises(IndexError):
            table.row(bad)

"""Where knowledge-tree payloads live: how a :class:`SegmentKV` moves between tiers.

The tree (:mod:`slimrag.llm.kv.tree`) decides *which* node goes where; a storage does the moving.
:class:`TorchStorage` holds real tensors (device tier on the model's device, host tier on the
CPU, disk tier as one ``torch.save`` file per node in a scratch folder removed on close or at
exit); :class:`SimulatedStorage` keeps sizes only, for unit tests and for mirroring a remote
backend's cache. A node is written to disk once; the file outlives later promotions, so a second
demotion is free.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Protocol

from slimrag.llm.kv.config import DEVICE, CacheConfig
from slimrag.llm.kv.payload import SegmentKV


class KVStorage(Protocol):
    """Moves payloads between tiers. ``move`` places a payload in a memory tier; ``write`` (of
    the node at a key path, root key first) / ``read`` / ``delete`` manage the disk tier's files
    by an opaque handle. ``persistent``: the files outlive the process
    (:class:`slimrag.llm.kv.persist.PersistentStorage`), so the tree writes every node through
    to disk and keeps the files when it closes; ``read`` may then fail with ``OSError`` or
    ``ValueError`` (a file gone or damaged), which the tree takes for a miss."""

    persistent: bool

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV: ...
    def write(self, kv: SegmentKV, path: tuple[str, ...]) -> str: ...
    def read(self, handle: str) -> SegmentKV: ...
    def delete(self, handle: str) -> None: ...
    def close(self) -> None: ...


class SimulatedStorage:
    """No devices, no files: payloads stay as they are and "files" live in a dict."""

    persistent = False

    def __init__(self) -> None:
        self.files: dict[str, SegmentKV] = {}

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV:
        return kv

    def write(self, kv: SegmentKV, path: tuple[str, ...]) -> str:
        name = "/".join(path)
        self.files[name] = kv
        return name

    def read(self, handle: str) -> SegmentKV:
        return self.files[handle]

    def delete(self, handle: str) -> None:
        del self.files[handle]

    def close(self) -> None:
        self.files.clear()


class TorchStorage:
    """Real tensors: the device tier on ``config.device``, the host tier on the CPU, the disk tier
    as one ``torch.save`` file per node in a scratch folder removed on :meth:`close` (or at exit)."""

    persistent = False

    def __init__(self, config: CacheConfig) -> None:
        self.device = config.device
        self.folder: Path | None = None
        self._disk_dir = config.disk_dir
        self._names = itertools.count()

    def _scratch(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="slimrag-kv-", dir=self._disk_dir))
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        return self.folder

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV:
        return kv.to(self.device if tier == DEVICE else "cpu")

    def write(self, kv: SegmentKV, path: tuple[str, ...]) -> str:
        import torch

        file = self._scratch() / f"{next(self._names)}.pt"
        torch.save([t.to("cpu") for pair in kv.layers for t in pair], file)
        return str(file)

    def read(self, handle: str) -> SegmentKV:
        import torch

        flat = torch.load(handle, map_location="cpu", weights_only=True)
        return SegmentKV.from_layers(list(zip(flat[0::2], flat[1::2], strict=True)))

    def delete(self, handle: str) -> None:
        Path(handle).unlink(missing_ok=True)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

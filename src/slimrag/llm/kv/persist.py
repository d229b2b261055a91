"""The knowledge tree's disk tier kept across processes: one file per segment in ``$SLIMRAG_HOME/kv``.

Why. A one-shot ``slimrag ask`` is a new process each time; with a scratch disk tier every one
prefilled its system segment and passages from nothing. A persistent tier lets the next process
read them back (a few milliseconds a segment) instead of computing them (seconds on a CPU).

Keys. A file holds one tree node: the K/V of one segment computed after the path above it. It is
named by a digest of the *namespace* and the node's key path (root key, then passage keys). The
namespace is what the numbers depend on besides the tokens, given by the engine
(``slimrag.llm.engine.runner.ModelRunner.namespace``): the model file's fingerprint (:func:`file_fingerprint`: size
plus a hash of its first and last MiB, computed in about a millisecond), dtype, device, how the
products run, the library versions and thread counts. A file of another namespace is never read
as ours (a *foreign* file is a miss), so a cached run stays bitwise the uncached one.

Format: ``MAGIC``, a little-endian u32 header length, a JSON header (namespace, path, tokens,
dtype, tensor shapes, payload bytes, CRC-32 of the payload), then the payload: each layer's K
then V, raw, C order. A short, truncated or damaged file, one whose checksum or header does not
match, or one that vanished (another process evicted it) is a miss: reading raises
:class:`DamagedSegment` or ``OSError``, the tree drops the node and deletes the file, and the
request prefills the segment. Never a crash.

Writes: a temporary file in the same folder, then ``os.replace`` (atomic on POSIX), so no reader
ever sees half a file. No fsync: this is a cache, and a file torn by a power cut fails its
checksum. A persistent tier writes every node when it is inserted (write-through, after the
request's first token), not only on demotion, so a process that exits before its memory tiers
fill has kept its segments.

Restore: opening the tier reads every file's header (a few hundred bytes each); the files of our
namespace become disk-only nodes of the tree, parents before children (:meth:`KVTree` does it
through ``Tiers.adopt``). A file whose parent is absent can never be reached and is deleted.
Foreign files count against the budget and go first, oldest first, when it is short; after that
the tree's eviction policy keeps the tier within ``CacheConfig.disk_bytes``.

Several processes may share the folder: each knows the files present when it opened plus its
own; a file another process deleted meanwhile is a miss when read. Each process enforces the
budget on what it knows, so the folder may exceed it until the next process opens it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from slimrag.files import slimrag_home
from slimrag.llm.kv.config import DEVICE, CacheConfig
from slimrag.llm.kv.payload import SegmentKV

MAGIC = b"SLIMRAG-KV1\n"
SUFFIX = ".kv"
#: Bytes read from each end of a model file for its fingerprint.
FINGERPRINT_BYTES = 1 << 20
#: Temporary files older than this (a writer killed before its rename) are deleted on open.
STALE_TMP_S = 3600.0


class DamagedSegment(ValueError):
    """A segment file that cannot be read as ours (truncated, corrupt, foreign or mislabelled)."""


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap identity of a model file or folder: size and a SHA-256 of the first and last MiB
    of each file (a folder: of its files, by name). Another file with the same bytes there is
    taken for the same model; a changed file gets another fingerprint."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(root) if root.is_dir() else f.name}:{size}\n".encode())
        with f.open("rb") as fh:
            h.update(fh.read(FINGERPRINT_BYTES))
            if size > FINGERPRINT_BYTES:
                fh.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
                h.update(fh.read(FINGERPRINT_BYTES))
    return h.hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StoredSegment:
    """A segment file found when the tier opened: its key path (root key first), token count,
    payload bytes, file and modification time."""

    path: tuple[str, ...]
    tokens: int
    nbytes: int
    handle: str
    mtime: float


class PersistentStorage:
    """Real tensors in memory tiers (as :class:`~slimrag.llm.kv.storage.TorchStorage`) and a disk
    tier of segment files in ``config.disk_dir`` kept across processes, under ``namespace``
    (see the module header)."""

    persistent = True

    def __init__(self, config: CacheConfig, namespace: str) -> None:
        if not namespace:
            raise ValueError("a persistent KV tier needs the engine's namespace (model and compute mode)")
        self.device = config.device
        self.namespace = namespace
        self.folder = Path(config.disk_dir) if config.disk_dir is not None else slimrag_home() / "kv"
        self.folder.mkdir(parents=True, exist_ok=True)

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV:
        return kv.to(self.device if tier == DEVICE else "cpu")

    def name(self, path: tuple[str, ...]) -> Path:
        """The file of the node at ``path`` under this namespace."""
        key = "\x00".join((self.namespace, *path)).encode()
        return self.folder / (hashlib.blake2b(key, digest_size=16).hexdigest() + SUFFIX)

    def write(self, kv: SegmentKV, path: tuple[str, ...]) -> str:
        target = self.name(path)
        import torch

        arrays = [t.detach().to("cpu").contiguous() for pair in kv.layers for t in pair]
        views = [a.view(-1).view(torch.uint8).numpy() for a in arrays]
        crc = 0
        for v in views:
            crc = zlib.crc32(v, crc)
        header = json.dumps({"namespace": self.namespace, "path": list(path), "tokens": kv.tokens,
                             "dtype": str(arrays[0].dtype).removeprefix("torch."),
                             "shapes": [list(a.shape) for a in arrays],
                             "bytes": sum(v.nbytes for v in views), "crc": crc}).encode()
        tmp = target.with_name(f".{target.stem}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            with tmp.open("wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                for v in views:
                    f.write(v.data)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return str(target)

    def read(self, handle: str) -> SegmentKV:
        import torch

        with open(handle, "rb") as f:
            head = _header(f, handle)
            if head["namespace"] != self.namespace:
                raise DamagedSegment(f"{handle} belongs to another model or compute mode")
            buf = bytearray(head["bytes"])
            if f.readinto(buf) != len(buf) or f.read(1):
                raise DamagedSegment(f"{handle} is truncated or has trailing bytes")
        if zlib.crc32(buf) != head["crc"]:
            raise DamagedSegment(f"{handle} fails its checksum")
        try:
            dtype = getattr(torch, head["dtype"])
            tensors, offset = [], 0
            for shape in head["shapes"]:
                count = 1
                for d in shape:
                    count *= int(d)
                t = torch.frombuffer(buf, dtype=dtype, count=count, offset=offset).view(*shape)
                tensors.append(t)
                offset += count * t.element_size()
        except (AttributeError, TypeError, ValueError, RuntimeError) as e:
            raise DamagedSegment(f"{handle}: {e}") from e
        if offset != len(buf) or len(tensors) % 2 or not tensors or int(tensors[0].shape[-2]) != head["tokens"]:
            raise DamagedSegment(f"{handle}: its shapes do not match its size or token count")
        return SegmentKV.from_layers(list(zip(tensors[0::2], tensors[1::2], strict=True)))

    def delete(self, handle: str) -> None:
        Path(handle).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to free: the files are the point."""

    def scan(self, budget: int) -> list[StoredSegment]:
        """The readable segment files of this namespace; damaged files and stale temporary files
        are deleted, and foreign files too, oldest first, while all files together exceed
        ``budget``."""
        now = time.time()
        ours: list[StoredSegment] = []
        foreign: list[tuple[float, int, Path]] = []
        for p in self.folder.iterdir():
            try:
                st = p.stat()
                if p.name.endswith(".tmp"):
                    if now - st.st_mtime > STALE_TMP_S:
                        p.unlink(missing_ok=True)
                    continue
                if p.suffix != SUFFIX:
                    continue
                with p.open("rb") as f:
                    head = _header(f, str(p))
                    if f.tell() + head["bytes"] != st.st_size:
                        raise DamagedSegment(f"{p} holds {st.st_size} bytes, its header says otherwise")
                size = st.st_size
                if head["namespace"] != self.namespace:
                    foreign.append((st.st_mtime, size, p))
                    continue
                path = tuple(str(k) for k in head["path"])
                if not path or p != self.name(path):
                    raise DamagedSegment(f"{p} is not named for its path")
                ours.append(StoredSegment(path, int(head["tokens"]), int(head["bytes"]), str(p), st.st_mtime))
            except FileNotFoundError:
                continue  # another process removed it meanwhile
            except (DamagedSegment, OSError) as e:
                _log_miss(p, e)
                p.unlink(missing_ok=True)
        total = sum(s.nbytes for s in ours) + sum(size for _, size, _ in foreign)
        for _, size, p in sorted(foreign):
            if total <= budget:
                break
            p.unlink(missing_ok=True)
            total -= size
        return ours


def _header(f: BinaryIO, name: str) -> dict[str, Any]:
    """The JSON header of an open segment file, checked for the fields a reader needs."""
    magic = f.read(len(MAGIC) + 4)
    if len(magic) != len(MAGIC) + 4 or not magic.startswith(MAGIC):
        raise DamagedSegment(f"{name} is not a slimrag KV segment file")
    (n,) = struct.unpack("<I", magic[len(MAGIC):])
    if n > 1 << 20:
        raise DamagedSegment(f"{name} has an implausible header length {n}")
    try:
        head = json.loads(f.read(n))
    except (UnicodeDecodeError, ValueError) as e:
        raise DamagedSegment(f"{name} has an unreadable header: {e}") from e
    need = {"namespace": str, "path": list, "tokens": int, "dtype": str, "shapes": list, "bytes": int, "crc": int}
    if not isinstance(head, dict) or any(not isinstance(head.get(k), t) for k, t in need.items()):
        raise DamagedSegment(f"{name} has an incomplete header")
    return head


def _log_miss(path: Path, error: BaseException) -> None:
    logging.getLogger(__name__).info("dropping KV segment file %s: %s", path, error)

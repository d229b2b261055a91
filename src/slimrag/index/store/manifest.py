"""`Manifest`: the typed record of ``manifest.json``, and the one module that reads, checks,
migrates and writes it.

The manifest names everything an index folder holds that is not in the catalog: the generation in
use and its kind, the delta parts written since, the build configuration and the embedder, and the
counters that only grow (``next_chunk_id``, ``next_part``; see `slimrag.index.store.layout` for why).
Every switch of an index's state is "write a new manifest": `write` replaces the file by
write-temp + fsync + rename, so a reader sees the old manifest or the new one, never a mix.

Migration on read: manifests of older versions still open. A missing ``gen_kind`` (written before
slim generations existed) means "flat"; a missing ``slim`` block means `SlimConfig()`; the slim
query knobs that moved to `SearchConfig` are dropped by `SlimConfig.from_dict` (unknown slim keys
are refused with TypeError, not dropped); missing counters start at 0 (`layout.next_part` skips
past files that exist). The file is rewritten in the current form at the next switch, never on a
plain open, so opening stays read-only.

`Manifest.__getitem__` (and ``get``) give the JSON form of a field (``manifest["delta_parts"]`` is
a list): scripts written when the manifest was a dict keep working; code in this package reads
the typed attributes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from slimrag import files
from slimrag.config import IndexConfig
from slimrag.errors import IndexFormatError
from slimrag.index.store.slim.config import SlimConfig

#: the on-disk format this slimrag reads and writes (a folder of another format is refused)
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` records (module header). Frozen: a change is a new `Manifest`
    (`changed`) written by `write`; the open index swaps its reference after the write."""

    storage: str
    embedder: dict[str, Any]
    config: IndexConfig
    slim: SlimConfig = field(default_factory=SlimConfig)
    #: the kind of the generation in use (`slimrag.index.store.vectors.KINDS` keys: "flat" or "slim")
    gen_kind: str = "flat"
    generation: int = 0
    delta_parts: tuple[str, ...] = ()
    next_chunk_id: int = 0
    next_part: int = 0
    #: the folder the index was built from (absolute), or None for an index of files or texts
    source_root: str | None = None
    created: float = 0.0
    updated: float = 0.0
    format: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.format != FORMAT_VERSION:
            raise IndexFormatError(f"manifest format {self.format!r}; this slimrag reads format {FORMAT_VERSION}. "
                                   "Rebuild the index.")
        if self.generation < 0 or self.next_chunk_id < 0 or self.next_part < 0:
            raise IndexFormatError(f"manifest counters must be >= 0, got generation {self.generation}, "
                                   f"next_chunk_id {self.next_chunk_id}, next_part {self.next_part}; rebuild the index")
        if not isinstance(self.embedder, dict) or "id" not in self.embedder or "dim" not in self.embedder:
            raise IndexFormatError(f"manifest embedder record {self.embedder!r} lacks 'id' or 'dim'; rebuild the index")

    @property
    def dim(self) -> int:
        """The embedding dimension of every vector of this index."""
        return int(self.embedder["dim"])

    @property
    def source_path(self) -> Path | None:
        """`source_root` as a path, or None."""
        return Path(self.source_root) if self.source_root else None

    def changed(self, **changes: Any) -> Manifest:
        """A copy with ``changes`` and ``updated`` set to now (``delta_parts`` may be any sequence)."""
        if "delta_parts" in changes:
            changes["delta_parts"] = tuple(changes["delta_parts"])
        return replace(self, **changes, updated=time.time())

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``manifest.json``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["config"] = asdict(self.config)
        out["slim"] = self.slim.to_dict()
        out["delta_parts"] = list(self.delta_parts)
        return out

    def __getitem__(self, key: str) -> Any:
        """The JSON form of field ``key`` (module header); KeyError for a name that is no field."""
        if key not in _FIELDS:
            raise KeyError(key)
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]``, or ``default`` for a name that is no field (the dict manifest's ``get``)."""
        return self[key] if key in _FIELDS else default

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Parse and migrate (module header) a manifest read from JSON. Raises `IndexFormatError`
        for a wrong format or missing fields, TypeError/ValueError for bad config values."""
        if data.get("format") != FORMAT_VERSION:
            raise IndexFormatError(f"format {data.get('format')!r}; this slimrag reads format {FORMAT_VERSION}. "
                                   "Rebuild it.")
        missing = [k for k in ("storage", "embedder", "config") if k not in data]
        if missing:
            raise IndexFormatError(f"the manifest lacks {', '.join(missing)}; rebuild the index")
        known = {k: v for k, v in data.items() if k in _FIELDS}
        known["config"] = IndexConfig(**{k: tuple(v) if k == "ignore" else v for k, v in data["config"].items()})
        known["slim"] = SlimConfig.from_dict(data.get("slim") or {})
        known["delta_parts"] = tuple(data.get("delta_parts") or ())
        known["gen_kind"] = data.get("gen_kind") or "flat"
        return cls(**known)


_FIELDS = frozenset(f.name for f in fields(Manifest))


def read(root: Path) -> Manifest:
    """Read, check and migrate the manifest of the index folder ``root``."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise IndexFormatError(f"{root} is not a slimrag index (no {MANIFEST}); build one with `slimrag build`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{path} is corrupt ({e.msg}); rebuild the index") from e
    if not isinstance(data, dict):
        raise IndexFormatError(f"{path} holds no JSON object; rebuild the index")
    try:
        return Manifest.from_dict(data)
    except IndexFormatError as e:
        raise IndexFormatError(f"{root}: {e}") from None


def write(root: Path, manifest: Manifest) -> None:
    """Replace ``root``'s manifest atomically (write-temp, fsync, rename)."""
    files.write_json_atomic(Path(root) / MANIFEST, manifest.to_dict())


def new(*, storage: str, embedder: dict[str, Any], config: IndexConfig, slim: SlimConfig,
        source_root: str | None) -> Manifest:
    """The manifest of an index just created: generation 0 (empty, flat), no delta."""
    now = time.time()
    return Manifest(storage=storage, embedder=embedder, config=config, slim=slim, source_root=source_root,
                    created=now, updated=now)

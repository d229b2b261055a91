"""`CacheConfig`: budgets, tiers and eviction policy of the knowledge tree (`slimrag.llm.kv`)."""

from __future__ import annotations

from dataclasses import dataclass

from slimrag.llm.kv.eviction import EVICTION_POLICIES
from slimrag.llm.kv.recompute import parse_recompute

#: Tier names of the knowledge tree, top first.
DEVICE, HOST, DISK = "device", "host", "disk"

#: How passage KV is reused (``CacheConfig.reuse``): ``exact`` = the knowledge tree's exact
#: prefixes only; ``blend`` = exact prefixes, then every later passage placed from its
#: position-independent entry with a recompute policy (:mod:`slimrag.llm.kv.blend`).
EXACT, BLEND = "exact", "blend"
REUSE_MODES = (EXACT, BLEND)
#: The default recompute policy of blend reuse: the cheapest measured setting with ≥ 90% of
#: answers identical to exact mode. On SmolLM2-135M none of the measured cheaper ones got there
#: (deviation:0.5: 71%; boundary:8+deviation:0.15: 25%; ``docs/bench_generation.md``), so it is
#: ``all`` until a setting in between is measured; pass a cheaper one to trade fidelity for TTFT.
DEFAULT_RECOMPUTE = "all"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Budgets and policy of the knowledge tree (:class:`slimrag.llm.kv.tree.KVTree`).

    device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``). On ``"cpu"`` there is no
    separate device tier and ``device_bytes`` is ignored.
    device_bytes / host_bytes: memory budgets. Rule of thumb: KV bytes per token = 2 (K and V) ×
    layers × kv_heads × head_dim × dtype bytes; SmolLM2-135M in float32 is 46 KB/token, so a
    200-token passage is ~9 MB and the 1 GiB host default holds ~110 passages.
    disk_bytes: budget of the disk tier; 0 (default) disables it. Reading a segment back from a
    local SSD is much cheaper than recomputing it on a CPU, less so next to a fast GPU.
    disk_dir: without ``persist``, the parent folder of the tier's scratch folder (a fresh temp
    folder inside it, removed by ``KVTree.close``), None meaning the system temp folder; with
    ``persist``, the folder of the kept files, None meaning ``$SLIMRAG_HOME/kv``.
    persist: keep the disk tier's files across processes (:mod:`slimrag.llm.kv.persist`): every
    segment is written through to disk when inserted, and a later process on the same model and
    compute mode restores them, so a one-shot ``ask`` reuses what earlier ones computed. False by
    default here; the embedded generator that ``RAG`` and the CLI build by default turns it on
    (:data:`PERSISTENT`).
    policy: a key of :data:`slimrag.llm.kv.eviction.EVICTION_POLICIES`; ``"gdsf"`` (default) weighs
    recompute cost, size and frequency, ``"lru"``/``"lfu"`` are baselines.
    attention_scale: the context length at which a token's attention work equals its
    linear-layer work (≈ 6 × hidden size); only shapes ``kvpayload.prefill_cost``.
    reuse: one of :data:`REUSE_MODES`; ``"exact"`` (default) gives tokens identical to no reuse,
    ``"blend"`` trades a measured amount of fidelity for reusing passages wherever they stand.
    recompute: the blend recompute policy (:func:`slimrag.llm.kv.recompute.parse_recompute`);
    ignored in exact mode.
    """

    device: str = "cpu"
    device_bytes: int = 2 << 30
    host_bytes: int = 1 << 30
    disk_bytes: int = 0
    disk_dir: str | None = None
    persist: bool = False
    policy: str = "gdsf"
    attention_scale: float = 4096.0
    reuse: str = "exact"
    recompute: str = DEFAULT_RECOMPUTE

    def __post_init__(self) -> None:
        if not self.device:
            raise ValueError("device must be a torch device string such as 'cpu' or 'cuda'")
        if min(self.device_bytes, self.host_bytes, self.disk_bytes) < 0:
            raise ValueError("device_bytes, host_bytes and disk_bytes must be >= 0")
        if self.host_bytes == 0 and (self.on_cpu or self.device_bytes == 0):
            raise ValueError("at least one memory tier needs a positive budget")
        if self.policy not in EVICTION_POLICIES:
            raise ValueError(f"policy must be one of {sorted(EVICTION_POLICIES)}, got {self.policy!r}")
        if self.attention_scale <= 0:
            raise ValueError(f"attention_scale must be positive, got {self.attention_scale}")
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {self.reuse!r}")
        parse_recompute(self.recompute)  # a ValueError naming the choices when it is not one
        if self.persist and self.disk_bytes == 0:
            raise ValueError("persist keeps the disk tier's files: give disk_bytes > 0 too")

    @property
    def on_cpu(self) -> bool:
        """True when the model runs on the CPU, so the device tier and the host tier are one."""
        return self.device.split(":")[0] == "cpu"

    def tiers(self) -> list[tuple[str, int]]:
        """The tiers in use, top first, as (name, budget); tiers with a zero budget are left out."""
        named = [(HOST, self.host_bytes)] if self.on_cpu else [(DEVICE, self.device_bytes), (HOST, self.host_bytes)]
        named.append((DISK, self.disk_bytes))
        return [(name, budget) for name, budget in named if budget > 0]


#: Disk budget of the persistent tier the default embedded generator uses: 2 GiB holds ~45k
#: tokens of SmolLM2-135M float32 KV (46 KB a token), about 200 passages of 220 tokens.
DEFAULT_DISK_BYTES = 2 << 30
#: The knowledge tree of the embedded generator that ``RAG`` and the CLI build by default: the
#: memory defaults plus a persistent disk tier in ``$SLIMRAG_HOME/kv``.
PERSISTENT = CacheConfig(disk_bytes=DEFAULT_DISK_BYTES, persist=True)

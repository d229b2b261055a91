"""The knowledge tree of passage KV (RAGCache's tree, SGLang's radix cache) and how the engine reuses it.

Parts: `config` (budgets, tiers, policy), `payload` (one segment's per-layer K/V and the tensor
helpers), `node` (one cached segment), `tree` (match, insert, release, walk, stats), `tiers`
(placement, promotion, demotion and eviction across tiers), `storage` (the tier stores),
`persist` (the disk tier kept across processes in ``$SLIMRAG_HOME/kv``),
`eviction` (the policies, a registry), `reuse` (the strategies the engine calls: no reuse, exact
tree reuse), `blend` (blend reuse: passages placed from position-independent entries, K
re-rotated) and `recompute` (its recompute policies, a registry). Importing this package does
not import torch.
"""

from slimrag.llm.kv.blend import BlendReuse
from slimrag.llm.kv.config import DEVICE, DISK, HOST, PERSISTENT, REUSE_MODES, CacheConfig
from slimrag.llm.kv.eviction import EVICTION_POLICIES, EvictionPolicy
from slimrag.llm.kv.node import Node
from slimrag.llm.kv.payload import SegmentKV, assemble_kv, cache_layers, prefill_cost, split_kv
from slimrag.llm.kv.persist import DamagedSegment, PersistentStorage, file_fingerprint
from slimrag.llm.kv.recompute import RECOMPUTE_POLICIES, RecomputePolicy, parse_recompute
from slimrag.llm.kv.reuse import KVReuse, Lease, NoReuse, PlanningView, PrefillEngine, TreeReuse
from slimrag.llm.kv.storage import KVStorage, SimulatedStorage, TorchStorage
from slimrag.llm.kv.strategies import REUSE_STRATEGIES, make_reuse
from slimrag.llm.kv.tiers import Tiers
from slimrag.llm.kv.tree import KVTree, KVTreeStats, Match, TierStats

__all__ = [
    "RECOMPUTE_POLICIES", "REUSE_MODES", "REUSE_STRATEGIES", "BlendReuse", "PrefillEngine", "RecomputePolicy",
    "make_reuse", "parse_recompute",
    "DEVICE", "DISK", "EVICTION_POLICIES", "HOST", "CacheConfig", "EvictionPolicy", "KVReuse", "KVStorage",
    "KVTree", "KVTreeStats", "Lease", "Match", "Node", "NoReuse", "PlanningView", "SegmentKV",
    "SimulatedStorage", "Tiers", "TierStats", "TorchStorage", "TreeReuse", "assemble_kv", "cache_layers",
    "prefill_cost", "split_kv", "PERSISTENT", "DamagedSegment", "PersistentStorage", "file_fingerprint",
]

"""The knowledge tree of passage KV (RAGCache's tree, SGLang's radix cache) and how the engine reuses it.

Parts: `config` (budgets, tiers, policy), `payload` (one segment's per-layer K/V), `tree` (match,
insert, release, eviction of leaves across tiers), `storage` (the tier stores), `eviction` (the
policies, a registry), `reuse` (the strategies the engine calls: no reuse, exact tree reuse).
"""

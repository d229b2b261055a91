"""`slimrag route`: the cache-aware router in front of several `slimrag serve` replicas.

Parts: `app` (the FastAPI front: forwarding, failover, SSE relay), `policy` (which replica gets a
request: longest cached prefix unless load is imbalanced), `prefix_tree` (what was sent where).
"""

"""The OpenAI-compatible wire, shared by the replica server (`slimrag.serve`) and the router
(`slimrag.route`): request and response schemas, errors in OpenAI's shape, the ASGI gate (API key,
body limit, counting) and the Prometheus metrics."""

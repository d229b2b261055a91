"""The OpenAI-compatible wire, shared by the replica server (`slimrag.serve`) and the router
(`slimrag.route`): request and response schemas with their limits (`schemas`), errors in
OpenAI's shape (`errors`), the published contract (`openapi`), the ASGI gate (API key, body limit,
counting: `gate`), stopping work for clients that left (`disconnect`) and the Prometheus metrics."""

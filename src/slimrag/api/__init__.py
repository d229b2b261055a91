"""The OpenAI-compatible wire, shared by the replica server (`slimrag.serve`) and the router
(`slimrag.route`): request and response schemas with their limits (`schemas`), errors in
OpenAI's shape (`errors`), the published contract (`openapi`), the ASGI gate (API key, body limit,
counting: `gate`), stopping work for clients that left (`disconnect`), the Prometheus metrics, and
how a server listens: `listen` (bind first, serve later) with its connections guarded by
`connections` (header and body timeouts, a cap below the descriptor limit; numbers in `limits`)."""

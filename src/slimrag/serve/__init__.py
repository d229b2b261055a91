"""`slimrag serve`: one replica's OpenAI-compatible HTTP server over an index.

Parts: `app` (the FastAPI factory and routes), `chat` (chat completions as RAG, SSE), `workers`
(threads that own an `Index` each)."""

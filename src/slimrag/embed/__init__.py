"""Embedders behind one `Embedder` interface: the packaged MiniLM (`local`), OpenAI-compatible endpoints (`remote`)."""

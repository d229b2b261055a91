"""Language models behind one `Generator` interface: the local transformers engine, remote OpenAI-compatible backends, and the KV knowledge tree (`kv`)."""

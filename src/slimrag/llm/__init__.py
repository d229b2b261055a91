"""Language models behind one `Generator` interface (`base`): the local transformers engine
(`local`), remote OpenAI-compatible backends (`remote`), the registry that builds either from a
spec (`backends`), and the KV knowledge tree (`kv`)."""

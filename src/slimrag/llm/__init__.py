"""Language models behind one `Generator` interface (`base`): the embedded generator (`local`) on
the plain-PyTorch engine (`engine`), remote OpenAI-compatible backends (`remote`), the registry
that builds either from a spec (`backends`), and the KV knowledge tree (`kv`)."""

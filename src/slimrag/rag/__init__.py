"""Retrieval-augmented generation: passage planning for cache reuse (`plan`), the remote-cache shadow (`shadow`), the pipeline (`pipeline`)."""

"""Ingest: find files (crawl), read them into sections (readers), cut sections into chunks (chunker)."""

"""Indexes: the `Index` facade (`core`), the on-disk layout (`layout`), exact flat search (`flat`), the slim graph index (`slim`), and Ray ingest into an index (`distributed`)."""

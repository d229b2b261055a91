"""Indexes: exact flat search (`flat`), the on-disk layout (`layout`), and the `Index` facade (`core`)."""

"""Keyed state snapshots: the ``memory`` and ``table`` backends (DESIGN §5)."""

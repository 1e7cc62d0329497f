"""Keyed state: key groups, state handles, the ``memory`` and ``table`` backends, delta
chains and the state reader (docs/engine.md)."""

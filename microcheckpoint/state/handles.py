"""State handles: re-exported from the protocol's records, where they are defined."""

from microcheckpoint.protocol.records.handles import StateHandle

__all__ = ["StateHandle"]

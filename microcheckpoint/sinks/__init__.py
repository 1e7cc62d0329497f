"""Exactly-once sinks: staged during the epoch, published after ``_metadata`` (DESIGN §5)."""

from microcheckpoint.sinks.base import EpochInfo, Sink

__all__ = ["EpochInfo", "Sink"]

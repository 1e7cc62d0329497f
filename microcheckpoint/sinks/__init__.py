"""Exactly-once sinks: staged during the epoch, published after ``_metadata`` (docs/sinks.md)."""

from microcheckpoint.sinks.base import EpochInfo, Sink

__all__ = ["EpochInfo", "Sink"]

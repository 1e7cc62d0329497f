"""One exception tree: every error the package raises derives from ``MicrocheckpointError``.

Messages name the thing, the value and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AcksMissing",
    "CheckpointExpired",
    "CheckpointNotFound",
    "CommitConflict",
    "CommitOutcomeUnknown",
    "ConfigError",
    "IncompatibleCheckpoint",
    "InvalidValue",
    "KafkaSinkError",
    "KafkaSourceError",
    "NotAligned",
    "MetadataFormatError",
    "MicrocheckpointError",
    "RestoreError",
    "ServiceError",
    "StateTooLarge",
    "StorageError",
    "StoreNotConformant",
    "TooManyFailures",
    "TriggerRefused",
    "unknown_name",
]


class MicrocheckpointError(Exception):
    """Root of every error raised by microcheckpoint."""


class ConfigError(MicrocheckpointError, ValueError):
    """A configuration value is wrong: the message names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"config field {field!r} = {value!r} is invalid: {allowed}")


class StorageError(MicrocheckpointError):
    """Checkpoint storage failed or could not be reached."""


class StoreNotConformant(StorageError):
    """Checkpoint storage breaks a promise of the port (put-if-absent): it is refused."""


class CommitConflict(MicrocheckpointError):
    """A conditional write lost: another writer got there first."""


class CommitOutcomeUnknown(StorageError):
    """A conditional write's outcome stayed unknown after reading back."""


class MetadataFormatError(MicrocheckpointError):
    """A ``_metadata`` (or other protocol file) is corrupt, foreign or from a newer version."""


class CorruptFile(MetadataFormatError):
    """A file a checkpoint references is not the file that was written: its size or
    content hash differs from its handle's (changed, truncated or replaced since)."""


class IncompatibleCheckpoint(MicrocheckpointError):
    """A checkpoint or savepoint belongs to another pipeline or does not fit this one."""


class CheckpointNotFound(MicrocheckpointError):
    """The requested checkpoint or savepoint does not exist."""


class RestoreError(MicrocheckpointError):
    """Nothing usable to restore from."""


class CheckpointExpired(MicrocheckpointError):
    """A checkpoint was not complete within the checkpoint timeout (it is now aborted)."""


class AcksMissing(MicrocheckpointError):
    """The global ack is not there yet: some expected tasks have not acknowledged."""


class TooManyFailures(MicrocheckpointError):
    """Consecutive checkpoint failures exceeded ``tolerable_failures``; triggering stops."""


class TriggerRefused(MicrocheckpointError):
    """A trigger was refused (min pause, max concurrent, or the pipeline is stopped)."""


class ServiceError(MicrocheckpointError, RuntimeError):
    """A service (the local broker or S3 server, Airflow's REST API) failed to start or answer."""


class KafkaSourceError(MicrocheckpointError):
    """Kafka could not answer for a topic or partition (missing, unreachable, out of range)."""


class NotAligned(KafkaSourceError):
    """A stage's input channels did not all deliver the upstream's next barrier marker in time."""


class KafkaSinkError(MicrocheckpointError):
    """Publishing to Kafka failed; ``commit`` may be called again and publishes only the rest."""


class StateTooLarge(MicrocheckpointError):
    """A ``memory`` state snapshot exceeds its size limit."""


class InvalidValue(MicrocheckpointError, ValueError):
    """A value does not fit its type: an id, an offset range, a record value for its schema."""


def unknown_name(what: str, name: str, value: object, known: Iterable[str]) -> ConfigError:
    """The error for ``name`` that is not one of ``known`` (a setting, a form field): it
    suggests the closest known name (a typo like ``min_paus``) and lists them all."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(name, value, f"not {what}; {hint}known: {', '.join(names)}")

"""Iceberg tables via pyiceberg: one atomic table commit per epoch, the epoch in the summary.

As Flink's Iceberg sink stores its max committed checkpoint id, every snapshot this sink
commits carries ``microcheckpoint.pipeline``, ``microcheckpoint.uid`` and
``microcheckpoint.epoch`` in its summary. Before committing epoch ``n`` the sink walks the
ancestry of the table's current snapshot: if an epoch ``>= n`` of the same pipeline and uid
is already there, the commit is skipped (a recovery re-commit, or a zombie's older epoch).

Guarantees and edge cases:

- The epoch check and the commit are optimistic: the commit asserts the snapshot the check
  read. On a conflict (``CommitFailedException``) the sink reloads the table and checks again,
  never rebasing blindly; pyiceberg's own retry-with-rebase is turned off for these commits,
  because it would re-apply the epoch without the check.
- Upsert commits delete the batch's keys and append the batch in one transaction: one
  catalog commit with up to three snapshots (delete, rewrite, append), all carrying the epoch.
- Expiring snapshots must keep the newest snapshot of each (pipeline, uid), or a recovery
  re-commit of that epoch publishes it again (the same caveat as Flink's sink).
- ``write_at_least_once`` snapshots also carry ``microcheckpoint.part``; they never count as
  committed epochs.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from microcheckpoint.errors import CommitConflict, ConfigError
from microcheckpoint.sinks.base import EpochInfo, Sink

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = [
    "EPOCH_KEY",
    "PART_KEY",
    "PIPELINE_KEY",
    "UID_KEY",
    "IcebergCommit",
    "IcebergSink",
    "s3_catalog_properties",
]

PIPELINE_KEY = "microcheckpoint.pipeline"
UID_KEY = "microcheckpoint.uid"
EPOCH_KEY = "microcheckpoint.epoch"
PART_KEY = "microcheckpoint.part"

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
_MODES = ("append", "upsert")


class IcebergCommit(enum.Enum):
    """What ``IcebergSink.commit`` did with an epoch."""

    COMMITTED = "committed"
    DUPLICATE = "duplicate"  # this epoch is already in the table (recovery re-commit)
    SUBSUMED = "subsumed"  # a newer epoch is already in the table (zombie commit)


def s3_catalog_properties(
    endpoint: str, region: str, access_key: str, secret_key: str
) -> dict[str, str]:
    """Catalog properties for tables on an S3 API server, through pyarrow's S3 file system."""
    return {
        "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
        "s3.endpoint": endpoint,
        "s3.region": region,
        "s3.access-key-id": access_key,
        "s3.secret-access-key": secret_key,
        "s3.force-virtual-addressing": "false",
    }


def _arrow_schema(schema: pa.Schema | Mapping[str, str]) -> pa.Schema:
    if isinstance(schema, pa.Schema):
        return schema
    if not isinstance(schema, Mapping) or not schema:
        raise ConfigError("schema", schema, "a pyarrow schema or a non-empty {column: type} dict")
    fields = []
    for name, type_name in schema.items():
        if type_name not in _TYPES:
            raise ConfigError(f"schema[{name!r}]", type_name, f"one of {sorted(_TYPES)}")
        fields.append(pa.field(name, _TYPES[type_name]))
    return pa.schema(fields)


class IcebergSink(Sink):
    """Publishes each epoch as one atomic commit to an Iceberg table.

    Picklable: the catalog is created lazily on first use and left out of the pickled state,
    so the sink can be shipped to Spark executors.

    Args:
        uid: the sink's stable operator uid.
        table: ``"namespace.name"``.
        schema: a pyarrow schema, or ``{column: "string" | "long" | "double" | "boolean"}``.
        mode: ``"append"`` or ``"upsert"`` (one row per ``key_columns``, the latest wins).
        key_columns: the key for ``"upsert"``; key values must not be null.
        catalog: pyiceberg catalog properties (``load_catalog(catalog_name, **catalog)``).
            Without ``uri``/``type`` a SQLite ``SqlCatalog`` under ``catalog_path`` is used.
        catalog_name: the catalog's name.
        catalog_path: folder of the default SQLite catalog (``catalog.db``) and, unless
            ``warehouse`` is given, of its warehouse (``warehouse/``).
        warehouse: the warehouse location (``file:///…`` or ``s3://bucket/prefix``).
        max_commit_attempts: tries on concurrent-commit conflicts before ``CommitConflict``.
    """

    def __init__(
        self,
        uid: str,
        table: str,
        schema: pa.Schema | Mapping[str, str],
        *,
        mode: str = "append",
        key_columns: Sequence[str] = (),
        catalog: Mapping[str, str] | None = None,
        catalog_name: str = "microcheckpoint",
        catalog_path: str | Path | None = None,
        warehouse: str | None = None,
        max_commit_attempts: int = 5,
    ) -> None:
        super().__init__(uid)
        if not isinstance(table, str) or table.count(".") < 1 or "" in table.split("."):
            raise ConfigError("table", table, 'a table identifier "namespace.name"')
        if mode not in _MODES:
            raise ConfigError("mode", mode, f"one of {_MODES}")
        self.table = table
        self.schema = _arrow_schema(schema)
        self.mode = mode
        self.key_columns = tuple(key_columns)
        missing = [c for c in self.key_columns if c not in self.schema.names]
        if mode == "upsert" and (not self.key_columns or missing):
            raise ConfigError(
                "key_columns", key_columns, f"upsert needs key columns out of {self.schema.names}"
            )
        if max_commit_attempts < 1:
            raise ConfigError("max_commit_attempts", max_commit_attempts, "an integer >= 1")
        self.max_commit_attempts = max_commit_attempts
        self.catalog_name = catalog_name
        self.catalog_properties = self._catalog_properties(catalog, catalog_path, warehouse)
        self._catalog: Catalog | None = None

    @staticmethod
    def _catalog_properties(
        catalog: Mapping[str, str] | None, catalog_path: str | Path | None, warehouse: str | None
    ) -> dict[str, str]:
        props = dict(catalog or {})
        if "uri" not in props and "type" not in props:
            if catalog_path is None:
                raise ConfigError(
                    "catalog_path", None, "a folder for the SQLite catalog, or catalog properties"
                )
            root = Path(catalog_path).resolve()
            root.mkdir(parents=True, exist_ok=True)
            props.update(type="sql", uri=f"sqlite:///{root / 'catalog.db'}")
            props.setdefault("warehouse", (root / "warehouse").as_uri())
        if warehouse is not None:
            props["warehouse"] = warehouse
        return props

    # -- pickling: the catalog (connections, file systems) stays behind ------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_catalog"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- catalog and table ---------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg catalog, created on first use."""
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            self._catalog = load_catalog(self.catalog_name, **self.catalog_properties)
        return self._catalog

    def describe_catalog(self) -> str:
        """The catalog's name and where it is, for messages (no credentials)."""
        where = self.catalog_properties.get("uri") or self.catalog_properties.get("type", "?")
        warehouse = self.catalog_properties.get("warehouse", "-")
        return f"catalog {self.catalog_name!r} ({where}, warehouse {warehouse})"

    def open(self) -> None:
        """Create the namespace and the table if missing; check an existing table's columns.

        Raises:
            ConfigError: the table exists with other columns or types than ``schema``.
        """
        namespace = self.table.rsplit(".", 1)[0]
        self.catalog.create_namespace_if_not_exists(namespace)
        table = self.catalog.create_table_if_not_exists(self.table, schema=self.schema)
        self._check_schema(table)

    def load_table(self) -> Table:
        """The table as the catalog has it now."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.table)
        except NoSuchTableError as exc:
            raise ConfigError(
                "table",
                self.table,
                f"no such table in {self.describe_catalog()}; call open() first",
            ) from exc

    def _check_schema(self, table: Table) -> None:
        have = {f.name: f.type for f in table.schema().as_arrow()}
        want = {f.name: f.type for f in self.schema}
        # pyiceberg reads strings back as large_string: compare Iceberg types, not Arrow ones.
        norm = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
        have = {k: norm.get(v, v) for k, v in have.items()}
        want = {k: norm.get(v, v) for k, v in want.items()}
        if have != want:
            raise ConfigError(
                "schema",
                {k: str(v) for k, v in want.items()},
                f"table {self.table!r} in {self.describe_catalog()} has columns "
                f"{ {k: str(v) for k, v in have.items()} }; pass that schema, or use another "
                "table name (or drop the table) for the new one",
            )

    # -- reading ---------------------------------------------------------------------------

    def committed_epoch(self, pipeline: str, uid: str | None = None) -> int | None:
        """The newest epoch of ``(pipeline, uid)`` committed to the table, or None.

        Only the current snapshot's ancestry counts (a rolled-back snapshot does not), and
        at-least-once snapshots (with ``microcheckpoint.part``) never count.
        """
        return _committed_epoch(self.load_table(), pipeline, uid or self.uid)

    def read_table(self, row_filter: str | None = None) -> list[dict[str, Any]]:
        """The table's rows as dicts (for tests and the demo), optionally filtered."""
        table = self.load_table()
        scan = table.scan(row_filter=row_filter) if row_filter else table.scan()
        return scan.to_arrow().to_pylist()

    # -- writing ---------------------------------------------------------------------------

    def commit(self, epoch: EpochInfo, parts: Sequence[Sequence[dict[str, Any]]]) -> IcebergCommit:
        """Publish every part of ``epoch`` in one table commit, unless it is already there.

        Steps:
            1. Build one Arrow table of all parts' rows (in part order; for upsert, the last
               row of each key wins).
            2. Load the table and read its committed epoch for ``(pipeline, uid)``; stop if it
               is ``>=`` this epoch.
            3. Stage the epoch in a transaction (append, or delete-keys + append) whose
               snapshots carry the epoch; commit it.
            4. On a conflict, go back to step 2 (at most ``max_commit_attempts`` times).

        An empty epoch commits an empty snapshot, so the committed epoch still advances.

        Raises:
            CommitConflict: every attempt lost against a concurrent writer.
            ConfigError: rows that do not fit the table's schema.
        """
        from pyiceberg.exceptions import CommitFailedException

        # Step 1
        rows = [row for part in parts for row in part]
        data = self._to_arrow(rows)
        if self.mode == "upsert":
            data = self._last_per_key(data)
        summary = {
            PIPELINE_KEY: epoch.pipeline,
            UID_KEY: epoch.uid,
            EPOCH_KEY: str(epoch.checkpoint_id),
        }
        for _attempt in range(self.max_commit_attempts):
            # Step 2
            table = self.load_table()
            done = _committed_epoch(table, epoch.pipeline, epoch.uid)
            if done is not None and done >= epoch.checkpoint_id:
                if done == epoch.checkpoint_id:
                    return IcebergCommit.DUPLICATE
                return IcebergCommit.SUBSUMED
            # Step 3
            try:
                self._commit_once(table, data, summary)
            except CommitFailedException:
                continue  # Step 4
            return IcebergCommit.COMMITTED
        raise CommitConflict(
            f"epoch {epoch.checkpoint_id} of pipeline {epoch.pipeline!r} (sink {epoch.uid!r}) "
            f"lost {self.max_commit_attempts} commits on table {self.table!r} in "
            f"{self.describe_catalog()} to concurrent writers; retry the notify, or raise "
            "max_commit_attempts"
        )

    def write_at_least_once(
        self, epoch: EpochInfo, part: int, rows: Sequence[dict[str, Any]]
    ) -> None:
        """Append subtask ``part``'s rows now; a replay appends them again (duplicates).

        Upsert mode overwrites the part's keys instead, so a replay changes nothing.
        Nothing is committed for an empty part.
        """
        if not rows:
            return
        data = self._to_arrow(list(rows))
        if self.mode == "upsert":
            data = self._last_per_key(data)
        summary = {
            PIPELINE_KEY: epoch.pipeline,
            UID_KEY: epoch.uid,
            EPOCH_KEY: str(epoch.checkpoint_id),
            PART_KEY: str(part),
        }
        table = self.load_table()
        # Here pyiceberg's retry-with-rebase is fine: duplicates are allowed, loss is not.
        with table.transaction() as tx:
            self._stage(tx, data, summary)

    def _commit_once(self, table: Table, data: pa.Table, summary: dict[str, str]) -> None:
        # The epoch check read ``table``: no retry may rebase onto a newer snapshot unchecked.
        table.metadata = table.metadata.model_copy(
            update={"properties": {**table.metadata.properties, "commit.retry.num-retries": "0"}}
        )
        with table.transaction() as tx:
            self._stage(tx, data, summary)

    def _stage(self, tx: Any, data: pa.Table, summary: dict[str, str]) -> None:
        if self.mode == "upsert" and len(data) > 0 and tx.table_metadata.current_snapshot():
            from pyiceberg.table.upsert_util import create_match_filter

            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Delete operation did not match any records")
                tx.delete(
                    create_match_filter(data, list(self.key_columns)), snapshot_properties=summary
                )
        tx.append(data, snapshot_properties=summary)

    def _to_arrow(self, rows: list[dict[str, Any]]) -> pa.Table:
        names = set(self.schema.names)
        extra = sorted({k for row in rows for k in row} - names)
        if extra:
            raise ConfigError(
                "rows",
                extra,
                f"columns of table {self.table!r} in {self.describe_catalog()}: "
                f"{self.schema.names}; drop the other fields or add them to the schema",
            )
        try:
            data = pa.Table.from_pylist(rows, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ConfigError(
                "rows",
                str(exc),
                f"values of the types {dict(zip(self.schema.names, map(str, self.schema.types), strict=True))} "
                f"of table {self.table!r} in {self.describe_catalog()}",
            ) from exc
        if self.mode == "upsert":
            for column in self.key_columns:
                if data.column(column).null_count:
                    raise ConfigError(
                        "rows", column, f"non-null key values for upsert into table {self.table!r}"
                    )
        return data

    def _last_per_key(self, data: pa.Table) -> pa.Table:
        last: dict[tuple[Any, ...], int] = {}
        keys = zip(*(data.column(c).to_pylist() for c in self.key_columns), strict=True)
        for index, key in enumerate(keys):
            last[key] = index
        return data.take(sorted(last.values()))


def _committed_epoch(table: Table, pipeline: str, uid: str) -> int | None:
    from pyiceberg.table.snapshots import ancestors_of

    newest: int | None = None
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(PIPELINE_KEY) != pipeline or props.get(UID_KEY) != uid or PART_KEY in props:
            continue
        epoch = int(props[EPOCH_KEY])
        newest = epoch if newest is None else max(newest, epoch)
    return newest

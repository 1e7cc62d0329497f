"""A run's conf against its DAG's declared params (microcheckpoint.run_conf).

The Airflow side, which feeds this comparison from a real run, is tested through Airflow's
REST trigger and ``airflow dags trigger`` (tests/e2e/test_airflow_scheduler.py).
"""

from __future__ import annotations

import pytest

from harness.airflow_stack import BACKFILL_REQUEST
from microcheckpoint.errors import ConfigError
from microcheckpoint.run_conf import RUN_TAGS, unknown_conf_key

RESTORE_FORM = ["point", "claim_mode", "allow_non_restored_state", "parallelism", "resume"]


def test_a_misspelt_key_names_the_key_its_value_and_the_closest_field() -> None:
    error = unknown_conf_key({"point": "latest", "paralelism": 3}, RESTORE_FORM, "pipe_restore")
    assert isinstance(error, ConfigError)
    assert (error.field, error.value) == ("paralelism", 3)
    assert str(error) == (
        "config field 'paralelism' = 3 is invalid: not a field of pipe_restore's form; did "
        "you mean 'parallelism'? known: allow_non_restored_state, claim_mode, parallelism, "
        "point, resume"
    )


def test_every_unknown_key_is_named_in_one_line() -> None:
    conf = {"targt": "", "stopp": True, "target": ""}
    error = unknown_conf_key(conf, ["target", "stop"], "pipe_savepoint")
    assert str(error) == (
        "config field 'stopp' = True is invalid: not a field of pipe_savepoint's form; did you "
        "mean 'stop'? known: stop, target; also unknown: targt"
    )
    assert "\n" not in str(error)


def test_a_key_far_from_every_field_lists_the_fields_without_a_guess() -> None:
    error = unknown_conf_key({"colour": "red"}, ["target", "stop"], "pipe_savepoint")
    assert str(error) == (
        "config field 'colour' = 'red' is invalid: not a field of pipe_savepoint's form; "
        "known: stop, target"
    )


def test_a_dag_without_params_refuses_any_key() -> None:
    error = unknown_conf_key({"paralelism": 3}, [], "pipe_pipeline")
    assert str(error) == (
        "config field 'paralelism' = 3 is invalid: pipe_pipeline declares no params; trigger "
        "it without a conf"
    )


@pytest.mark.parametrize(
    ("conf", "declared"),
    [
        (None, []),  # a scheduled or asset-triggered run
        ({}, []),  # a run triggered with an empty form
        ({"point": "7", "resume": False}, RESTORE_FORM),  # the form's own fields
        ({"microcheckpoint_backfill_request": "ab12"}, []),  # a backfill client's tag
    ],
)
def test_declared_keys_runs_without_a_conf_and_tags_pass(conf, declared) -> None:
    assert unknown_conf_key(conf, declared, "pipe_pipeline") is None


def test_the_backfill_clients_tag_is_the_only_tag() -> None:
    tags = set(RUN_TAGS)
    assert tags == {BACKFILL_REQUEST}
    # A near miss of the tag is a typo like any other.
    error = unknown_conf_key({"microcheckpoint_backfill_requests": "x"}, [], "pipe_pipeline")
    assert error is not None and error.field == "microcheckpoint_backfill_requests"


def test_keys_are_compared_exactly() -> None:
    error = unknown_conf_key({"Parallelism": 3}, RESTORE_FORM, "pipe_restore")
    assert error is not None and "did you mean 'parallelism'?" in str(error)


def test_a_conf_that_is_no_object_is_refused() -> None:
    error = unknown_conf_key([3], RESTORE_FORM, "pipe_restore")
    assert str(error) == (
        "config field 'conf of pipe_restore' = [3] is invalid: a JSON object of the form's fields"
    )

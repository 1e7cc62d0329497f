"""Registers microcheckpoint with Airflow (its hooks show in the connection form list).

The operators, sensors, triggers and the DAG factory live in the package
``microcheckpoint_airflow`` next to this file; Airflow puts the plugins folder on
``sys.path``, so DAG files, workers and the triggerer import it by name.
"""

from airflow.plugins_manager import AirflowPlugin

from microcheckpoint_airflow.hooks import AirflowApiHook, CheckpointStorageHook, KafkaHook


class MicrocheckpointPlugin(AirflowPlugin):
    name = "microcheckpoint"
    hooks = [CheckpointStorageHook, KafkaHook, AirflowApiHook]

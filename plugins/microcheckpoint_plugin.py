"""Registers microcheckpoint with Airflow: the checkpoint history page and its JSON API.

The operators, sensors, triggers and the DAG factory live in the package
``microcheckpoint_airflow`` next to this file; Airflow puts the plugins folder on
``sys.path``, so DAG files, workers and the triggerer import it by name.
"""

from airflow.plugins_manager import AirflowPlugin

from microcheckpoint_airflow.history_app import app


class MicrocheckpointPlugin(AirflowPlugin):
    name = "microcheckpoint"
    fastapi_apps = [{"app": app, "url_prefix": "/microcheckpoint", "name": "Checkpoints"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "Checkpoints",
            "href": "/microcheckpoint/",
            "destination": "nav",
            "url_route": "checkpoints",
        }
    ]

"""Registers microcheckpoint with Airflow: the Checkpoints page and its JSON API.

Airflow finds this class through the distribution's ``airflow.plugins`` entry point (see
``pyproject.toml``): installing ``microcheckpoint[airflow]`` into Airflow's environment is
all it takes; nothing is copied into ``$AIRFLOW_HOME/plugins``. Do not also import this
class from a module in the plugins folder: Airflow would find it twice and report the
second as an import error.
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

"""Airflow imports this module in every component at start, from ``$AIRFLOW_HOME/config/``.

microcheckpoint's epoch tasks fork from the executor's worker processes; loading their modules
there once (``preload``) saves each task about 1.5 s of imports. The Docker image and the
test harness install this file; copy it into your own ``$AIRFLOW_HOME/config/`` (or add the
two lines below to an ``airflow_local_settings.py`` you already have).
"""

from microcheckpoint_airflow.preload import preload

preload()

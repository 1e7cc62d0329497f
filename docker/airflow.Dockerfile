# Airflow image for the microcheckpoint stack (api-server, scheduler, dag-processor, triggerer).
# Build context: the repository root (docker compose: `context: ..`).
#
# The Spark driver runs inside the scheduler's task processes (spark-submit in client mode, or
# in-process local Spark), so the image carries a Java 17 runtime next to Python 3.11.
FROM apache/airflow:3.3.2-python3.11

USER root

# Java for the Spark driver. The man directory is missing on slim Debian images and the JRE's
# postinst fails without it. JAVA_HOME gets an architecture-independent path.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17; \
    /usr/lib/jvm/java-17/bin/java -version; \
    mkdir -p /opt/microcheckpoint /opt/airflow/auth; \
    chown airflow:0 /opt/microcheckpoint /opt/airflow/auth; \
    chmod 0770 /opt/airflow/auth

ENV JAVA_HOME=/usr/lib/jvm/java-17

# The image refuses pip as root; packages go into the airflow user's environment.
USER airflow

# Dependencies first, so that a code change does not reinstall them.
COPY --chown=airflow:0 requirements.txt /opt/microcheckpoint/requirements.txt
RUN pip install --no-cache-dir "apache-airflow==3.3.2" -r /opt/microcheckpoint/requirements.txt

# The project. Only what runs in Airflow and in the Spark job is copied (not .venv, .git or
# the tests), because the repository has no .dockerignore.
COPY --chown=airflow:0 pyproject.toml README.md /opt/microcheckpoint/
COPY --chown=airflow:0 microcheckpoint /opt/microcheckpoint/microcheckpoint
COPY --chown=airflow:0 spark_jobs /opt/microcheckpoint/spark_jobs
COPY --chown=airflow:0 examples /opt/microcheckpoint/examples
COPY --chown=airflow:0 dags /opt/microcheckpoint/dags
COPY --chown=airflow:0 microcheckpoint_airflow /opt/microcheckpoint/microcheckpoint_airflow
# Imported by every Airflow component at start: loads the epoch task's modules once in the
# processes tasks fork from.
COPY --chown=airflow:0 docker/airflow_local_settings.py /opt/airflow/config/airflow_local_settings.py
RUN pip install --no-cache-dir --no-deps -e /opt/microcheckpoint

# The Spark provider pulls in pyspark-client, whose files overwrite pyspark's own Python
# sources with another version: put pyspark 4.3.0's files back, without touching its deps.
RUN pip install --no-cache-dir --no-deps --force-reinstall "pyspark==4.3.0"

# spark-submit and local Spark use the pip pyspark as SPARK_HOME; fail the build if the
# path below is not where pip put it.
ENV SPARK_HOME=/home/airflow/.local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3.11 \
    PYTHONPATH=/opt/microcheckpoint
RUN test "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" = "${SPARK_HOME}" \
    && test "$(python -c 'import pyspark; print(pyspark.__version__)')" = "4.3.0" \
    && python -c "import airflow, microcheckpoint, examples.wordcount; print('airflow', airflow.__version__)"

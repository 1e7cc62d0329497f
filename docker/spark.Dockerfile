# Spark standalone master and worker for the microcheckpoint stack.
# Build context: the repository root (docker compose: `context: ..`).
#
# Spark itself comes from the pip pyspark wheel (the same 4.3.0 jars as the driver in the
# Airflow image). The executors run the project's Python code: the Kafka range reader
# (kafka-python), state snapshots and acks to S3 (boto3, pyarrow) and the sinks (pyiceberg), so
# the image has the project and its runtime pins, with the same Python minor version (3.11) as
# the driver.
FROM python:3.11-slim-bookworm

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Java 17 for the Spark JVMs; procps because Spark's scripts call `ps`. The man directory is
# missing on slim images and the JRE's postinst fails without it.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless procps; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17; \
    /usr/lib/jvm/java-17/bin/java -version

ENV JAVA_HOME=/usr/lib/jvm/java-17

# The runtime pins from requirements.txt, without Airflow and its Spark provider: executors
# never import Airflow (the core is checked for that by tests/unit/test_core_purity.py).
COPY requirements.txt /opt/microcheckpoint/requirements.txt
RUN set -eux; \
    grep -v -i -E '^[[:space:]]*apache-airflow' /opt/microcheckpoint/requirements.txt \
        > /tmp/executor-requirements.txt; \
    cat /tmp/executor-requirements.txt; \
    pip install -r /tmp/executor-requirements.txt; \
    rm /tmp/executor-requirements.txt

# The project: the package, the spark-submit entry point and the example pipelines, whose
# functions the executors unpickle by module name.
COPY pyproject.toml README.md /opt/microcheckpoint/
COPY microcheckpoint /opt/microcheckpoint/microcheckpoint
COPY spark_jobs /opt/microcheckpoint/spark_jobs
COPY examples /opt/microcheckpoint/examples
RUN pip install --no-deps -e /opt/microcheckpoint

# Same step as in the Airflow image and the Makefile: make sure pyspark's own 4.3.0 files are
# the ones installed (the Airflow Spark provider's pyspark-client would overwrite them).
RUN pip install --no-deps --force-reinstall "pyspark==4.3.0"

# SPARK_HOME is the installed pyspark package directory (it holds bin/, sbin/ and jars/);
# fail the build if pip put it elsewhere.
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
ENV PATH="${SPARK_HOME}/bin:${PATH}" \
    PYSPARK_PYTHON=python3.11 \
    PYTHONPATH=/opt/microcheckpoint \
    SPARK_WORKER_DIR=/opt/spark/work
RUN set -eux; \
    test "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" = "${SPARK_HOME}"; \
    test "$(python -c 'import pyspark; print(pyspark.__version__)')" = "4.3.0"; \
    test -x "${SPARK_HOME}/bin/spark-class"; \
    python -c "import boto3, kafka, pyarrow, pyiceberg, microcheckpoint, examples.wordcount"

# Run as an unprivileged user with its own work directory (executor sandboxes, shuffle files).
RUN set -eux; \
    useradd --uid 185 --gid 0 --create-home --home-dir /home/spark spark; \
    mkdir -p /opt/spark/work; \
    chown -R spark:0 /opt/spark; \
    chmod -R g+rwX /opt/spark
USER spark
WORKDIR /opt/microcheckpoint

EXPOSE 7077 8080 8081

# The compose file starts the master or the worker with spark-class.
CMD ["spark-class", "org.apache.spark.deploy.master.Master"]

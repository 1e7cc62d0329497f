"""The ``export`` lines ``make demo KEEP=1`` ends with: one per setting the README's CLI
section needs, quoted for the shell, and the block runs as pasted (checked with bash)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.demo import cli_exports
from harness.services import S3Endpoint


class _Airflow:
    url = "http://127.0.0.1:8080"
    username = "admin"
    password = "pa ss'word"


def test_the_exports_name_every_endpoint_and_run_as_pasted(tmp_path: Path) -> None:
    s3 = S3Endpoint("http://127.0.0.1:9000", access_key="MCPTESTAB12", secret_key="s3cr-et_x")
    lines = cli_exports(s3, "127.0.0.1:9092", _Airflow(), 3)  # type: ignore[arg-type]
    assert lines == [
        "# The microcheckpoint command on this demo (README.md, Operating it): paste into a shell,",
        "# then: microcheckpoint list; microcheckpoint show 3",
        "export MICROCHECKPOINT_STORAGE=s3://microcheckpoint-demo/checkpoints",
        "export MICROCHECKPOINT_PIPELINE=wordcount",
        "export MICROCHECKPOINT_S3_ENDPOINT=http://127.0.0.1:9000",
        "export MICROCHECKPOINT_KAFKA_BOOTSTRAP=127.0.0.1:9092",
        "export AWS_ACCESS_KEY_ID=MCPTESTAB12",
        "export AWS_SECRET_ACCESS_KEY=s3cr-et_x",
        "export MICROCHECKPOINT_AIRFLOW_URL=http://127.0.0.1:8080",
        "export MICROCHECKPOINT_AIRFLOW_USER=admin",
        "export MICROCHECKPOINT_AIRFLOW_PASSWORD='pa ss'\"'\"'word'",
        "# Airflow UI: http://127.0.0.1:8080/  Checkpoints page: http://127.0.0.1:8080/microcheckpoint/",
    ]
    script = (
        "\n".join(lines)
        + '\nprintf \'%s|%s\' "$MICROCHECKPOINT_AIRFLOW_PASSWORD" "$AWS_SECRET_ACCESS_KEY"'
    )
    done = subprocess.run(["bash", "--norc", "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "pa ss'word|s3cr-et_x", "")

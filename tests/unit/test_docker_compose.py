"""The compose stack in docker/ is valid and consistent with the code and requirements.txt.

No Docker engine is needed: the compose file and the Dockerfiles are parsed and checked
against each other, against docker/.env.example and against the repository.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
ENV_EXAMPLE = DOCKER / ".env.example"

REQUIRED_SERVICES = {
    "kafka",
    "minio",
    "minio-init",
    "postgres",
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker",
}
AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
CONNECTIONS = {
    "AIRFLOW_CONN_MICROCHECKPOINT_STORAGE": "microcheckpoint_storage",
    "AIRFLOW_CONN_MICROCHECKPOINT_KAFKA": "microcheckpoint_kafka",
    "AIRFLOW_CONN_MICROCHECKPOINT_AIRFLOW_API": "microcheckpoint_api",
    "AIRFLOW_CONN_SPARK_DEFAULT": "spark",
}
DAG_ENVIRONMENT = {
    "MICROCHECKPOINT_STORAGE": "s3://microcheckpoint/checkpoints",
    "MICROCHECKPOINT_SPARK_MODE": "submit",
    "MICROCHECKPOINT_SPARK_CONN_ID": "spark_default",
    "WORDCOUNT_TOPIC": "lines",
    "WORDCOUNT_SINK": "s3://microcheckpoint/output/wordcount",
}

# $$ (a literal dollar), ${NAME}, ${NAME:-default}, ${NAME:?error} and friends, or $NAME.
_INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


# -- helpers ------------------------------------------------------------------------------------


def read_env_example() -> dict[str, str]:
    values = {}
    for raw in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, f"line without '=' in {ENV_EXAMPLE}: {raw!r}"
        values[name.strip()] = value.strip()
    return values


def referenced_variables(text: str) -> set[str]:
    names = set()
    for match in _INTERPOLATION.finditer(text):
        name = match.group("braced") or match.group("bare")
        if name:
            names.add(name)
    return names


def interpolate(value: str, env: dict[str, str]) -> str:
    """Substitute variables the way `docker compose` does (the subset used here)."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg")
        if name in env and (env[name] or not (op or "").startswith(":")):
            return env[name] if op not in ("+", ":+") else arg
        if op in ("-", ":-"):
            return arg
        if op in ("?", ":?"):
            raise AssertionError(f"required variable {name} is not set: {arg}")
        return ""

    return _INTERPOLATION.sub(substitute, value)


def requirement_pins() -> dict[str, str]:
    pins = {}
    for raw in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = pending + stripped
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, f"{path} ends inside a continued instruction"
    return instructions


def dockerfile_env(path: Path) -> dict[str, str]:
    env = {}
    for keyword, args in dockerfile_instructions(path):
        if keyword == "ENV":
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def dockerfile_copies(path: Path) -> dict[str, str]:
    """Destination path in the image -> source path in the build context, per COPY."""
    copies = {}
    for keyword, args in dockerfile_instructions(path):
        if keyword != "COPY":
            continue
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        *sources, dest = words
        assert sources, f"COPY without a source in {path}: {args}"
        for source in sources:
            if dest.endswith("/"):
                target = dest + Path(source).name
            else:
                assert len(sources) == 1, f"COPY of several sources needs a directory: {args}"
                target = dest
            copies[target.rstrip("/")] = source
    return copies


def run_commands(path: Path) -> str:
    return "\n".join(args for keyword, args in dockerfile_instructions(path) if keyword == "RUN")


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def option(words: list[str], name: str) -> str:
    assert name in words, f"{name} missing from {words}"
    return words[words.index(name) + 1]


def dockerfile_of(service: dict[str, Any]) -> Path:
    build = service["build"]
    return (COMPOSE_FILE.parent / build["context"] / build["dockerfile"]).resolve()


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return read_env_example()


@pytest.fixture(scope="module")
def connections(
    services: dict[str, dict[str, Any]], env_example: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """The four connections as the Airflow API server sees them, after interpolation."""
    env = environment(services["airflow-api-server"])
    return {name: json.loads(interpolate(env[name], env_example)) for name in CONNECTIONS}


# -- the compose file ---------------------------------------------------------------------------


def test_compose_file_parses_and_has_every_service(services: dict[str, dict[str, Any]]) -> None:
    missing = REQUIRED_SERVICES - set(services)
    assert not missing, f"services missing from {COMPOSE_FILE}: {sorted(missing)}"
    for name, service in services.items():
        assert "image" in service or "build" in service, f"{name} has neither image nor build"


def test_kafka_runs_in_kraft_mode_without_zookeeper(services: dict[str, dict[str, Any]]) -> None:
    assert not [name for name in services if "zookeeper" in name.lower()]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = environment(kafka)
    roles = {role.strip() for role in env["KAFKA_PROCESS_ROLES"].split(",")}
    assert roles == {"broker", "controller"}
    assert not any("ZOOKEEPER" in name for name in env)
    node = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node}@kafka:9093"
    assert "CONTROLLER://0.0.0.0:9093" in env["KAFKA_LISTENERS"].split(",")
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert any(v.endswith(":/var/lib/kafka/data") for v in kafka["volumes"])


def test_airflow_services_are_the_ones_built_from_the_airflow_image(
    services: dict[str, dict[str, Any]],
) -> None:
    built = {
        name
        for name, service in services.items()
        if "build" in service and dockerfile_of(service) == DOCKER / "airflow.Dockerfile"
    }
    assert built == AIRFLOW_SERVICES


@pytest.mark.parametrize("service_name", sorted(AIRFLOW_SERVICES))
def test_every_airflow_service_gets_the_connections_and_settings(
    services: dict[str, dict[str, Any]], env_example: dict[str, str], service_name: str
) -> None:
    env = environment(services[service_name])
    for name, conn_type in CONNECTIONS.items():
        assert name in env, f"{service_name} lacks {name}"
        parsed = json.loads(interpolate(env[name], env_example))
        assert parsed["conn_type"] == conn_type, f"{name} in {service_name}"
    for name, value in DAG_ENVIRONMENT.items():
        assert env.get(name) == value, f"{name} in {service_name}"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == (
        "http://airflow-api-server:8080/execution/"
    )
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    # Secrets every component must share come from docker/.env, never from a literal.
    assert referenced_variables(env["AIRFLOW__API_AUTH__JWT_SECRET"]) == {"AIRFLOW_JWT_SECRET"}
    assert referenced_variables(env["AIRFLOW__CORE__FERNET_KEY"]) == {"AIRFLOW_FERNET_KEY"}
    assert referenced_variables(env["AIRFLOW__API__SECRET_KEY"]) == {"AIRFLOW_API_SECRET_KEY"}
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith("/")
    assert env["PYTHONPATH"] == "/opt/microcheckpoint"
    assert env["MICROCHECKPOINT_S3_ENDPOINT"] == "http://minio:9000"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        assert env.get(name), f"{name} in {service_name}"


def test_connections_point_at_the_services_of_the_stack(
    services: dict[str, dict[str, Any]],
    connections: dict[str, dict[str, Any]],
    env_example: dict[str, str],
) -> None:
    storage = connections["AIRFLOW_CONN_MICROCHECKPOINT_STORAGE"]
    assert storage["login"] == env_example["MINIO_ROOT_USER"]
    assert storage["password"] == env_example["MINIO_ROOT_PASSWORD"]
    assert storage["extra"] == {"endpoint_url": "http://minio:9000", "region_name": "us-east-1"}
    minio_words = command_words(services["minio"])
    assert option(minio_words, "--address") == ":9000"

    kafka = connections["AIRFLOW_CONN_MICROCHECKPOINT_KAFKA"]
    assert kafka["extra"] == {"bootstrap.servers": "kafka:9092"}
    advertised = environment(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert "PLAINTEXT://" + kafka["extra"]["bootstrap.servers"] in advertised.split(",")

    api = connections["AIRFLOW_CONN_MICROCHECKPOINT_AIRFLOW_API"]
    assert (api["host"], api["port"], api["schema"]) == ("airflow-api-server", 8080, "http")
    assert (api["login"], api["password"]) == ("admin", env_example["AIRFLOW_ADMIN_PASSWORD"])
    assert api["host"] in services
    assert option(command_words(services["airflow-api-server"]), "--port") == str(api["port"])
    users = environment(services["airflow-api-server"])["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    assert api["login"] in {entry.split(":")[0] for entry in users.split(",")}

    spark = connections["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert (spark["host"], spark["port"]) == ("spark://spark-master", 7077)
    assert spark["extra"] == {"deploy-mode": "client"}
    master_words = command_words(services["spark-master"])
    assert "org.apache.spark.deploy.master.Master" in master_words
    assert option(master_words, "--host") == urlparse(spark["host"]).hostname
    assert option(master_words, "--port") == str(spark["port"])
    worker_words = command_words(services["spark-worker"])
    assert "org.apache.spark.deploy.worker.Worker" in worker_words
    assert f"{spark['host']}:{spark['port']}" in worker_words


def test_airflow_init_migrates_and_writes_the_passwords_file(
    services: dict[str, dict[str, Any]],
) -> None:
    init = services["airflow-init"]
    script = "\n".join(command_words(init))
    assert "airflow db migrate" in script
    assert "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in script
    assert referenced_variables(environment(init)["AIRFLOW_ADMIN_PASSWORD"]) == {
        "AIRFLOW_ADMIN_PASSWORD"
    }
    passwords_file = environment(init)["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    folder = str(Path(passwords_file).parent)
    for name in AIRFLOW_SERVICES:
        mounts = services[name].get("volumes", [])
        assert any(str(m).split(":")[1] == folder for m in mounts), f"{name} lacks {folder}"


def test_the_bucket_of_the_storage_and_the_sink_is_created(
    services: dict[str, dict[str, Any]],
) -> None:
    env = environment(services["airflow-scheduler"])
    buckets = {urlparse(env[name]).netloc for name in ("MICROCHECKPOINT_STORAGE", "WORDCOUNT_SINK")}
    assert buckets == {"microcheckpoint"}
    script = "\n".join(command_words(services["minio-init"]))
    assert re.search(r"mc mb .*\S+/microcheckpoint\b", script), script


def test_depends_on_refers_to_services_with_the_needed_checks(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    one_shot = {"minio-init", "airflow-init"}
    for name, service in services.items():
        for dependency, spec in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
            elif condition == "service_completed_successfully":
                assert dependency in one_shot, f"{dependency} is not a one-shot service"
            else:
                pytest.fail(f"unexpected condition {condition} in {name}")
    for name in REQUIRED_SERVICES - one_shot:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    scheduler = services["airflow-scheduler"]["depends_on"]
    assert scheduler["airflow-init"]["condition"] == "service_completed_successfully"
    assert scheduler["minio-init"]["condition"] == "service_completed_successfully"
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for mount in service.get("volumes", []):
            source = str(mount).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
    for name in ("kafka", "minio", "postgres"):
        assert any(str(m).split(":")[0] in declared for m in services[name]["volumes"])


def test_every_variable_is_defined_in_env_example(env_example: dict[str, str]) -> None:
    used = referenced_variables(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert used, "the compose file reads no variables at all"
    undefined = used - set(env_example)
    assert not undefined, f"not in {ENV_EXAMPLE.name}: {sorted(undefined)}"
    unused = set(env_example) - used
    assert not unused, f"in {ENV_EXAMPLE.name} but never read: {sorted(unused)}"
    assert "AIRFLOW_FERNET_KEY" in env_example
    assert "Fernet.generate_key" in ENV_EXAMPLE.read_text(encoding="utf-8")


def test_interpolation_helper_follows_compose_rules() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert interpolate("$${A}-${A}-$A", env) == "${A}-x-x"
    assert interpolate("${MISSING:-d}/${EMPTY:-e}", env) == "d/e"
    with pytest.raises(AssertionError, match="MISSING"):
        interpolate("${MISSING:?set it}", env)
    assert referenced_variables("$${NOT_ME} ${ME:?x} $ALSO") == {"ME", "ALSO"}


# -- the images ---------------------------------------------------------------------------------


def test_every_build_dockerfile_exists_relative_to_its_context(
    services: dict[str, dict[str, Any]],
) -> None:
    built = {name: s for name, s in services.items() if "build" in s}
    assert {"spark-master", "spark-worker"} | AIRFLOW_SERVICES <= set(built)
    for name, service in built.items():
        context = (COMPOSE_FILE.parent / service["build"]["context"]).resolve()
        assert context == ROOT, f"{name} builds from {context}, not the repository root"
        assert dockerfile_of(service).is_file(), f"{name}: {dockerfile_of(service)} is missing"
        for source in dockerfile_copies(dockerfile_of(service)).values():
            assert (context / source).exists(), f"{dockerfile_of(service).name} copies {source}"


def test_dags_and_plugins_folders_are_inside_the_copied_repository(
    services: dict[str, dict[str, Any]],
) -> None:
    dockerfile = DOCKER / "airflow.Dockerfile"
    copies = dockerfile_copies(dockerfile)
    package_dest = next(
        dest for dest, src in copies.items() if src.rstrip("/") == "microcheckpoint"
    )
    project = str(Path(package_dest).parent)
    assert project == "/opt/microcheckpoint"
    assert copies[f"{project}/pyproject.toml"] == "pyproject.toml"
    assert f"pip install --no-cache-dir --no-deps -e {project}" in run_commands(dockerfile)
    for name in AIRFLOW_SERVICES:
        env = environment(services[name])
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{project}/dags"
        # The plugin is the installed package's entry point, not a plugins folder.
        assert "AIRFLOW__CORE__PLUGINS_FOLDER" not in env
        assert env["PYTHONPATH"] == project
    assert copies[f"{project}/dags"] == "dags"
    assert copies[f"{project}/microcheckpoint_airflow"] == "microcheckpoint_airflow"
    assert copies[f"{project}/examples"] == "examples"
    assert copies[f"{project}/spark_jobs"] == "spark_jobs"
    assert dockerfile_env(dockerfile)["PYTHONPATH"] == project

    spark_dockerfile = DOCKER / "spark.Dockerfile"
    spark_copies = dockerfile_copies(spark_dockerfile)
    for folder in ("microcheckpoint", "examples", "spark_jobs"):
        assert spark_copies[f"{project}/{folder}"] == folder
    assert dockerfile_env(spark_dockerfile)["PYTHONPATH"] == project


def test_dockerfiles_install_the_pins_of_requirements_txt() -> None:
    pins = requirement_pins()
    airflow, pyspark = pins["apache-airflow"], pins["pyspark"]

    airflow_file = DOCKER / "airflow.Dockerfile"
    instructions = dockerfile_instructions(airflow_file)
    base = [args for keyword, args in instructions if keyword == "FROM"]
    assert base == [f"apache/airflow:{airflow}-python3.11"]
    runs = run_commands(airflow_file)
    assert f'"apache-airflow=={airflow}" -r /opt/microcheckpoint/requirements.txt' in runs
    assert f'--no-deps --force-reinstall "pyspark=={pyspark}"' in runs
    assert f'pyspark.__version__)\')" = "{pyspark}"' in runs
    # The reinstall comes after every other pip install that could bring pyspark-client back.
    pip_runs = [
        args for keyword, args in instructions if keyword == "RUN" and "pip install" in args
    ]
    assert "--force-reinstall" in pip_runs[-1]
    assert "openjdk-17-jre-headless" in runs

    spark_file = DOCKER / "spark.Dockerfile"
    spark_runs = run_commands(spark_file)
    assert [a for k, a in dockerfile_instructions(spark_file) if k == "FROM"] == [
        "python:3.11-slim-bookworm"
    ]
    assert "-r /tmp/executor-requirements.txt" in spark_runs
    assert "/opt/microcheckpoint/requirements.txt" in spark_runs
    assert f'--no-deps --force-reinstall "pyspark=={pyspark}"' in spark_runs
    assert f'pyspark.__version__)\')" = "{pyspark}"' in spark_runs
    assert "openjdk-17-jre-headless" in spark_runs


def test_driver_and_executors_run_the_same_python_and_spark(
    services: dict[str, dict[str, Any]],
) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'requires-python = ">=3.11,<3.12"' in pyproject
    spark_env = dockerfile_env(DOCKER / "spark.Dockerfile")
    airflow_env = dockerfile_env(DOCKER / "airflow.Dockerfile")
    assert spark_env["SPARK_HOME"] == "/usr/local/lib/python3.11/site-packages/pyspark"
    assert airflow_env["SPARK_HOME"].endswith("/lib/python3.11/site-packages/pyspark")
    assert spark_env["PYSPARK_PYTHON"] == airflow_env["PYSPARK_PYTHON"] == "python3.11"
    for name in AIRFLOW_SERVICES | {"spark-master", "spark-worker"}:
        assert environment(services[name])["PYSPARK_PYTHON"] == "python3.11", name
    worker_env = environment(services["spark-worker"])
    assert worker_env["MICROCHECKPOINT_S3_ENDPOINT"] == "http://minio:9000"
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(worker_env)
    assert command_words(services["spark-master"])[0] == "spark-class"
    assert command_words(services["spark-worker"])[0] == "spark-class"

# shellcheck shell=bash
# Sourced by scripts/install, test, demo, services and .ci/run: the one place that says which
# Python the project runs on.
#
# scripts/install installs into ${PYTHON:-python3} when pip may install into it (a virtualenv,
# or a Python with pip that is not externally managed: pyenv, conda). Otherwise (Debian's own
# python3: no pip, EXTERNALLY-MANAGED) it creates .venv in the repo and installs there; from
# then on .venv is the project's Python.

SNAPSHOTTER_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SNAPSHOTTER_VENV=$SNAPSHOTTER_REPO/.venv

# Print the project's Python: the repo's .venv if there is one, else ${PYTHON:-python3}.
project_python() {
  if [ -x "$SNAPSHOTTER_VENV/bin/python" ]; then
    printf '%s\n' "$SNAPSHOTTER_VENV/bin/python"
  else
    printf '%s\n' "${PYTHON:-python3}"
  fi
}

# The Apache Kafka broker scripts/services runs locally (no Docker): this version's jars from
# Maven Central (org.apache.kafka:kafka_2.13), provisioned once by scripts/kafka-jars into
# kafka_jars_dir, started with the machine's Java (>= 17). docker-compose.yml's kafka image
# carries the same version.
SNAPSHOTTER_KAFKA_VERSION=4.3.1

kafka_jars_dir() {
  printf '%s\n' "${SNAPSHOTTER_JARS:-$HOME/.cache/snapshotter/jars}/kafka-$SNAPSHOTTER_KAFKA_VERSION"
}

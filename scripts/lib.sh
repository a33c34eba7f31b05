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

# The servers of other versions (scripts/postgres-binaries, scripts/mariadb-binaries): one
# jar each from Maven Central (or SNAPSHOTTER_MAVEN_URL), pinned by release and SHA-1 in a
# table of "version release sha1" lines, kept under ${SNAPSHOTTER_JARS:-~/.cache/snapshotter/jars}.

# pinned_release PINS VERSION: "release sha1" of VERSION, or nothing.
pinned_release() {
  printf '%s\n' "$1" | awk -v v="$2" '$1 == v {print $2, $3}'
}

# pinned_versions PINS: the versions the table pins, on one line.
pinned_versions() {
  printf '%s\n' "$1" | awk '{print $1}' | paste -sd' '
}

# fetch_pinned_jar NAME ARTIFACT_PATH RELEASE SHA1 CACHE_SUBDIR: the path of the artifact's
# jar for RELEASE, downloaded once and checked against SHA1 (the pin, not the server's file).
# Prints the path; on failure says why on stderr and returns 1.
fetch_pinned_jar() {
  local name=$1 artifact=$2 release=$3 sha1=$4 subdir=$5
  local maven=${SNAPSHOTTER_MAVEN_URL:-https://repo1.maven.org/maven2}
  local cache=${SNAPSHOTTER_JARS:-$HOME/.cache/snapshotter/jars}/$subdir
  local file="${artifact##*/}-$release.jar"
  local jar=$cache/$file url=$maven/$artifact/$release/$file got
  mkdir -p "$cache"
  if [ ! -f "$jar" ] || [ "$(sha1sum "$jar" | cut -d' ' -f1)" != "$sha1" ]; then
    printf '%s: downloading %s from %s\n' "$name" "$release" "$url" >&2
    if ! curl -fsSL --retry 3 -o "$jar.part" "$url"; then
      printf '%s: could not download %s (set SNAPSHOTTER_MAVEN_URL to a mirror, or put the jar at %s)\n' \
        "$name" "$url" "$jar" >&2
      return 1
    fi
    got=$(sha1sum "$jar.part" | cut -d' ' -f1)
    if [ "$got" != "$sha1" ]; then
      rm -f "$jar.part"
      printf '%s: %s has SHA-1 %s, not the pinned %s\n' "$name" "$url" "$got" "$sha1" >&2
      return 1
    fi
    mv "$jar.part" "$jar"
  fi
  printf '%s\n' "$jar"
}

# shellcheck shell=bash
# Sourced by scripts/services: the `spark` service. A standalone Spark cluster (one master,
# two workers of one core each) and a Spark Connect server whose applications run on it, all
# from the installed pyspark's own distribution (bin/spark-class, jars/spark-connect_*.jar)
# and the machine's Java, on 127.0.0.1. With Docker, docker-compose.yml's spark-* services.
#
#   SNAPSHOTTER_STANDALONE_PORT   the master (default 27077; its web UI: 28080, JSON at /json/)
#   SNAPSHOTTER_CONNECT_PORT  the Spark Connect server (default 25002)
#   SNAPSHOTTER_STANDALONE_WORKER_MEMORY each worker's memory for executors (default 1g)
#   SNAPSHOTTER_STANDALONE_MASTER        use this cluster (spark://HOST:PORT) instead of starting one
#   SNAPSHOTTER_CONNECT_URL        use this Connect server (sc://HOST:PORT) instead of ours
#
# `up spark` prints the master URL; `url spark-connect` prints the Connect URL. The workers and
# the Connect server share this machine's file system, which is what lets a landing and its
# staging be local paths; a cluster elsewhere needs shared storage (docs/scaling.md).

SP_PORT=${SNAPSHOTTER_STANDALONE_PORT:-27077}
SP_UI_PORT=${SNAPSHOTTER_STANDALONE_UI_PORT:-28080}
SC_PORT=${SNAPSHOTTER_CONNECT_PORT:-25002}
SP_WORKER_MEMORY=${SNAPSHOTTER_STANDALONE_WORKER_MEMORY:-1g}
SP_WORKERS=2
SP_DIR=$DIR/spark
SP_MARK=$SP_DIR/started-by

spark_master_url() {
  if [ -n "${SNAPSHOTTER_STANDALONE_MASTER:-}" ]; then printf '%s\n' "$SNAPSHOTTER_STANDALONE_MASTER"; return; fi
  printf 'spark://127.0.0.1:%s\n' "$SP_PORT"
}

spark_connect_url() {
  if [ -n "${SNAPSHOTTER_CONNECT_URL:-}" ]; then printf '%s\n' "$SNAPSHOTTER_CONNECT_URL"; return; fi
  printf 'sc://127.0.0.1:%s\n' "$SC_PORT"
}

spark_url() { spark_master_url >&3; }
spark-connect_url() { spark_connect_url >&3; }

# pyspark's distribution: bin/spark-class, jars/ (the project's Python has pyspark installed).
spark_home() {
  local home
  home=$("$(project_python)" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null) \
    || die "pyspark does not import with $(project_python): run scripts/install first"
  [ -x "$home/bin/spark-class" ] || die "$home/bin/spark-class is missing: pyspark's distribution is incomplete"
  printf '%s\n' "$home"
}

# How many workers the master counts as ALIVE (its web UI's JSON), or nothing if it does not
# answer.
spark_alive_workers() {
  "$(project_python)" - "$SP_UI_PORT" 2>/dev/null <<'PY'
import json, sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=3) as r:
    print(json.load(r).get("aliveworkers", 0))
PY
}

spark_ready() { [ "$(spark_alive_workers || true)" = "$SP_WORKERS" ] && port_taken "$SC_PORT"; }

# The pid of the daemon whose command line holds $1 (a class name) and $2 (an argument only
# ours carries), if it runs.
spark_pid() {
  local pidfile=$SP_DIR/$1.pid pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "$2" || return 1
  printf '%s\n' "$pid"
}

# Start one daemon detached (setsid, as the other servers); $1: its name (pid file, log),
# the rest: the command.
spark_start() {
  local name=$1 pid; shift
  pid=$(cd / && exec setsid "$@" </dev/null >>"$SP_DIR/$name.log" 2>&1 3>&- 9>&- & echo $!)
  echo "$pid" >"$SP_DIR/$name.pid"
}

spark_wait() { # $1: seconds, $2: what, $3: a command that succeeds when ready, $4: its daemon
  local deadline=$((SECONDS + $1)) pid
  pid=$(cat "$SP_DIR/$4.pid")
  until eval "$3"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$SP_DIR/$4.log" >&2 || true
      die "Spark: $2 exited at start (log: $SP_DIR/$4.log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$SP_DIR"/*.log >&2 || true
      die "Spark: $2 not ready after $1 s (logs in $SP_DIR)"
    fi
    sleep 1
  done
}

spark_up() {
  if [ -n "${SNAPSHOTTER_STANDALONE_MASTER:-}" ]; then
    say "services: using SNAPSHOTTER_STANDALONE_MASTER; not starting Spark"
    spark_url; return
  fi
  if use_docker; then spark_up_docker; return; fi
  local home java
  home=$(spark_home); java=$(kafka_java)
  mkdir -p "$SP_DIR"
  # The daemons' own environment: small heaps (the executors get the workers' memory), the
  # project's Python for Python tasks on executors, loopback only.
  export SPARK_HOME=$home JAVA_HOME=${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v "$java")")")")}
  export SPARK_LOCAL_IP=127.0.0.1 SPARK_DAEMON_MEMORY=256m SPARK_LOG_DIR=$SP_DIR
  export SPARK_CONF_DIR=$SP_DIR/conf SPARK_NO_DAEMONIZE=1
  export PYSPARK_PYTHON; PYSPARK_PYTHON=$(command -v "$(project_python)")
  mkdir -p "$SPARK_CONF_DIR"
  local master_id="--port $SP_PORT"
  if ! spark_pid master "$master_id" >/dev/null; then
    local port
    for port in "$SP_PORT" "$SP_UI_PORT"; do
      port_taken "$port" && die "port $port is in use by a server this script did not start; stop \
it or set SNAPSHOTTER_STANDALONE_PORT / SNAPSHOTTER_STANDALONE_UI_PORT"
    done
    echo local >"$SP_MARK"
    say "services: starting a Spark master on 127.0.0.1:$SP_PORT (web UI $SP_UI_PORT; logs: $SP_DIR)"
    spark_start master "$home/bin/spark-class" org.apache.spark.deploy.master.Master \
      --host 127.0.0.1 $master_id --webui-port "$SP_UI_PORT"
    spark_wait 60 "the master" 'spark_alive_workers >/dev/null' master
  fi
  local i
  for i in $(seq 1 "$SP_WORKERS"); do
    if ! spark_pid "worker$i" "$SP_DIR/work$i" >/dev/null; then
      say "services: starting Spark worker $i (1 core, $SP_WORKER_MEMORY)"
      mkdir -p "$SP_DIR/work$i"
      spark_start "worker$i" "$home/bin/spark-class" org.apache.spark.deploy.worker.Worker \
        --host 127.0.0.1 --cores 1 --memory "$SP_WORKER_MEMORY" --webui-port 0 \
        --work-dir "$SP_DIR/work$i" "spark://127.0.0.1:$SP_PORT"
    fi
  done
  spark_wait 60 "$SP_WORKERS workers" '[ "$(spark_alive_workers || true)" = "$SP_WORKERS" ]' worker1
  if ! spark_pid connect "spark.connect.grpc.binding.port=$SC_PORT" >/dev/null; then
    port_taken "$SC_PORT" && die "port $SC_PORT is in use by a server this script did not start; \
stop it or set SNAPSHOTTER_CONNECT_PORT"
    say "services: starting a Spark Connect server on 127.0.0.1:$SC_PORT (its applications run on the cluster)"
    # Executors only while it has work (dynamic allocation: idle ones go after 15 s, and
    # ones holding shuffle or cached data after 30 s; without those two timeouts they stay
    # forever), so the Connect server does not hold the cluster's two cores from other
    # applications (the engine's own, in cluster mode).
    # Its driver is an application, not a daemon: SPARK_DAEMON_MEMORY must not size it (Spark
    # refuses a driver under 450 MB).
    # Delta's and Iceberg's jars and SQL extensions, where scripts/spark-jars provisioned
    # them: a Connect session cannot load jars or static settings itself, and the landing
    # formats need both (MERGE INTO, Iceberg's procedures, Delta's catalog).
    local formats=() formats_jars
    formats_jars=$("$PYSPARK_PYTHON" - 2>/dev/null <<'PY' || true
from snapshotter.sinks.spark.jars import delta_jars, iceberg_jars
print(",".join(str(j) for j in delta_jars() + iceberg_jars()))
PY
)
    if [ -n "$formats_jars" ]; then
      formats=(--jars "$formats_jars"
        --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension,org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions
        --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog
        --conf spark.databricks.delta.schema.autoMerge.enabled=true)
    else
      say "services: Delta's and Iceberg's jars are not provisioned (scripts/spark-jars): the Connect server lands Parquet only"
    fi
    spark_start connect env -u SPARK_DAEMON_MEMORY "$home/bin/spark-submit" \
      --class org.apache.spark.sql.connect.service.SparkConnectServer \
      --name "snapshotter Spark Connect" --master "spark://127.0.0.1:$SP_PORT" \
      --driver-memory 1g --executor-memory 512m \
      --conf "spark.connect.grpc.binding.port=$SC_PORT" \
      --conf spark.connect.grpc.binding.address=127.0.0.1 \
      --conf spark.driver.host=127.0.0.1 --conf spark.driver.bindAddress=127.0.0.1 \
      --conf spark.ui.enabled=false \
      --conf spark.dynamicAllocation.enabled=true \
      --conf spark.dynamicAllocation.shuffleTracking.enabled=true \
      --conf spark.dynamicAllocation.minExecutors=0 \
      --conf spark.dynamicAllocation.executorIdleTimeout=15s \
      --conf spark.dynamicAllocation.shuffleTracking.timeout=30s \
      --conf spark.dynamicAllocation.cachedExecutorIdleTimeout=30s \
      --conf spark.sql.session.timeZone=UTC \
      --conf "spark.pyspark.python=$PYSPARK_PYTHON" \
      "${formats[@]}" \
      spark-internal
    spark_wait 90 "the Spark Connect server" 'port_taken "$SC_PORT"' connect
  fi
  spark_url
}

spark_up_docker() {
  say "services: starting Spark (master, 2 workers, Connect) from docker-compose.yml"
  local running
  if running=$(compose ps --status running -q spark-master 2>/dev/null) && [ -z "$running" ]; then
    mkdir -p "$SP_DIR"; echo docker >"$SP_MARK"
  fi
  compose up -d --wait spark-master spark-worker-1 spark-worker-2 spark-connect \
    || die "docker compose up failed (docker compose logs spark-master)"
  spark_url
}

spark_down() {
  if [ ! -f "$SP_MARK" ]; then
    say "services: spark was not started by this script; leaving it alone"
    return
  fi
  case "$(cat "$SP_MARK")" in
    docker) say "services: stopping compose's spark"; compose stop spark-connect spark-worker-1 spark-worker-2 spark-master ;;
    local)
      local name pid deadline
      for name in connect $(seq -f 'worker%g' 1 "$SP_WORKERS") master; do
        local mark="--port $SP_PORT"
        case $name in connect) mark=SparkConnectServer ;; worker*) mark="$SP_DIR/work${name#worker}" ;; esac
        if pid=$(spark_pid "$name" "$mark"); then
          say "services: stopping Spark $name"
          kill -TERM "$pid" 2>/dev/null || true
          deadline=$((SECONDS + 60))
          while kill -0 "$pid" 2>/dev/null; do
            if [ "$SECONDS" -ge "$deadline" ]; then kill -KILL "$pid" 2>/dev/null || true; break; fi
            sleep 1
          done
        fi
        rm -f "$SP_DIR/$name.pid"
      done ;;
  esac
  rm -f "$SP_MARK"
}

spark_status() {
  local who="not started by this script"
  [ -f "$SP_MARK" ] && who="started by this script ($(cat "$SP_MARK"), $SP_DIR)"
  local alive; alive=$(spark_alive_workers || true)
  if [ -n "$alive" ]; then
    say "spark: master up at $(spark_master_url) with ${alive} alive workers; Connect at \
$(spark_connect_url) $(port_taken "$SC_PORT" && echo up || echo down), $who"
  else
    say "spark: down, $who"
  fi
}

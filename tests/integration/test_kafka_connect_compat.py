"""The Kafka sink's messages, read by Kafka Connect's real JsonConverter (Java).

A consumer written for Debezium reads a topic through ``JsonConverter``: with
``schemas.enable=true`` every key and value must become a Connect ``Struct`` whose fields have
the Java types of the declared schema (``Integer`` for int32, ``byte[]`` decoded from base64,
...); with ``schemas.enable=false`` they become plain Maps. ``java/ConnectRead.java`` does
exactly that for every message of a topic and prints what it got, one JSON line per message;
these tests snapshot a table of many column types into Kafka (READ events), then update,
delete and insert (u, d + tombstone, c) and check what the converter made of each message,
and that the topic read back as ``snapshotter verify`` does it is the table.

Two limitations of JsonConverter itself are documented rather than worked around: with
schemas it reads the strings "NaN", "Infinity", "-Infinity" of a float column as 0.0 (Connect's
own fromConnectData writes those strings too), and without schemas it reads an integer past
the long range (bigint unsigned) as a wrapped Long.

The Java side needs ``javac``/``java`` (17+) and the Kafka jars ``scripts/kafka-jars``
provisions (kafka-clients, connect-api, connect-json); without them the tests skip, and with
CI=true they fail.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, REPO
from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration

JAVA_SOURCE = Path(__file__).resolve().parent / "java" / "ConnectRead.java"
Message = dict[str, Any]
Reader = Callable[[str, str, str], list[Message]]


def _unavailable(detail: str) -> None:
    message = f"the JsonConverter reader cannot run: {detail}"
    if IN_CI:
        pytest.fail(message + " (CI=true: integration tests never skip)", pytrace=False)
    pytest.skip(message)


def kafka_jars_dir() -> Path:
    """Where scripts/kafka-jars puts the Kafka jars (scripts/lib.sh's kafka_jars_dir)."""
    found = subprocess.run(
        ["bash", "-c", '. "$1" && kafka_jars_dir', "bash", str(REPO / "scripts" / "lib.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return Path(found.stdout.strip())


def _java_tool(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    return shutil.which(name)


@pytest.fixture(scope="session")
def connect_read(tmp_path_factory: pytest.TempPathFactory) -> Reader:
    """ConnectRead.java compiled against the provisioned Kafka jars: a function of
    (bootstrap, topic, "schemas" | "plain") returning its lines, parsed; it fails the test
    when the reader exits non-zero (a message the converter could not convert)."""
    javac, java = _java_tool("javac"), _java_tool("java")
    if javac is None or java is None:
        _unavailable("no javac/java (JDK 17+; Debian: apt-get install openjdk-17-jdk-headless)")
    assert javac is not None and java is not None
    jars = kafka_jars_dir()
    needed = ["kafka-clients", "connect-api", "connect-json"]
    missing = [n for n in needed if not any(jars.glob(f"{n}-*.jar"))]
    if missing:
        _unavailable(f"{', '.join(missing)} jars are not in {jars}: run scripts/kafka-jars")
    classes = tmp_path_factory.mktemp("connect-read")
    classpath = f"{jars}/*"
    compiled = subprocess.run(
        [javac, "-d", str(classes), "-cp", classpath, str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert compiled.returncode == 0, f"javac failed:\n{compiled.stdout}{compiled.stderr}"

    def read(bootstrap: str, topic: str, mode: str) -> list[Message]:
        command = [java, "-cp", f"{classes}{os.pathsep}{classpath}", "ConnectRead"]
        result = subprocess.run(
            [*command, bootstrap, topic, mode],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, (
            f"ConnectRead {mode} exited {result.returncode}:\n{result.stderr[-6000:]}"
        )
        return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]

    return read


def message_count(bootstrap: str, topic: str) -> int:
    """How many messages ``topic`` holds (end minus beginning offsets, every partition)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        assert parts, f"topic {topic} has no partitions"
        begin, end = consumer.beginning_offsets(parts), consumer.end_offsets(parts)
        return sum(end[tp] - begin[tp] for tp in parts)
    finally:
        consumer.close()


# --- what the converter returned ------------------------------------------------------------


def children(node: dict[str, Any] | None) -> dict[str, Any]:
    """A Struct's fields or a Map's entries, by name."""
    assert node is not None
    found = node.get("fields", node.get("entries"))
    assert found is not None, f"not a Struct or Map: {node}"
    return dict(found)


def row_of(message: Message, which: str) -> dict[str, Any] | None:
    """The ``before``/``after`` node's fields (None when the payload has null there)."""
    node = children(message["value"])[which]
    if node is None or node.get("class") is None:
        return None
    return children(node)


def classes(fields: dict[str, Any]) -> dict[str, str | None]:
    return {name: (node or {}).get("class") for name, node in fields.items()}


def values(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: (node or {}).get("value") for name, node in fields.items()}


def key_value(message: Message) -> Any:
    return values(children(message["key"]))


def check_stream(messages: list[Message], expected_count: int) -> dict[str, list[Message]]:
    """Every message converted, each delete followed in its partition by a tombstone of the
    same key; the messages by op."""
    assert len(messages) == expected_count, (len(messages), expected_count)
    by_op: dict[str, list[Message]] = {}
    partitions: dict[int, list[Message]] = {}
    for msg in sorted(messages, key=lambda m: (m["partition"], m["offset"])):
        partitions.setdefault(msg["partition"], []).append(msg)
        if msg["tombstone"]:
            assert msg["value"] is None and msg["op"] is None, msg
            by_op.setdefault("tombstone", []).append(msg)
        else:
            by_op.setdefault(msg["op"], []).append(msg)
    for stream in partitions.values():
        for i, msg in enumerate(stream):
            if msg["op"] == "d":
                assert i + 1 < len(stream), f"no message after the delete {msg}"
                after = stream[i + 1]
                assert after["tombstone"], f"a delete not followed by a tombstone: {after}"
                assert key_value(after) == key_value(msg)
    return by_op


def snapshot_then_change(cap: Capture, table: str, *statements: str) -> None:
    """Snapshot ``table`` (READ events), then run ``statements`` (say an update, a delete and
    an insert: u, d + tombstone, c) and read the log to its end."""
    cap.init()
    cap.execute(f"{cap.schema}.{table}")
    assert cap.run(timeout=180) == 0
    if statements:
        for statement in statements:
            cap.sql(statement.replace("{s}", cap.schema))
        assert cap.run(timeout=180) == 0


def converted(
    cap: Capture,
    bootstrap: str,
    connect_read: Reader,
    schemas: bool,
    table: str,
    *,
    mismatches: list[dict[str, Any]] | None = None,
) -> dict[str, list[Message]]:
    """The table's topic read through JsonConverter and checked (:func:`check_stream`): no
    payload value of another JSON type than its schema declares, unless ``mismatches`` is
    given (a list, which gets them); and read back by ``snapshotter verify``, it is the
    table."""
    topic = cap.topic(table)
    messages = connect_read(bootstrap, topic, "schemas" if schemas else "plain")
    found = [m for msg in messages for m in msg["mismatches"]]
    if mismatches is None:
        assert not found, found[:5]
    else:
        mismatches.extend(found)
    by_op = check_stream(messages, message_count(bootstrap, topic))
    verdict = cap.verify(table)
    assert verdict.ok, verdict.render()
    return by_op


def kafka_capture(make: Callable[..., Capture], bootstrap: str, schemas: bool) -> Capture:
    return make(sink="kafka", kafka_bootstrap=bootstrap, kafka_partitions=2, kafka_schemas=schemas)


def counts(by_op: dict[str, list[Message]]) -> dict[str, int]:
    return {op: len(messages) for op, messages in by_op.items()}


def reads_by_id(by_op: dict[str, list[Message]]) -> dict[Any, dict[str, Any]]:
    """The READ events' ``after`` fields, by the row's ``id``."""
    rows = [row_of(m, "after") for m in by_op["r"]]
    return {row["id"]["value"]: row for row in rows if row is not None}


MODES = pytest.mark.parametrize("schemas", [True, False], ids=["schemas", "plain"])


# --- PostgreSQL -----------------------------------------------------------------------------

PG_TABLE = """
CREATE TABLE {s}.typed (
    id integer PRIMARY KEY,
    t text NOT NULL,
    j jsonb,
    b bytea,
    tstz timestamptz,
    ts timestamp,
    d date,
    n numeric(10,2),
    flag boolean,
    sm smallint,
    bg bigint,
    u uuid,
    tm time,
    dp double precision,
    r real,
    maybe text
);
ALTER TABLE {s}.typed REPLICA IDENTITY FULL
"""
PG_ROWS = """
INSERT INTO {s}.typed VALUES
 (1, 'one', '{"a": 1, "l": [1, null, "x"]}', '\\x00ff10627974657300'::bytea,
  '2024-05-06 07:08:09.123456+02', '2024-05-06 07:08:09.5', '2024-05-06', 12.34, true,
  -32768, 9007199254740993, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '13:14:15.25', 2.5, 1.25,
  'here'),
 (2, 'two', '[1, 2]', '\\x'::bytea, '1999-12-31 23:59:59+00', '1999-12-31 23:59:59',
  '1999-12-31', -0.01, false, 32767, -9223372036854775808,
  '00000000-0000-0000-0000-000000000000', '00:00:00', -1e300, -3.5, 'there'),
 (3, 'nulls', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, 'é ✓ "quoted"', '"a string"', '\\xdeadbeef'::bytea, '2024-01-01 00:00:00+00',
  '2024-01-01 00:00:00', '2024-01-01', 99999999.99, true, 0, 0,
  'ffffffff-ffff-ffff-ffff-ffffffffffff', '23:59:59.999999', 0.1, 3.4028235e38, NULL)
"""
PG_CHANGES = (
    "UPDATE {s}.typed SET t = 'one, updated', b = '\\x0102'::bytea, maybe = NULL WHERE id = 1",
    "DELETE FROM {s}.typed WHERE id = 2",
    "INSERT INTO {s}.typed (id, t, j, b, sm, bg, flag, dp, r) "
    "VALUES (5, 'five', '{\"new\": true}', '\\x05'::bytea, 5, 5, false, -0.5, 0.75)",
)

# The Java classes JsonConverter gives the columns of a row without NULLs.
PG_CLASSES_SCHEMAS = {
    "id": "Integer",
    "t": "String",
    "j": "String",
    "b": "byte[]",
    "tstz": "String",
    "ts": "String",
    "d": "String",
    "n": "String",
    "flag": "Boolean",
    "sm": "Short",
    "bg": "Long",
    "u": "String",
    "tm": "String",
    "dp": "Double",
    "r": "Float",
    "maybe": "String",
}
PG_SCHEMA_TYPES = {
    "id": ("INT32", None),
    "t": ("STRING", None),
    "j": ("STRING", "io.debezium.data.Json"),
    "b": ("BYTES", None),
    "tstz": ("STRING", "io.debezium.time.ZonedTimestamp"),
    "ts": ("STRING", "io.debezium.time.IsoTimestamp"),
    "d": ("STRING", "io.debezium.time.IsoDate"),
    "n": ("STRING", None),
    "flag": ("BOOLEAN", None),
    "sm": ("INT16", None),
    "bg": ("INT64", None),
    "u": ("STRING", "io.debezium.data.Uuid"),
    "tm": ("STRING", "io.debezium.time.IsoTime"),
    "dp": ("FLOAT64", None),
    "r": ("FLOAT32", None),
    "maybe": ("STRING", None),
}
# Schemaless: JSON integers are Longs, objects Maps, arrays Lists; bytes stay base64 text.
PG_CLASSES_PLAIN = {
    **{name: "String" for name in PG_CLASSES_SCHEMAS},
    "id": "Long",
    "j": "HashMap",
    "flag": "Boolean",
    "sm": "Long",
    "bg": "Long",
    "dp": "Double",
    "r": "Double",
}
ROW1_BYTES = bytes.fromhex("00ff10627974657300")


@MODES
def test_postgres_messages_convert_with_the_json_converter(
    capture: Callable[..., Capture], kafka_bootstrap: str, connect_read: Reader, schemas: bool
) -> None:
    """A snapshot (r), an update (u), a delete (d, then a tombstone) and an insert (c) of a
    table of many PostgreSQL types: JsonConverter converts every key and value, and the
    fields have the Java classes of the declared schema."""
    cap = kafka_capture(capture, kafka_bootstrap, schemas)
    cap.sql(PG_TABLE.replace("{s}", cap.schema))
    cap.sql(PG_ROWS.replace("{s}", cap.schema))
    snapshot_then_change(cap, "typed", *PG_CHANGES)
    by_op = converted(cap, kafka_bootstrap, connect_read, schemas, "typed")
    assert counts(by_op) == {"r": 4, "u": 1, "d": 1, "tombstone": 1, "c": 1}
    reads = reads_by_id(by_op)
    first, nulls = reads[1], reads[3]
    tombstone = by_op["tombstone"][0]
    assert key_value(tombstone) == {"id": 2}
    envelope = children(by_op["r"][0]["value"])
    source = children(envelope["source"])
    assert source["snapshot"]["value"] == "incremental"
    assert envelope["op"]["class"] == "String"

    if schemas:
        topic = cap.topic("typed")
        assert by_op["r"][0]["value"]["class"] == "Struct"
        assert by_op["r"][0]["value"]["schemaName"] == f"{topic}.Envelope"
        assert tombstone["key"]["class"] == "Struct"
        assert tombstone["key"]["schemaName"] == f"{topic}.Key"
        assert classes(children(tombstone["key"])) == {"id": "Integer"}
        assert classes(first) == PG_CLASSES_SCHEMAS
        declared = {k: (v["schemaType"], v["schemaName"]) for k, v in first.items()}
        assert declared == PG_SCHEMA_TYPES
        # the key is required; every other column optional, NOT NULL t too (a delete's
        # before may hold the key alone: REPLICA IDENTITY DEFAULT)
        assert first["id"]["optional"] is False and first["t"]["optional"] is True
        # a JSON column: an io.debezium.data.Json string holding the document's text
        assert json.loads(first["j"]["value"]) == {"a": 1, "l": [1, None, "x"]}
        assert json.loads(reads[4]["j"]["value"]) == "a string"
        # every nullable column of row 3 is null, with its optional schema
        for name, node in nulls.items():
            if name not in ("id", "t"):
                assert node["class"] is None and node["value"] is None, name
                assert node["optional"] is True, name
        assert (source["ts_ms"]["class"], envelope["ts_ms"]["class"]) == ("Long", "Long")
        assert source["lsn"]["class"] == "Long"
    else:
        assert by_op["r"][0]["value"]["class"] in ("HashMap", "LinkedHashMap")
        assert tombstone["key"]["class"] in ("HashMap", "LinkedHashMap")
        assert classes(children(tombstone["key"])) == {"id": "Long"}
        assert classes(first) == PG_CLASSES_PLAIN
        assert classes(children(first["j"])) == {"a": "Long", "l": "ArrayList"}
        assert children(first["j"])["a"]["value"] == 1
        assert [i and i["value"] for i in children(first["j"])["l"]["items"]] == [1, None, "x"]
        for name, node in nulls.items():
            if name not in ("id", "t"):
                assert node is None, name  # a JSON null: no value, no class

    # in both modes: bytes are base64 of the column's very bytes (decoded to byte[] with
    # schemas), the rest as written
    assert base64.b64decode(first["b"]["value"]) == ROW1_BYTES
    assert base64.b64decode(reads[2]["b"]["value"]) == b""
    assert values(first) | {"b": None, "j": None} == {
        "id": 1,
        "t": "one",
        "j": None,
        "b": None,
        "tstz": "2024-05-06T05:08:09.123456Z",
        "ts": "2024-05-06T07:08:09.500000",
        "d": "2024-05-06",
        "n": "12.34",
        "flag": True,
        "sm": -32768,
        "bg": 9007199254740993,  # above 2**53: exact, as a long
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "tm": "13:14:15.250000",
        "dp": 2.5,
        "r": 1.25,
        "maybe": "here",
    }
    assert reads[4]["t"]["value"] == 'é ✓ "quoted"'
    assert reads[2]["bg"]["value"] == -(2**63)
    assert (reads[2]["dp"]["value"], reads[2]["r"]["value"]) == (-1e300, -3.5)
    assert reads[4]["dp"]["value"] == 0.1
    # real's largest finite value: a Float with schemas (Java prints it 3.4028235E38), a
    # Double of the same value without
    assert reads[4]["r"]["value"] == pytest.approx(3.4028235e38, rel=1e-7)
    updated = row_of(by_op["u"][0], "after")
    assert updated is not None and updated["t"]["value"] == "one, updated"
    assert base64.b64decode(updated["b"]["value"]) == b"\x01\x02"
    assert updated["maybe"] is None or updated["maybe"]["value"] is None
    before = row_of(by_op["u"][0], "before")  # REPLICA IDENTITY FULL: the whole old row
    assert before is not None and before["t"]["value"] == "one"
    created = row_of(by_op["c"][0], "after")
    assert created is not None and created["id"]["value"] == 5
    assert (created["dp"]["value"], created["r"]["value"]) == (-0.5, 0.75)
    assert row_of(by_op["d"][0], "after") is None
    deleted = row_of(by_op["d"][0], "before")
    assert deleted is not None and deleted["id"]["value"] == 2
    assert deleted["t"]["value"] == "two"


@MODES
def test_postgres_nan_and_infinity(
    capture: Callable[..., Capture], kafka_bootstrap: str, connect_read: Reader, schemas: bool
) -> None:
    """NaN and infinities are written as the strings "NaN", "Infinity", "-Infinity", as Kafka
    Connect's own JsonConverter.fromConnectData writes them (Jackson quotes non-finite
    numbers). Schemaless, a consumer gets those Strings. With schemas, JsonConverter reads
    them back as 0.0: it calls doubleValue()/floatValue() on the JSON string without a type
    check. That is Connect's own limitation (a message Connect itself wrote reads back the
    same way), documented here, not a bug of the sink: ConnectRead reports the mismatches,
    and snapshotter's own read back (verify) keeps the values."""
    cap = kafka_capture(capture, kafka_bootstrap, schemas)
    cap.sql(f"CREATE TABLE {cap.schema}.odd (id integer PRIMARY KEY, dp float8, r real)")
    cap.sql(
        f"INSERT INTO {cap.schema}.odd VALUES (1, 'NaN', 'NaN'), (2, 'Infinity', 'Infinity'), "
        "(3, '-Infinity', '-Infinity'), (4, 1.5, 1.5)"
    )
    snapshot_then_change(cap, "odd")
    mismatches: list[dict[str, Any]] = []
    reads = reads_by_id(
        converted(cap, kafka_bootstrap, connect_read, schemas, "odd", mismatches=mismatches)
    )
    got = {
        key: tuple((row[c]["class"], row[c]["value"]) for c in ("dp", "r"))
        for key, row in reads.items()
    }
    if schemas:
        assert got == {
            1: (("Double", 0.0), ("Float", 0.0)),
            2: (("Double", 0.0), ("Float", 0.0)),
            3: (("Double", 0.0), ("Float", 0.0)),
            4: (("Double", 1.5), ("Float", 1.5)),
        }
        assert sorted((m["path"], m["declared"], m["payload"]) for m in mismatches) == sorted(
            (f"after.{c}", f"{kind} optional", f'"{text}"')
            for c, kind in (("dp", "FLOAT64"), ("r", "FLOAT32"))
            for text in ("NaN", "Infinity", "-Infinity")
        )
    else:
        assert got == {
            1: (("String", "NaN"), ("String", "NaN")),
            2: (("String", "Infinity"), ("String", "Infinity")),
            3: (("String", "-Infinity"), ("String", "-Infinity")),
            4: (("Double", 1.5), ("Double", 1.5)),
        }
        assert mismatches == []


@MODES
def test_postgres_delete_under_default_replica_identity(
    capture: Callable[..., Capture], kafka_bootstrap: str, connect_read: Reader, schemas: bool
) -> None:
    """A DELETE under REPLICA IDENTITY DEFAULT logs only the key: ``before`` is {"id": 2}.
    Every column outside the key is optional in the row schema, so JsonConverter reads the
    absent NOT NULL column t as null."""
    cap = kafka_capture(capture, kafka_bootstrap, schemas)
    cap.sql(f"CREATE TABLE {cap.schema}.keyed (id integer PRIMARY KEY, t text NOT NULL)")
    # A snapshot needs FULL (TOAST-able t: refused otherwise); the delete comes after DEFAULT.
    cap.sql(f"ALTER TABLE {cap.schema}.keyed REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {cap.schema}.keyed VALUES (1, 'one'), (2, 'two')")
    snapshot_then_change(
        cap,
        "keyed",
        "ALTER TABLE {s}.keyed REPLICA IDENTITY DEFAULT",
        "DELETE FROM {s}.keyed WHERE id = 2",
    )
    by_op = converted(cap, kafka_bootstrap, connect_read, schemas, "keyed")
    assert counts(by_op) == {"r": 2, "d": 1, "tombstone": 1}
    before = row_of(by_op["d"][0], "before")
    assert before is not None and before["id"]["value"] == 2
    assert key_value(by_op["tombstone"][0]) == {"id": 2}
    if schemas:
        assert (before["id"]["optional"], before["t"]["optional"]) == (False, True)
        assert before["t"]["class"] is None and before["t"]["value"] is None
        # the after of a read: t is there, with the same (optional) schema
        first = row_of(by_op["r"][0], "after")
        assert first is not None and first["t"]["optional"] is True
        assert first["t"]["value"] in ("one", "two")
    else:
        assert list(before) == ["id"]


@MODES
def test_postgres_unchanged_toasted_bytea(
    capture: Callable[..., Capture], kafka_bootstrap: str, connect_read: Reader, schemas: bool
) -> None:
    """An UPDATE that leaves a TOASTed bytea unchanged (REPLICA IDENTITY DEFAULT) has no value
    for it: the column holds Debezium's placeholder, with schemas as its bytes (base64 of
    "__debezium_unavailable_value", as Debezium writes it: the column's schema is bytes),
    without as the text. Read back (verify), the row keeps the value it had."""
    cap = kafka_capture(capture, kafka_bootstrap, schemas)
    cap.sql(f"CREATE TABLE {cap.schema}.toasted (id integer PRIMARY KEY, note text, blob bytea)")
    # A snapshot needs FULL (refused otherwise); the update comes after DEFAULT.
    cap.sql(f"ALTER TABLE {cap.schema}.toasted REPLICA IDENTITY FULL")
    # 4800 random bytes: incompressible, so stored out of line (TOAST)
    cap.sql(
        f"INSERT INTO {cap.schema}.toasted SELECT 1, 'old', decode(string_agg(md5(random()::text)"
        ", ''), 'hex') FROM generate_series(1, 300)"
    )
    snapshot_then_change(
        cap,
        "toasted",
        "ALTER TABLE {s}.toasted REPLICA IDENTITY DEFAULT",
        "UPDATE {s}.toasted SET note = 'new' WHERE id = 1",
    )
    by_op = converted(cap, kafka_bootstrap, connect_read, schemas, "toasted")
    assert counts(by_op) == {"r": 1, "u": 1}
    (blob,) = cap.sql(f"SELECT blob FROM {cap.schema}.toasted")[0]
    read = row_of(by_op["r"][0], "after")
    assert read is not None and base64.b64decode(read["blob"]["value"]) == bytes(blob)
    updated = row_of(by_op["u"][0], "after")
    assert updated is not None and updated["note"]["value"] == "new"
    placeholder = "__debezium_unavailable_value"
    if schemas:
        assert updated["blob"]["class"] == "byte[]"
        assert base64.b64decode(updated["blob"]["value"]) == placeholder.encode()
    else:
        assert updated["blob"]["value"] == placeholder


# --- MySQL / MariaDB ------------------------------------------------------------------------

MY_TABLE = (
    "CREATE TABLE {s}.typed (id int PRIMARY KEY, ti tinyint, iu int unsigned, "
    "amount decimal(12,3), dt datetime(6), ts timestamp(6) NULL, j json, "
    "e enum('red','green','blue'), bl blob, note varchar(40) NOT NULL, maybe varchar(10), "
    "fl float, db double, tm time(6))"
)
MY_ROWS = (
    "INSERT INTO {s}.typed VALUES "
    "(1, -128, 4294967295, 123456789.125, '2024-05-06 07:08:09.5', '2024-05-06 07:08:09.123456',"
    " '{\"a\": 1, \"l\": [1, null]}', 'green', UNHEX('00FF1062'), 'one', 'here', 1.25, -1e300,"
    " '-838:59:59'), "
    "(2, 127, 0, -0.001, '1999-12-31 23:59:59', '1999-12-31 23:59:59', '[1, 2]', 'red', '', "
    "'two', 'there', -3.5, 2.5, '13:14:15.25'), "
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'nulls', NULL, NULL, NULL, NULL)"
)
MY_CHANGES = (
    "UPDATE {s}.typed SET note = 'one, updated', bl = UNHEX('0102'), maybe = NULL WHERE id = 1",
    "DELETE FROM {s}.typed WHERE id = 2",
    "INSERT INTO {s}.typed (id, ti, note, e, fl, db, tm) "
    "VALUES (5, 5, 'five', 'blue', 0.5, 0.1, '100:00:00.000001')",
)
MY_SCHEMA_TYPES = {
    "id": ("Integer", "INT32", None),
    "ti": ("Short", "INT16", None),
    "iu": ("Long", "INT64", None),  # one width up for unsigned, as Debezium
    "amount": ("String", "STRING", None),
    "dt": ("String", "STRING", "io.debezium.time.IsoTimestamp"),
    "ts": ("String", "STRING", "io.debezium.time.ZonedTimestamp"),
    "j": ("String", "STRING", "io.debezium.data.Json"),
    "e": ("String", "STRING", "io.debezium.data.Enum"),
    "bl": ("byte[]", "BYTES", None),
    "note": ("String", "STRING", None),
    "maybe": ("String", "STRING", None),
    "fl": ("Float", "FLOAT32", None),
    "db": ("Double", "FLOAT64", None),
    "tm": ("String", "STRING", "io.debezium.time.IsoTime"),  # as MySQL writes a TIME
}
MY_CLASSES_PLAIN = {
    "id": "Long",
    "ti": "Long",
    "iu": "Long",
    "amount": "String",
    "dt": "String",
    "ts": "String",
    "j": "HashMap",
    "e": "String",
    "bl": "String",
    "note": "String",
    "maybe": "String",
    "fl": "Double",
    "db": "Double",
    "tm": "String",
}


@MODES
def test_mysql_messages_convert_with_the_json_converter(
    mysql_capture: Callable[..., Capture],
    kafka_bootstrap: str,
    connect_read: Reader,
    schemas: bool,
) -> None:
    cap = kafka_capture(mysql_capture, kafka_bootstrap, schemas)
    cap.sql(MY_TABLE.replace("{s}", cap.schema))
    cap.sql(MY_ROWS.replace("{s}", cap.schema))
    snapshot_then_change(cap, "typed", *MY_CHANGES)
    by_op = converted(cap, kafka_bootstrap, connect_read, schemas, "typed")
    assert counts(by_op) == {"r": 3, "u": 1, "d": 1, "tombstone": 1, "c": 1}
    reads = reads_by_id(by_op)
    first, nulls = reads[1], reads[3]
    assert key_value(by_op["tombstone"][0]) == {"id": 2}
    # MariaDB's JSON is LONGTEXT (with a json_valid check): its documents are text columns,
    # declared plain strings and written as strings; MySQL's json is a JSON column.
    mariadb = "mariadb" in str(cap.sql("SELECT VERSION()")[0][0]).lower()
    if schemas:
        declared = {k: (v["class"], v["schemaType"], v["schemaName"]) for k, v in first.items()}
        expected = dict(MY_SCHEMA_TYPES)
        if mariadb:
            expected["j"] = ("String", "STRING", None)
        assert declared == expected
        assert classes(children(by_op["tombstone"][0]["key"])) == {"id": "Integer"}
        assert json.loads(first["j"]["value"]) == {"a": 1, "l": [1, None]}
        for name, node in nulls.items():
            if name not in ("id", "note"):
                assert node["class"] is None and node["optional"] is True, name
    else:
        assert classes(first) == MY_CLASSES_PLAIN | ({"j": "String"} if mariadb else {})
        assert classes(children(by_op["tombstone"][0]["key"])) == {"id": "Long"}
        if mariadb:
            assert json.loads(first["j"]["value"]) == {"a": 1, "l": [1, None]}
        else:
            assert classes(children(first["j"])) == {"a": "Long", "l": "ArrayList"}
        for name, node in nulls.items():
            if name not in ("id", "note"):
                assert node is None, name
    assert base64.b64decode(first["bl"]["value"]) == bytes.fromhex("00ff1062")
    assert base64.b64decode(reads[2]["bl"]["value"]) == b""
    assert values(first) | {"j": None, "bl": None} == {
        "id": 1,
        "ti": -128,
        "iu": 4294967295,
        "amount": "123456789.125",
        "dt": "2024-05-06T07:08:09.500000",
        "ts": "2024-05-06T07:08:09.123456Z",
        "j": None,
        "e": "green",
        "bl": None,
        "note": "one",
        "maybe": "here",
        "fl": 1.25,
        "db": -1e300,
        "tm": "-838:59:59",
    }
    assert (reads[2]["fl"]["value"], reads[2]["db"]["value"]) == (-3.5, 2.5)
    assert reads[2]["tm"]["value"] == "13:14:15.250000"
    updated = row_of(by_op["u"][0], "after")
    assert updated is not None and updated["note"]["value"] == "one, updated"
    assert base64.b64decode(updated["bl"]["value"]) == b"\x01\x02"
    before = row_of(by_op["u"][0], "before")  # full row images
    assert before is not None and before["note"]["value"] == "one"
    deleted = row_of(by_op["d"][0], "before")
    assert deleted is not None and deleted["note"]["value"] == "two"
    created = row_of(by_op["c"][0], "after")
    assert created is not None and created["e"]["value"] == "blue"
    assert (created["fl"]["value"], created["db"]["value"]) == (0.5, 0.1)
    assert created["tm"]["value"] == "100:00:00.000001"  # from the binlog, hours past 24


BIG = 2**64 - 1  # bigint unsigned's largest value


@MODES
def test_mysql_bigint_unsigned_above_the_long_range(
    mysql_capture: Callable[..., Capture],
    kafka_bootstrap: str,
    connect_read: Reader,
    schemas: bool,
) -> None:
    """bigint unsigned, as a value and as the key: with schemas, Connect's Decimal (scale 0)
    written as the exact JSON number, which JsonConverter reads as the exact BigDecimal.
    Schemaless, JsonConverter reads any integral JSON number as a Long without a range check
    (longValue()): 2**64-1 comes back as -1, 2**63 as -2**63. That is the schemaless
    converter's limitation (the message holds the exact number: verify reads it back)."""
    cap = kafka_capture(mysql_capture, kafka_bootstrap, schemas)
    cap.sql(f"CREATE TABLE {cap.schema}.big (id bigint unsigned PRIMARY KEY, ub bigint unsigned)")
    cap.sql(f"INSERT INTO {cap.schema}.big VALUES ({BIG}, {BIG}), (1, {2**63}), (2, NULL), (3, 0)")
    snapshot_then_change(
        cap,
        "big",
        f"UPDATE {{s}}.big SET ub = {BIG - 1} WHERE id = {BIG}",
        f"INSERT INTO {{s}}.big VALUES ({2**63 + 5}, {2**63 - 1})",
        "DELETE FROM {s}.big WHERE id = 3",
    )
    by_op = converted(cap, kafka_bootstrap, connect_read, schemas, "big")
    assert counts(by_op) == {"r": 4, "u": 1, "c": 1, "d": 1, "tombstone": 1}
    reads = reads_by_id(by_op)
    updated = row_of(by_op["u"][0], "after")
    created = row_of(by_op["c"][0], "after")
    assert updated is not None and created is not None
    if schemas:
        decimal = "org.apache.kafka.connect.data.Decimal"
        assert set(reads) == {str(BIG), "1", "2", "3"}  # BigDecimal, as its exact text
        row = reads[str(BIG)]
        assert (row["ub"]["class"], row["ub"]["value"]) == ("BigDecimal", "18446744073709551615")
        assert (row["ub"]["schemaType"], row["ub"]["schemaName"]) == ("BYTES", decimal)
        assert (row["id"]["class"], row["id"]["optional"]) == ("BigDecimal", False)
        assert reads["1"]["ub"]["value"] == str(2**63)
        assert reads["2"]["ub"]["value"] is None and reads["2"]["ub"]["optional"] is True
        assert reads["3"]["ub"]["value"] == "0"
        assert updated["ub"]["value"] == str(BIG - 1)
        assert (created["id"]["value"], created["ub"]["value"]) == (str(2**63 + 5), str(2**63 - 1))
        key = by_op["tombstone"][0]["key"]
        assert (key["class"], key["schemaName"]) == ("Struct", f"{cap.topic('big')}.Key")
        (key_field,) = children(key).values()
        assert (key_field["class"], key_field["schemaName"], key_field["value"]) == (
            "BigDecimal",
            decimal,
            "3",
        )
        for message in by_op["r"] + by_op["u"] + by_op["c"]:
            assert children(message["key"])["id"]["class"] == "BigDecimal"
    else:
        assert set(reads) == {-1, 1, 2, 3}  # 2**64-1 read as a Long: -1
        assert (reads[-1]["ub"]["class"], reads[-1]["ub"]["value"]) == ("Long", -1)
        assert reads[1]["ub"]["value"] == -(2**63)
        assert reads[3]["ub"]["value"] == 0
        assert updated["ub"]["value"] == -2
        assert (created["id"]["value"], created["ub"]["value"]) == (-(2**63) + 5, 2**63 - 1)

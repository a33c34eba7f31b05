"""The file channel ([signals] channels = ["file"]): JSON lines cut and parsed without IO
(``signals.lines``), read from the offset state holds (``engine.signal_file``), and acted on
by the whole engine (``test_engine_steps``' fakes): a line acts once across restarts, a bad
line is a problem for ``status`` and the lines after it still act, and with the table channel
off a signal row in the table acts on nothing while the watermark rows still close windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from signals import ExecuteSnapshot
from signals.lines import MAX_LINE_BYTES, complete_lines, parse_line
from snapshotter.config import ConfigError, parse_config
from snapshotter.core.state import SnapshotStatus
from snapshotter.engine.signal_file import SignalFile
from tests.unit.test_engine_steps import ITEMS, Database, MemorySink, Setup


def _line(signal_id: str, table: str = "public.items") -> str:
    data = {"data-collections": [table], "type": "incremental"}
    return json.dumps({"id": signal_id, "type": "execute-snapshot", "data": data}) + "\n"


def test_only_complete_lines_are_cut_and_blank_ones_skipped() -> None:
    text = (_line("a") + "\n" + _line("b") + '{"id": "half').encode()
    lines, end, line = complete_lines(text, 100, 7)
    assert [(x.id, x.where, x.offset) for x in lines] == [
        ("a", "line 7", 100),
        ("b", "line 9", 100 + len(_line("a")) + 1),
    ]
    assert end == 100 + text.index(b'{"id": "half') and line == 10
    assert lines[0].data == json.dumps(
        {"data-collections": ["public.items"], "type": "incremental"}
    )


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"not json", "line 3: not JSON"),
        (b"[1, 2]", "line 3: a JSON list, not an object"),
        (b'{"id": "x", "type": "log", "extra": 1}', "line 3: unknown field(s) 'extra'"),
        (b"\xff\xfe", "line 3: not UTF-8 text"),
        (b"{" + b" " * MAX_LINE_BYTES + b"}", f"line 3: longer than {MAX_LINE_BYTES} bytes"),
    ],
)
def test_a_line_that_is_no_signal_says_why(raw: bytes, problem: str) -> None:
    found = parse_line(raw, 0, "line 3")
    assert found.problem is not None and found.problem.startswith(problem)


def test_data_may_be_an_object_a_string_or_absent() -> None:
    as_text = parse_line(
        b'{"id": "x", "type": "log", "data": "{\\"message\\": \\"hi\\"}"}', 0, "line 1"
    )
    as_object = parse_line(b'{"id": "x", "type": "log", "data": {"message": "hi"}}', 0, "line 1")
    absent = parse_line(b'{"id": "x", "type": "pause-snapshot"}', 0, "line 1")
    assert json.loads(as_text.data or "") == json.loads(as_object.data or "") == {"message": "hi"}
    assert absent.data is None and absent.problem is None


def test_the_file_is_read_from_its_offset_and_again_from_its_start_when_replaced(
    tmp_path: Path,
) -> None:
    path = tmp_path / "signals.jsonl"
    reader = SignalFile(path, 0)
    assert reader.read() == []  # no file yet: waited for
    path.write_text(_line("a") + '{"id": "b"')
    assert [x.id for x in reader.read()] == ["a"]
    assert reader.offset == len(_line("a"))
    with path.open("a") as f:
        f.write(', "type": "log", "data": {"message": "m"}}\n')
    assert [x.id for x in reader.read()] == ["b"] and reader.read() == []
    assert [x.id for x in SignalFile(path, len(_line("a"))).read()] == ["b"]  # a restart
    path.write_text(_line("c"))  # replaced by a shorter file
    assert [x.id for x in reader.read()] == ["c"]


def test_a_line_longer_than_any_signal_is_passed_over_once_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "signals.jsonl"
    path.write_bytes(b"x" * (5 * MAX_LINE_BYTES))
    reader = SignalFile(path, 0)
    assert reader.read() == [] and reader.offset == 0  # not ended: nothing to say yet
    with path.open("a") as f:
        f.write("\n" + _line("after"))
    (problem,) = reader.read()
    assert problem.problem is not None and "longer than" in problem.problem
    assert [x.id for x in reader.read()] == ["after"]


FILE_ONLY = '[signals]\nchannels = ["file"]\nfile = "{path}"\n'


def test_a_file_signal_acts_once_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "signals.jsonl"
    extra = FILE_ONLY.format(path=path)
    db, sink = Database(range(1, 11)), MemorySink()
    path.write_text(_line("first"))
    assert Setup(tmp_path, db, sink, extra).until_caught_up() == 0
    assert sink.read_ids() == list(range(1, 11))
    with path.open("a") as f:
        f.write(_line("second"))
    again = Setup(tmp_path, db, sink, extra)
    assert again.until_caught_up() == 0
    state = again.store.load()
    # The first line was not acted on again: two snapshots, each read the table once.
    assert [p.signal_id for p in state.snapshots] == ["first", "second"]
    assert all(p.status is SnapshotStatus.DONE for p in state.snapshots)
    assert sink.read_ids() == list(range(1, 11)) * 2
    assert state.signal_channels == {f"file:{path}": path.stat().st_size}


def test_a_bad_line_is_a_problem_and_the_next_line_still_acts(tmp_path: Path) -> None:
    path = tmp_path / "signals.jsonl"
    path.write_text("{oops\n" + _line("good"))
    db, sink = Database(range(1, 4)), MemorySink()
    run = Setup(tmp_path, db, sink, FILE_ONLY.format(path=path))
    assert run.until_caught_up() == 0
    state = run.store.load()
    (problem,) = state.signal_problems
    assert problem.message.startswith(f"signal file {path}, line 1: not JSON")
    assert [p.signal_id for p in state.snapshots] == ["good"]


def test_with_the_table_channel_off_a_row_in_the_table_acts_on_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "signals.jsonl"
    db, sink = Database(range(1, 4)), MemorySink()
    db.signal(ExecuteSnapshot("from-table", (ITEMS,)))
    with caplog.at_level("WARNING", logger="snapshotter.engine"):
        run = Setup(tmp_path, db, sink, FILE_ONLY.format(path=path))
        assert run.until_caught_up() == 0
    assert run.store.load().snapshots == [] and sink.read_ids() == []
    assert any('channels does not list "table"' in r.getMessage() for r in caplog.records)


def test_the_file_channel_needs_its_file_and_source_is_the_table_channel(tmp_path: Path) -> None:
    base = '[source]\nkind = "postgres"\nurl = "postgresql://u@h/db"\ntables = ["public.t"]\n'
    with pytest.raises(ConfigError, match='channels lists "file" but no file is named'):
        parse_config(base + '[signals]\nchannels = ["file"]\n', environ={})
    config = parse_config(
        base + '[signals]\nchannels = ["source", "file", "table"]\nfile = "s.jsonl"\n',
        environ={},
        base_dir=tmp_path,
    )
    assert config.signals.channels == ["table", "file"]
    assert config.signals.file == tmp_path / "s.jsonl"  # relative to the config's directory


# --- the Kafka channel's reader, on a consumer that stands in for kafka-python's ------------


class Record:
    def __init__(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        self.offset, self.key, self.value = offset, key, value


class Consumer:
    """kafka-python's consumer as the reader uses it: assign, seek, poll, close."""

    def __init__(self, records: list[Record] | None, fail: bool = False) -> None:
        self.records, self.fail = records, fail
        self.at = -1
        self.polls = 0
        self.closed = False

    def assign(self, partitions: list[object]) -> None:
        pass

    def seek(self, partition: object, offset: int) -> None:
        self.at = offset

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        if self.fail:
            raise ConnectionError("NoBrokersAvailable")
        return {0} if self.records is not None else None

    def end_offsets(self, partitions: list[object], timeout_ms: int) -> dict[object, int]:
        records = self.records or []
        return {p: records[-1].offset + 1 if records else 0 for p in partitions}

    def position(self, partition: object, timeout_ms: int) -> int:
        return self.at

    def poll(self, timeout_ms: int, max_records: int) -> dict[str, list[Record]]:
        found = [r for r in self.records or [] if r.offset >= self.at][:max_records]
        self.at = found[-1].offset + 1 if found else self.at
        self.polls += 1
        return {"partition-0": found} if found else {}

    def close(self) -> None:
        self.closed = True


def _message(signal_id: str) -> bytes:
    return _line(signal_id).strip().encode()


def test_the_topic_is_read_from_the_saved_offset_and_other_pipelines_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from snapshotter.engine.signal_kafka import KafkaSignals

    records = [
        Record(0, b"test", _message("old")),
        Record(1, b"other", _message("theirs")),
        Record(2, b"test", None),  # a tombstone
        Record(3, b"test", b"not json"),
        Record(4, b"test", _message("mine")),
    ]
    consumer = Consumer(records)
    reader = KafkaSignals("k:9092", "test-signal", "test", 1, consumer=lambda _: consumer)
    with caplog.at_level("INFO", logger="snapshotter.engine"):
        lines = reader.read()
    assert [(x.where, x.id, x.problem is not None) for x in lines] == [
        ("offset 3", None, True),
        ("offset 4", "mine", False),
    ]
    assert reader.offset == 5 and reader.key == "kafka:test-signal"
    assert any(
        "for pipeline 'other', not this one ('test')" in r.getMessage() for r in caplog.records
    )
    assert reader.read() == []
    reader.close()
    assert consumer.closed


def test_kafka_out_of_reach_is_logged_and_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from snapshotter.engine.signal_kafka import RETRY_S, KafkaSignals

    now = [0.0]
    consumers = [Consumer([], fail=True), Consumer([Record(0, b"test", _message("late"))])]
    reader = KafkaSignals(
        "k:9092", "t", "test", 0, consumer=lambda _: consumers.pop(0), clock=lambda: now[0]
    )
    with caplog.at_level("WARNING", logger="snapshotter.engine"):
        assert reader.read() == []
        assert reader.read() == []  # not tried again before RETRY_S
    assert len(consumers) == 1
    assert "cannot be read (NoBrokersAvailable); signals there wait" in caplog.text
    now[0] = RETRY_S
    assert [x.id for x in reader.read()] == ["late"]


def test_the_kafka_channel_needs_brokers_and_takes_the_sinks() -> None:
    base = '[source]\nkind = "postgres"\nurl = "postgresql://u@h/db"\ntables = ["public.t"]\n'
    with pytest.raises(ConfigError, match='channels lists "kafka" but no brokers are named'):
        parse_config(base + '[signals]\nchannels = ["kafka"]\n', environ={})
    config = parse_config(
        base + '[sink]\nkind = "kafka"\nbootstrap_servers = "b:9092"\n'
        '[signals]\nchannels = ["kafka"]\n',
        environ={},
    )
    assert config.signals.bootstrap_servers_for(config.sink) == "b:9092"
    assert config.signals.topic_for(config.source) == "db-signal"  # Debezium's default


def test_a_missing_topic_is_waited_for_quietly() -> None:
    from snapshotter.engine.signal_kafka import MISSING_RETRY_S, KafkaSignals

    now = [0.0]
    consumers = [Consumer(None), Consumer([Record(0, b"test", _message("first"))])]
    reader = KafkaSignals(
        "k:9092", "t", "test", 0, consumer=lambda _: consumers.pop(0), clock=lambda: now[0]
    )
    assert reader.read() == [] and reader.read() == []
    assert len(consumers) == 1  # looked for again only after MISSING_RETRY_S
    now[0] = MISSING_RETRY_S
    assert [x.id for x in reader.read()] == ["first"]


def test_the_first_read_drains_the_topic_to_its_end() -> None:
    """What was sent before the run acts in its first step (``run --until-caught-up`` would
    otherwise find itself caught up first), however many messages wait."""
    from snapshotter.engine.signal_kafka import MAX_RECORDS, KafkaSignals

    waiting = MAX_RECORDS + 100
    consumer = Consumer([Record(n, b"test", _message(f"s{n}")) for n in range(waiting)])
    reader = KafkaSignals("k:9092", "t", "test", 0, consumer=lambda _: consumer)
    assert len(reader.read()) == waiting and consumer.polls == 2
    assert reader.offset == waiting


def test_a_file_signal_cut_short_by_a_source_outage_acts_after_the_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The outage stops the engine with state saved between transactions (a final checkpoint
    runs): saved to before the line whose action did not complete, and nothing marks that
    signal done, so the next run acts on it and on the line after it."""
    from snapshotter.engine.retry import SourceUnavailableError

    path = tmp_path / "signals.jsonl"
    extra = FILE_ONLY.format(path=path)
    second = {"id": "second", "type": "log", "data": {"message": "after the first"}}
    path.write_text(_line("first") + json.dumps(second) + "\n")
    db, sink = Database(range(1, 4)), MemorySink()
    db.commit(ITEMS, {"id": 3})  # a transaction boundary: the stop's checkpoint can run
    run = Setup(tmp_path, db, sink, extra)

    def down() -> list[object]:
        raise ConnectionError("server closed the connection unexpectedly")

    run.dialect.list_tables = down  # type: ignore[method-assign]
    run.dialect.is_transient = lambda exc: True  # type: ignore[method-assign]
    reader = run.engine.start()
    with pytest.raises(SourceUnavailableError):
        for _ in range(100):
            run.engine.step(reader, until_caught_up=True)
            run.clock.now += 0.05
    run.engine.close()
    state = run.store.load()
    assert state.signal_channels == {f"file:{path}": 0} and state.snapshots == []
    assert "first" not in state.processed_signals
    again = Setup(tmp_path, db, sink, extra)
    with caplog.at_level("INFO", logger="snapshotter.engine"):
        assert again.until_caught_up() == 0
    assert [p.signal_id for p in again.store.load().snapshots] == ["first"]
    assert "signal second (log) received" in caplog.text


def test_an_unreadable_file_is_logged_and_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "signals.jsonl"
    path.mkdir()  # a directory where the file should be
    reader = SignalFile(path, 0)
    with caplog.at_level("WARNING", logger="snapshotter.engine"):
        assert reader.read() == [] and reader.read() == []
    assert [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()] == [
        f"signal file {path} cannot be read ([Errno 21] Is a directory: '{path}'); waiting for it"
    ]


def test_a_signal_appended_after_a_line_without_its_newline_stays_its_own(
    tmp_path: Path,
) -> None:
    from signals import SignalType, parse_signal
    from snapshotter.app.cli.signals import _append_signal

    path = tmp_path / "signals.jsonl"
    path.write_text(_line("by-hand").rstrip("\n"))  # written by hand, no newline
    signal = parse_signal("cli", SignalType.PAUSE_SNAPSHOT.value, None)
    assert not isinstance(signal, ExecuteSnapshot)
    _append_signal(path, signal)  # type: ignore[arg-type]
    lines, end, _ = complete_lines(path.read_bytes(), 0, 1)
    assert [x.id for x in lines] == ["by-hand", "cli"] and end == path.stat().st_size

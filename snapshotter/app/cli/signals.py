"""Signals: ``signal`` (check a signal, then insert it into the signal table, or send it to
the channel ``[signals] channels`` lists first: a line appended to the file, a message on
the Kafka topic) and ``signals`` (list the signal table)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from signals import ExecuteSnapshot, Signal, SignalError, SignalType, Watermark, parse_signal
from signals.display import printable
from signals.names import TableId
from signals.table import new_signal_id
from snapshotter.app.cli.common import CliError, Session, connect, err, out
from snapshotter.config import Config
from snapshotter.sources.connector import Connector, connector_for


def _signal_data(args: argparse.Namespace) -> dict[str, Any]:
    kind = SignalType(args.kind)
    if kind is SignalType.EXECUTE_SNAPSHOT:
        data: dict[str, Any] = {"data-collections": args.tables, "type": "incremental"}
        conditions = []
        for item in args.filter or []:
            table, sep, sql = item.partition("=")
            if not sep or not table.strip() or not sql.strip():
                raise CliError(f"--filter {item!r}: write it as TABLE=SQL", code=2)
            conditions.append({"data-collection": table.strip(), "filter": sql.strip()})
        if conditions:
            data["additional-conditions"] = conditions
        if args.surrogate_key:
            data["surrogate-key"] = args.surrogate_key
        return data
    if kind is SignalType.STOP_SNAPSHOT:
        return (
            {"data-collections": args.tables, "type": "incremental"}
            if args.tables
            else {"type": "incremental"}
        )
    if kind is SignalType.LOG:
        return {"message": args.message}
    return {"type": "incremental"}


def cmd_signal(session: Session, args: argparse.Namespace) -> int:
    config = session.load_config(args.config)  # -c, or ./snapshotter.toml (parser.main)
    # The CLI builds the row and runs it through the same strict parser the engine uses, so
    # a signal the engine would refuse is refused here, before it reaches the table.
    parsed = parse_signal(
        new_signal_id(),
        args.kind,
        json.dumps(_signal_data(args)),
        dollar_quotes=connector_for(config.source).dollar_quotes,
    )
    if isinstance(parsed, SignalError):
        raise CliError(f"not sent: {printable(parsed.problem)}", code=2)
    assert not isinstance(parsed, Watermark)
    channel = config.signals.channels[0]
    if channel in ("file", "kafka"):
        if isinstance(parsed, ExecuteSnapshot) and not args.no_check:
            _check_snapshot(config, parsed)
        if channel == "file":
            assert config.signals.file is not None  # the config's rule
            _append_signal(config.signals.file, parsed)
            where = str(config.signals.file)
        else:
            where = _send_signal(config, parsed)
        out.print(escape(f"{parsed.type.value} signal {parsed.id} sent to {where}"))
        return 0
    engine = connect(config)
    if isinstance(parsed, ExecuteSnapshot) and not args.no_check:
        _check_snapshot(config, parsed)
    connector = connector_for(config.source)
    signal_id = _insert_signal(config, connector, engine, parsed)
    out.print(
        escape(
            f"{parsed.type.value} signal {signal_id} inserted into {config.source.signal_table_id}"
        )
    )
    from snapshotter.app.log_coverage import signal_warnings

    for warning in signal_warnings(config, engine):
        err.print(
            f"[yellow]warning:[/yellow] {escape(warning)} (the engine will not see this signal "
            "unless the log carries it)"
        )
    return 0


def _append_signal(path: Path, signal: Signal) -> None:
    """One JSON line appended to the file channel's file, durable before this returns (one
    write of a whole line, so a reader never sees half of it as complete)."""
    line = json.dumps({"id": signal.id, "type": signal.type.value, "data": signal.data()})
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CliError(f"cannot open the signal file {path}: {exc.strerror}", code=1) from None
    try:
        data = (line + "\n").encode()
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a line written by hand without its newline stays its own
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _send_signal(config: Config, signal: Signal) -> str:
    """The signal sent to the Kafka channel's topic, keyed by the pipeline's name (as
    Debezium's Kafka signal channel reads it), acknowledged before this returns."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    servers = config.signals.bootstrap_servers_for(config.sink)
    assert servers is not None  # the config's rule
    topic = config.signals.topic_for(config.source)
    value = json.dumps({"id": signal.id, "type": signal.type.value, "data": signal.data()})
    brokers = [s.strip() for s in servers.split(",") if s.strip()]
    try:
        _create_topic(config, brokers, topic)
        producer = KafkaProducer(bootstrap_servers=brokers, acks="all")
        try:
            key = config.source.topic_prefix.encode()
            producer.send(topic, key=key, value=value.encode(), partition=0).get(timeout=30)
        finally:
            producer.close(timeout=5)
    except KafkaError as exc:
        raise CliError(
            f"cannot send the signal to topic {topic} at {servers} ({exc}); check [signals] "
            "kafka_bootstrap_servers",
            code=1,
        ) from None
    return f"topic {topic}"


def _create_topic(config: Config, brokers: list[str], topic: str) -> None:
    """The signal topic, one partition (Debezium's channel reads partition 0 alone), created
    when missing (brokers here do not create topics on first use)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=brokers)
    try:
        if topic not in admin.list_topics():
            replication = config.sink.replication if config.sink.kind == "kafka" else 1
            admin.create_topics([NewTopic(topic, 1, replication)])
    except TopicAlreadyExistsError:
        pass  # created by another `signal` in between
    finally:
        admin.close()


def _insert_signal(config: Config, connector: Connector, engine: Any, signal: Signal) -> str:
    """Insert the signal row; a privilege the user lacks is one line naming the GRANT."""
    import sqlalchemy as sa

    from snapshotter.common.errors import is_privilege_error

    try:
        return connector.insert_signal(engine, signal)
    except connector.errors as exc:
        if not isinstance(engine, sa.Engine) or not is_privilege_error(exc):
            raise
        from snapshotter.sources.privileges import grant_for

        table = config.source.signal_table_id
        grant = grant_for(engine, table, ("INSERT",))
        raise CliError(
            f"cannot insert into the signal table {table}: the source refused a privilege; "
            f"run as an administrator: {grant}"
        ) from None


def _check_snapshot(config: Config, signal: ExecuteSnapshot) -> None:
    """Refuse at once what the engine would refuse (signals.plan, the engine's own rules):
    a table that does not exist or is a view, the signal or notification table, a pattern
    that matches no table, a signal too big; and what this pipeline would skip (a table
    outside source.tables: the config given is the pipeline the user means). Whether a
    table is busy is left to the engine (the state file may be behind it)."""
    from signals.names import TableSet
    from signals.plan import not_captured
    from snapshotter.app.runner import open_dialect
    from snapshotter.engine.snapshot_scope import snapshot_scope

    dialect = open_dialect(config)
    try:
        known = TableSet(dialect.list_tables())
        scope = snapshot_scope(config.source, config.own_tables)
        plan = scope.plan(
            signal,
            known=known,
            unfinished={},
            describe_missing=dialect.relation_kinds,
        )
    finally:
        dialect.close()
    outside = [
        not_captured(item, scope.captured_text)
        if isinstance(item, TableId)
        else f"pattern {item} matches no captured table (only tables outside source.tables)"
        for item in plan.skipped
    ]
    reasons = [plan.error] if plan.error else [r for _, r in plan.refused] + outside + plan.problems
    if not reasons:
        return
    more = f" (and {len(reasons) - 1} more problems)" if len(reasons) > 1 else ""
    fix = "; fix the names (they are case-sensitive) or source.tables, or pass --no-check"
    if plan.error:
        fix = ""
    raise CliError(f"not sent: {printable(reasons[0])}{more}{fix}", code=2)


def _describe(signal: Signal | Watermark | SignalError) -> tuple[str, str, str]:
    # Signal text is anyone's: control characters escaped (printable), markup escaped.
    if isinstance(signal, SignalError):
        return (
            escape(printable(signal.signal_id)),
            escape(printable(signal.signal_type)),
            f"[red]error:[/red] {escape(printable(signal.problem))}",
        )
    if isinstance(signal, Watermark):
        return (
            escape(printable(signal.id)),
            signal.type.value,
            f"window {escape(printable(signal.window_id))}",
        )
    return (
        escape(printable(signal.id)),
        signal.type.value,
        escape(printable(json.dumps(signal.data(), ensure_ascii=False))),
    )


def cmd_signals(session: Session, args: argparse.Namespace) -> int:
    config = session.load_config(args.config)
    connector = connector_for(config.source)
    engine = connect(config)
    signals = [parse_signal(i, t, d) for i, t, d in connector.signal_rows(engine)]
    if args.json:
        rows: list[dict[str, Any]] = []
        for s in signals:
            if isinstance(s, SignalError):
                rows.append({"id": s.signal_id, "type": s.signal_type, "error": s.problem})
            else:
                rows.append({"id": s.id, "type": s.type.value, "data": s.data()})
        # Exact values, as JSON escapes: nothing but ASCII reaches the terminal.
        out.print_json(json.dumps(rows), ensure_ascii=True)
        return 0
    table = Table(title=f"signals in {config.source.signal_table_id}")
    table.add_column("id", overflow="fold")
    table.add_column("type", no_wrap=True)
    table.add_column("data", overflow="fold")
    for s in signals:
        table.add_row(*_describe(s))
    out.print(table)
    return 0

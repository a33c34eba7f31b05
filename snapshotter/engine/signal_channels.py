"""The signal channels besides the signal table ([signals] channels): what each reader
offers the engine, and the readers a configuration asks for."""

from __future__ import annotations

from typing import Protocol

from signals.lines import SignalLine
from snapshotter.config import Config
from snapshotter.core.state import EngineState


class ChannelReader(Protocol):
    key: str  # where state keeps how far it was read (``signal_channels``)
    label: str  # how messages name it: "signal file ...", "signal topic ..."
    offset: int  # how far it is read

    def read(self) -> list[SignalLine]: ...

    def rewind(self, offset: int) -> None: ...

    def close(self) -> None: ...


def open_channels(config: Config, state: EngineState) -> list[ChannelReader]:
    """The readers of the configured file and Kafka channels, from where state left them."""
    signals = config.signals
    readers: list[ChannelReader] = []
    if "file" in signals.channels and signals.file is not None:
        from snapshotter.engine.signal_file import SignalFile

        offset = state.signal_channels.get(f"file:{signals.file}", 0)
        readers.append(SignalFile(signals.file, offset))
    if "kafka" in signals.channels:
        from snapshotter.engine.signal_kafka import KafkaSignals

        servers = signals.bootstrap_servers_for(config.sink)
        assert servers is not None  # the config's rule
        topic = signals.topic_for(config.source)
        readers.append(
            KafkaSignals(
                servers,
                topic,
                config.source.topic_prefix,
                state.signal_channels.get(f"kafka:{topic}", 0),
            )
        )
    return readers

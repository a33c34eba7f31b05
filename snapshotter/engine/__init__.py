"""The engine: the loop that streams the log, answers signals and runs DBLog chunk windows
(``loop``), and its collaborators, one job each:

- ``window_close``: chunk windows from their opening to their close, and the output barrier
  (a window's READ rows reach the sink at its close watermark, before any later log event);
- ``scheduler``: what the chunk workers read next (which table, which key range, windows in
  flight), apart from the reading;
- ``workers``: the chunk workers that read beside the stream (the ordering rules of a chunk);
- ``task_answers``: what a worker's answer changes (a table started, a span's end, a failure);
- ``watermarks``: which watermark rows in the log the engine acts on (forged rows);
- ``signal_rows``: the signal table's rows (parsed, acted on once, problems kept);
- ``signal_actions``: what each user signal does, registered by its type;
- ``retry``: outages of the source (backoff, when to give up);
- ``key_catalog``: which columns key each table's events (for the decoder, windows, sinks);
- ``checkpointer``: checkpoints and the state saved once the sink acknowledges one;
- ``caught_up``: when ``--until-caught-up`` may stop;
- ``outcome``: the exit code;
- ``watchdog``: what the source's log no longer carries (asked while running, and when a
  close watermark is overdue);
- ``signal_cleanup``: deleting the engine's own watermark rows;
- ``state_store``: the state file (atomic replace, lock);
- ``live_state``: the state as it runs, changed through methods that mark what changed (the
  checkpointer reads the marks);
- ``context``: what an engine is built from (``EngineContext``).
"""

from snapshotter.core.window import WindowPhase
from snapshotter.engine.context import EngineContext, KeyColumns, OpenReader
from snapshotter.engine.key_catalog import KeyCatalog
from snapshotter.engine.loop import Engine, EngineStop
from snapshotter.engine.retry import SourceUnavailableError
from snapshotter.engine.workers import PhaseHooks, StartWorkers, WorkerPool

__all__ = [
    "Engine",
    "EngineContext",
    "EngineStop",
    "KeyCatalog",
    "KeyColumns",
    "OpenReader",
    "PhaseHooks",
    "SourceUnavailableError",
    "StartWorkers",
    "WindowPhase",
    "WorkerPool",
]

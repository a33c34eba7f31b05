"""snapshotter: incremental, lock-free, resumable table snapshots (DBLog watermark chunking)."""

__version__ = "0.1.0"

"""Cloud Spanner: snapshots and change streams (docs/spanner.md)."""

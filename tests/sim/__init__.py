"""A deterministic simulation of the whole engine, without servers (tests/sim/README.md)."""

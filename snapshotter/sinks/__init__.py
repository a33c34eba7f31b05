"""Sinks: where events go. Each acknowledges durability, possibly after the write."""

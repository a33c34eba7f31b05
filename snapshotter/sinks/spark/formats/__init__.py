"""One module per landing format (parquet, delta, iceberg): how a table's changelog and current
state are written, kept exact and read; ``sinks.spark.lander`` decides what lands when."""

"""Landing the event stream in Spark: Parquet or Delta tables, the session and its jars."""

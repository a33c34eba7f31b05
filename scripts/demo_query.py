"""The demo's last step: read what snapshotter landed the way any Spark user would (plain
``spark.read.parquet``, no snapshotter code) and print two Spark SQL queries as tables.

    python scripts/demo_query.py .demo/lake
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def main() -> None:
    lake = sys.argv[1].rstrip("/")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("snapshotter-demo-query")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.read.parquet(f"{lake}/public.orders/current").createOrReplaceTempView("orders")
    spark.read.parquet(f"{lake}/public.orders/changelog").createOrReplaceTempView("changelog")
    print("== Spark SQL: the changelog, events per operation (r = snapshot READ rows)")
    spark.sql(
        "SELECT __op AS op, count(*) AS events, count(DISTINCT region, id) AS keys "
        "FROM changelog GROUP BY __op ORDER BY op"
    ).show()
    print("== Spark SQL: the current state (a plain Parquet read), rows per region")
    spark.sql(
        "SELECT region, count(*) AS orders, round(sum(amount), 2) AS amount "
        "FROM orders GROUP BY region ORDER BY region"
    ).show()
    print("== Spark SQL: the newest orders")
    spark.sql(
        "SELECT region, id, amount, note, __op AS op FROM orders ORDER BY id DESC LIMIT 5"
    ).show(truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()

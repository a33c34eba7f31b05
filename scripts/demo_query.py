"""The demo's last step: read what snapshotter landed the way any Spark user would (plain
``spark.read.parquet``, no snapshotter code), print Spark SQL queries as tables, and, given
the application's counts, reconcile them with the changelog.

    python scripts/demo_query.py .demo/lake [.demo/app-counts.json]
"""

from __future__ import annotations

import sys

from demo_app import reconcile  # scripts/ is this script's directory, first on sys.path
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
    agree = True
    if len(sys.argv) > 2:
        ops = spark.sql("SELECT __op, count(*) FROM changelog GROUP BY __op").collect()
        agree = reconcile(sys.argv[2], {op: n for op, n in ops})
    spark.stop()
    if not agree:
        sys.exit(1)


if __name__ == "__main__":
    main()

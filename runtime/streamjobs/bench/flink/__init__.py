"""Apache Flink as a benchmark peer: a mini-cluster in a JVM of its own (session.py) and the SQL it runs (sql.py)."""

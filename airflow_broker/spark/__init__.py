"""The Spark layer: the reader application that spark-submit runs, how its environment and
code are shipped to executors, and how its secrets reach the cluster."""

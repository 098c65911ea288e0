"""The airflow-broker demo (`make demo`, `airflow-broker demo`): the stock-trade application
with two Spark readers on the brokerage side, poison-message quarantine, a queue-disabled
alert and endpoint reclaim. The DAG itself is airflow_broker.demos.demo_dag; it uses the connections
``broker_demo`` (a broker connection whose broker schema is broker_demo) and ``spark_local``
(``{"conn_type": "spark", "host": "local[2]"}``).
"""

from airflow_broker.demos.demo_dag import build_demo_dag

dag = build_demo_dag()

-- What an operator runs by hand (airflow_broker.admin) and what the Spark driver checks
-- before it starts readers (airflow_broker.spark.reader).

-- leak_counts --
SELECT service_name, far_service, leaked FROM {schema}.leaked_endpoint_counts
ORDER BY leaked DESC

-- queue_status --
-- A queue's state, with why poison detection disabled it last.
SELECT * FROM {schema}.queue_state(%s)

-- queue_readers --
SELECT max_readers FROM {schema}.queue_definition(%s)

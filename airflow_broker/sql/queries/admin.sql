-- What an operator runs by hand (airflow_broker.admin) and what the Spark driver checks
-- before it starts readers (airflow_broker.spark.reader).

-- leak_counts --
SELECT service_name, far_service, leaked FROM {schema}.leaked_endpoint_counts
ORDER BY leaked DESC

-- queue_status --
-- A queue's state, with why poison detection disabled it last.
SELECT s.name, s.schema_name, s.is_receive_enabled, s.disabled_reason, s.disabled_at,
       s.ready_messages,
       (SELECT e.reason FROM {schema}.queue_disable_events e
         WHERE e.queue_id = s.object_id ORDER BY e.event_id DESC LIMIT 1)
FROM {schema}.queue_status s
WHERE s.object_id = (SELECT object_id FROM {schema}.find_queue(%s))

-- queue_readers --
SELECT object_id, max_readers FROM {schema}.find_queue(%s)

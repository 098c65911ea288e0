-- The broker's view in Airflow's UI (airflow_broker.ui). Each reads the broker's own views and
-- functions; service_queues shows a login only the queues it may see.

-- ui_queues --
-- Every queue: its state, depth, oldest ready message, activated readers, and the latest
-- poison-detection event with the messages that caused it.
SELECT q.name, q.schema_name, q.is_receive_enabled, s.disabled_reason, s.disabled_at,
       q.is_activation_enabled, q.max_readers, s.ready_messages, s.oldest_ready_at,
       (SELECT count(*) FROM {schema}.dm_broker_activated_tasks t
         WHERE t.queue_id = q.object_id) AS readers_running,
       e.reason AS poison_reason, e.disabled_at AS poison_at, e.message_ids AS poison_messages,
       (SELECT count(*) FROM {schema}.quarantined_messages x
         WHERE x.queue_name = q.name AND x.status IN ('quarantined', 'retrying'))
           AS quarantined
  FROM {schema}.service_queues q
  JOIN {schema}.queue_status s ON s.object_id = q.object_id
  LEFT JOIN LATERAL (
      SELECT d.reason, d.disabled_at, d.message_ids FROM {schema}.queue_disable_events d
       WHERE d.queue_id = q.object_id ORDER BY d.event_id DESC LIMIT 1) e ON true
 ORDER BY q.name

-- ui_queue_messages --
-- The messages waiting on one queue the login may see, in RECEIVE's order within each
-- conversation group (at most %s rows).
SELECT m.conversation_group_id, m.conversation_handle, m.message_sequence_number,
       t.name AS message_type_name, m.status, m.priority, m.enqueued_at, m.message_id,
       m.message_body
  FROM {schema}.visible_queue(%s) q
  JOIN {schema}.queue_messages m ON m.queue_id = q.object_id
  JOIN {schema}.message_types t ON t.message_type_id = m.message_type_id
 WHERE m.status IN (1, 2)
 ORDER BY m.conversation_group_id, m.conversation_handle, m.precedence,
          m.message_sequence_number
 LIMIT %s

-- Poison-message handling (airflow_broker.poison): the record of a receiving transaction and
-- its resolution, the quarantine table, and the messages a reader parks for a timer retry.
-- The functions they call are in sql/functions/60_poison.sql and 65_quarantine.sql.

-- Recording and resolution (airflow_broker.poison.detection)

-- poison_record_allowed --
-- Whether this role can record its receiving transactions for poison-message detection, as
-- register_receive() does on the side connection, where a refusal could only be logged.
SELECT current_user::text,
       has_function_privilege('{schema}.register_receive(integer, xid8, uuid[], integer)',
                              'EXECUTE')

-- register_receive --
-- Poison detection's record of a receiving transaction, on the side connection, where it is
-- prepared once and sent with its values in text: queue id, xid, message ids, backend pid.
SELECT {schema}.register_receive($1::integer, $2::xid8, $3::uuid[], $4::integer)

-- queue_id_and_xid --
-- The queue an activated procedure will receive from, and its transaction, for poison
-- detection's record (NULL for a queue the login may not see).
SELECT (SELECT object_id FROM {schema}.queue_reference(%s)), pg_current_xact_id()::text

-- resolve_receives --
-- Counts a rolled-back receive of a queue at once (bytes formatting: the queue id).
SELECT {schema}.resolve_receives(%d)

-- resolve_all_receives --
-- The broker worker's pass over every queue's records.
SELECT {schema}.resolve_receives()

-- Quarantine (airflow_broker.poison.quarantine)

-- quarantined_messages --
SELECT quarantine_id, queue_name, status, quarantined_at, attempts, conversation_handle,
       message_type_name, message_sequence_number, message_id, message_body, error
FROM {schema}.quarantined_messages
WHERE (%s::text IS NULL OR queue_name = %s)
  AND (%s OR status IN ('quarantined', 'retrying'))
ORDER BY quarantined_at, quarantine_id

-- Parked messages of a timer retry (airflow_broker.poison.parking)

-- parked_conversations --
SELECT * FROM {schema}.parked_conversations(%s::uuid[])

-- parked_messages --
SELECT * FROM {schema}.parked_messages(%s)

-- parked_message_settle --
-- Quarantine id, outcome (done, failed, quarantined), attempts, error, traceback.
SELECT {schema}.settle_parked(%s, %s, %s, %s, %s)

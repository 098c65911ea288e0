-- The broker's view in Airflow's UI (airflow_broker.ui). Each calls a broker function every
-- login may call (sql/functions/67_console.sql, queue_state), which shows and changes only
-- what the calling login may see and do.

-- ui_queues --
-- Every queue the login may see: state, depth, oldest ready message, activated readers, the
-- latest disable event, quarantine size, whether the login may RECEIVE and ALTER, its queue
-- monitor and its count of RECEIVEs that took messages; depths above %s ready messages are
-- estimates.
SELECT name, schema_name, is_receive_enabled, disabled_reason, disabled_at,
       is_activation_enabled, max_readers, ready_messages, oldest_ready_at, readers_running,
       poison_reason, poison_at, poison_message_ids, quarantined, may_receive, may_alter,
       depth_is_estimate, monitor_state, monitor_state_since, monitor_stuck,
       last_activated_time, receives
  FROM {schema}.console_queues(%s)

-- ui_queue_state --
-- One queue's state, if the login may see it.
SELECT name, schema_name, is_receive_enabled, disabled_reason, disabled_at, ready_messages,
       poison_reason
  FROM {schema}.queue_state(%s)

-- ui_queue_messages --
-- The messages waiting on one queue the login may RECEIVE from (208, 229 otherwise), in
-- RECEIVE's order within each conversation group (at most %s rows).
SELECT conversation_group_id, conversation_handle, message_sequence_number,
       message_type_name, status, priority, enqueued_at, message_id, message_body
  FROM {schema}.console_queue_messages(%s, %s)

-- ui_queue_activation --
-- One queue's activation settings, if the login may see the queue.
SELECT is_activation_enabled, activation_procedure, max_readers, execute_as
  FROM {schema}.queue_definition(%s)

-- ui_reader_runs --
-- The newest reader runs of one queue the login may RECEIVE from, at most %s of them.
SELECT run_id, started_at, ended_at, airflow, summary
  FROM {schema}.console_reader_runs(%s, %s)

-- ui_activations --
-- The newest activations of one queue's procedure, for a login that may RECEIVE from it.
SELECT task_id, procedure, execute_as, started_at, ended_at, outcome, messages_received,
       rollbacks, exception
  FROM {schema}.console_activations(%s, %s)

-- ui_queue_rights --
-- Whether the login may RECEIVE from and ALTER a queue; no row for one it may not see.
SELECT may_receive, may_alter FROM {schema}.console_queue_rights(%s)

-- ui_quarantine --
-- One queue's quarantined and parked messages, for a login that may RECEIVE from it: error
-- text, quarantined since (NULLs: any), at most %s rows (NULL: all), oldest first.
SELECT quarantine_id, status, quarantined_at, attempts, conversation_handle,
       message_type_name, message_sequence_number, message_id, message_body, error
  FROM {schema}.console_quarantine(%s, %s, %s, %s)

-- ui_quarantine_groups --
-- Those messages by error: how many, the first and the last, the oldest %s ids.
SELECT error, messages, first_quarantined_at, last_quarantined_at, quarantine_ids
  FROM {schema}.console_quarantine_groups(%s, %s, %s, %s)

-- ui_replay --
-- Replays quarantined messages of one queue (RECEIVE on it); returns how many.
SELECT {schema}.console_replay(%s, %s::bigint[])

-- ui_discard --
-- Discards quarantined messages of one queue (RECEIVE on it); returns how many.
SELECT {schema}.console_discard(%s, %s::bigint[])

-- ui_conversations --
-- The conversations the login may see (RECEIVE on their service's queue), newest first, leaks
-- flagged; state (NULL: any), leaks only, at most %s rows.
SELECT conversation_handle, conversation_id, is_initiator, service_name, far_service, state,
       state_desc, lifetime, created_at, is_leaked
  FROM {schema}.console_conversations(%s, %s, %s)

-- ui_conversation --
-- One conversation the login may see, or no row.
SELECT conversation_handle, is_leaked
  FROM {schema}.console_conversations(NULL, false, 1, %s)

-- ui_conversation_counts --
SELECT state, endpoints, leaked FROM {schema}.console_conversation_counts()

-- ui_transmissions --
-- What waits in the transmission queue per route (destination service and broker instance),
-- as far as the login may see it, oldest first, at most as many routes as asked.
SELECT to_service_name, to_broker_instance, delivery, messages, conversations,
       oldest_enqueue_time, attempts, transmission_status, last_attempt_at, next_attempt_at,
       may_retry
  FROM {schema}.console_transmissions(%s)

-- ui_retry_transmissions --
-- Makes what waits for one route due now (RECEIVE on the sending services' queues); returns
-- how many messages.
SELECT {schema}.console_retry_transmissions(%s, %s)

-- ui_conversation_endpoint --
-- One conversation endpoint the login may see (RECEIVE on its service's queue), or no row.
SELECT conversation_handle, conversation_id, is_initiator, service_name, far_service, state,
       state_desc, lifetime, created_at, is_leaked
  FROM {schema}.console_conversations(NULL, false, 1, %s)

-- ui_inbox --
-- What one Airflow consumer (a task instance: 'task:<dag_id>/<run_id>/<task_id>/<map_index>')
-- holds in the Airflow inbox, of the queues the login may RECEIVE from, oldest first, at most
-- %s rows.
SELECT inbox_id, queue_name, state, claimed_at, delivered_at, consumed_at,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_contract_name, message_type_name, message_id, message_body
  FROM {schema}.console_inbox(%s, %s)

-- ui_conversation_endpoints --
-- One conversation's endpoints in this broker that the login may see (8426 for a handle it
-- may not see).
SELECT conversation_handle, conversation_id, is_initiator, service_name, queue_name,
       far_service, far_broker_instance, state, state_desc, lifetime, security_timestamp,
       send_sequence, receive_sequence, created_at, transmission_status
  FROM {schema}.console_conversation_endpoints(%s)

-- ui_conversation_messages --
-- That conversation's messages in its queues and in the transmission queue, at most %s of each.
SELECT conversation_handle, place, message_sequence_number, message_type_name, status, at,
       transmission_status, message_id, message_body
  FROM {schema}.console_conversation_messages(%s, %s)

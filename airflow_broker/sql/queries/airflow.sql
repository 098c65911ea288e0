-- The Airflow side: the hook, the sensors and triggers (the Airflow inbox, queue states) and
-- BrokerSetupOperator's reading of the catalog (airflow_broker.hooks, .sensors, .triggers,
-- .operators.setup).

-- inbox_claimed --
-- What a consumer holds in the inbox, oldest first.
SELECT inbox_id, consumer, queue_name, state, status, priority, queuing_order,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_id, service_contract_name, service_contract_id, message_type_name,
       message_type_id, validation, message_body, message_id, attempts
FROM {schema}.airflow_claimed(%s)

-- inbox_claim --
-- RECEIVE into the inbox for a task, in one transaction.
SELECT inbox_id, consumer, queue_name, state, status, priority, queuing_order,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_id, service_contract_name, service_contract_id, message_type_name,
       message_type_id, validation, message_body, message_id, attempts
FROM {schema}.airflow_claim(%s, %s, %s, %s::uuid, %s::uuid, %s::text[], false, %s, %s)

-- inbox_stream_claim --
-- RECEIVE into the inbox for an asset watcher's stream.
SELECT inbox_id, consumer, queue_name, state, status, priority, queuing_order,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_id, service_contract_name, service_contract_id, message_type_name,
       message_type_id, validation, message_body, message_id, attempts
FROM {schema}.airflow_claim(%s, %s, %s, NULL, NULL, NULL, true)

-- inbox_reclaim --
SELECT inbox_id, consumer, queue_name, state, status, priority, queuing_order,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_id, service_contract_name, service_contract_id, message_type_name,
       message_type_id, validation, message_body, message_id, attempts
FROM {schema}.airflow_reclaim(%s)

-- inbox_redeliver --
SELECT inbox_id, consumer, queue_name, state, status, priority, queuing_order,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_id, service_contract_name, service_contract_id, message_type_name,
       message_type_id, validation, message_body, message_id, attempts, redeliveries
FROM {schema}.airflow_redeliver(%s, %s)

-- inbox_fetch --
SELECT inbox_id, consumer, queue_name, state, status, priority, queuing_order,
       conversation_group_id, conversation_handle, message_sequence_number, service_name,
       service_id, service_contract_name, service_contract_id, message_type_name,
       message_type_id, validation, message_body, message_id, attempts
FROM {schema}.airflow_fetch(%s, %s)

-- inbox_awaiting_ack --
-- Consumer, and how recent a delivery counts (seconds; NULL: any).
SELECT {schema}.airflow_awaiting_ack(%s, %s::float8)

-- inbox_take_over --
SELECT {schema}.airflow_take_over(%s, %s::bigint[])

-- inbox_settle --
SELECT {schema}.airflow_settle(%s, %s::bigint[], %s)

-- inbox_notify --
SELECT pg_notify(%s, %s)

-- inbox_ack --
SELECT {schema}.airflow_ack(%s, %s::bigint[])

-- inbox_ack_consumer --
SELECT {schema}.airflow_ack(%s, NULL)

-- inbox_consume --
SELECT * FROM {schema}.airflow_consume(%s::text[], %s::bigint[])

-- peek --
-- Messages RECEIVE could take now, left where they are.
SELECT * FROM {schema}.airflow_peek(%s, %s, %s::uuid, %s::uuid, %s::text[])

-- airflow_queue_state --
SELECT * FROM {schema}.airflow_queue_state(%s)

-- queue_ids --
-- The ids of the named queues (NULL for one that does not exist yet).
SELECT w.name, ({schema}.find_queue(w.name)).object_id FROM unnest(%s::text[]) AS w(name)

-- disabled_queue_of_event --
-- The queue a BROKER_QUEUE_DISABLED event is about, and its database's name.
SELECT * FROM {schema}.queue_of_event(%s, %s, %s)

-- BrokerSetupOperator: what the broker already holds

-- spec_xml_collection --
SELECT schemas FROM {schema}.xml_schema_collections WHERE name = %s

-- spec_message_type --
SELECT t.validation_kind, c.name
FROM {schema}.message_types t
LEFT JOIN {schema}.xml_schema_collections c USING (xml_collection_id)
WHERE t.name = %s

-- spec_contract --
SELECT service_contract_id FROM {schema}.contracts WHERE name = %s

-- spec_contract_usages --
SELECT t.name, u.is_sent_by_initiator, u.is_sent_by_target
FROM {schema}.contract_message_usages u
JOIN {schema}.message_types t USING (message_type_id)
WHERE u.service_contract_id = %s

-- spec_queue --
SELECT is_receive_enabled, is_retention_enabled, is_activation_enabled, activation_procedure,
       max_readers, execute_as, is_poison_message_handling_enabled, poison_threshold,
       activation_min_readers, activation_ramp_interval, schema_name
FROM {schema}.queues
WHERE name = %s OR schema_name || '.' || name = %s

-- spec_queue_id --
SELECT object_id FROM {schema}.find_queue(%s)

-- spec_service --
SELECT service_id, service_queue_id FROM {schema}.service_defs WHERE name = %s

-- spec_service_contracts --
SELECT c.name
FROM {schema}.service_def_contracts u
JOIN {schema}.contracts c USING (service_contract_id)
WHERE u.service_id = %s

-- spec_route --
SELECT address, remote_service_name, broker_instance, mirror_address
FROM {schema}.routes WHERE name = %s

-- spec_event_notification --
SELECT n.event_types, n.service_name, n.broker_instance
FROM {schema}.event_notifications n
JOIN {schema}.queues q ON q.object_id = n.parent_id
WHERE n.name = %s AND (q.name = %s OR q.schema_name || '.' || q.name = %s)

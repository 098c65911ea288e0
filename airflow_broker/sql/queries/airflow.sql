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
-- The ids of the named queues (NULL for one that does not exist yet, or that the login may
-- not see).
SELECT w.name, (SELECT object_id FROM {schema}.queue_reference(w.name))
FROM unnest(%s::text[]) AS w(name)

-- disabled_queue_of_event --
-- The queue a BROKER_QUEUE_DISABLED event is about, and its database's name.
SELECT * FROM {schema}.queue_of_event(%s, %s, %s)

-- BrokerSetupOperator: what the broker already holds

-- spec_xml_collection --
SELECT schemas FROM {schema}.xml_schema_collection_definition(%s)

-- spec_message_type --
SELECT validation_kind, schema_collection FROM {schema}.message_type_definition(%s)

-- spec_contract --
SELECT message_type_name, is_sent_by_initiator, is_sent_by_target
FROM {schema}.contract_definition(%s)

-- spec_queue --
SELECT * FROM {schema}.queue_definition(%s)

-- spec_queue_id --
SELECT object_id FROM {schema}.queue_reference(%s)

-- spec_service --
SELECT service_queue_id, contract_name FROM {schema}.service_definition(%s)

-- spec_route --
SELECT * FROM {schema}.route_definition(%s)

-- spec_event_notification --
SELECT * FROM {schema}.event_notification_definition(%s, %s)

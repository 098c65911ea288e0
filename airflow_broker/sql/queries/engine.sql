-- The SQL that Python runs besides calls of the broker's functions, by name
-- (airflow_broker.queries). {schema} is the broker's schema, quoted; %s a parameter. Comments
-- are left out of the text sent.

-- receive --
-- RECEIVE, with what poison detection needs in the same round trip: the receiving
-- transaction's id and the queue's.
SELECT (r.message).*, pg_current_xact_id_if_assigned()::text, r.queue_object_id,
       r.queue_poison_handling
FROM {schema}.receive_with_queue(%s::text, %s::bigint, %s::uuid, %s::uuid) r

-- message_type_validation --
SELECT * FROM {schema}.message_type_validation(%s)

-- queue_id --
-- NULL for a queue the login may not see, as for one that does not exist.
SELECT object_id FROM {schema}.queue_reference(%s)

-- utc_now --
SELECT {schema}.utc_now()

-- advance_clock --
SELECT {schema}.advance_clock(%s)

-- broker_instance --
SELECT {schema}.broker_instance()

-- WAITFOR's waiters, for the engine's wake-ups and the Airflow triggers alike
-- (airflow_broker.waitfor, airflow_broker.triggers)

-- waiter_register --
-- Waiter id, queue id, and whether to clear the rows of waiters whose session is gone first.
SELECT {schema}.wait_register(%s, %s, %s)

-- waiters_remove --
SELECT {schema}.wait_remove(%s::uuid[])

-- Activation (airflow_broker.worker.activation)

-- activation_leader --
-- One worker drives the queue monitors; a session lock is re-entrant, so the leader keeps
-- getting true.
SELECT pg_try_advisory_lock(hashtext('airflow_broker:' || %s || ':activation'))

-- monitored_queues --
SELECT queue_id, name, activation_procedure, execute_as, internal_activation
FROM {schema}.monitored_queues ORDER BY queue_id

-- The broker worker and the transport (airflow_broker.worker)

-- broker_instance_text --
SELECT service_broker_guid::text FROM {schema}.broker_identity

-- outbound_transmissions --
SELECT * FROM {schema}.outbound_transmissions(%s)

-- apply_transmission_outcomes --
-- A column per array, in binary (%b): in text, psycopg quotes each element of a batch of
-- thousands on its own, which cost the transport more than the statement.
SELECT {schema}.apply_transmission_outcomes(%b::bigint[], %b::text[], %b::integer[],
    %b::text[], %b::text[], %b::boolean[], %s::text)

-- accept_transmissions --
-- On the far broker, in its own transaction; the arrays go in binary, as above.
SELECT * FROM {schema}.accept_transmissions(%s, %b::uuid[], %b::boolean[], %b::text[],
    %b::text[], %b::text[], %b::text[], %b::interval[], %b::boolean[], %b::bigint[],
    %b::text[], %b::bytea[], %b::text[], %b::text[])

-- xml_message_types --
-- The far broker's XML message types among those of a batch: the transport checks bodies as
-- they define them. The names are matched outside the join (OFFSET 0 keeps them there): with
-- them inside, the plan for the batch's few names looked much cheaper than the plan for any
-- names, and PostgreSQL planned the statement anew for every batch (150 us).
SELECT x.name, x.validation_kind, x.xml_collection_id, x.schemas
FROM (SELECT t.name, t.validation_kind, t.xml_collection_id, c.schemas
        FROM {schema}.message_types t
        LEFT JOIN {schema}.xml_schema_collections c USING (xml_collection_id)
       WHERE t.validation_kind LIKE '%%XML'
      OFFSET 0) x
WHERE x.name = ANY(%s)

-- statement_timeout --
SELECT set_config('statement_timeout', %s, false)

-- The installer (airflow_broker.migrations)

-- install_lock --
-- Concurrent installs of the same schema wait for each other instead of colliding.
SELECT pg_advisory_lock(hashtext('airflow_broker:' || %s))

-- install_unlock --
SELECT pg_advisory_unlock(hashtext('airflow_broker:' || %s))

-- create_schema --
CREATE SCHEMA IF NOT EXISTS {schema}

-- create_schema_migrations --
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- applied_files --
SELECT name, checksum FROM {schema}.schema_migrations

-- set_search_path --
-- Unqualified names in the files resolve to the broker schema, and functions capture this
-- search_path (SET search_path FROM CURRENT), so the schema name stays configurable. pg_temp
-- goes last: a caller's temporary table must never stand in for a broker table, least of all
-- in a function that runs with its owner's rights.
SET LOCAL search_path TO {schema}, pg_temp

-- record_applied_file --
INSERT INTO {schema}.schema_migrations (name, checksum) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()

-- schema_migrations_exists --
SELECT to_regclass(%s) IS NOT NULL

-- Activated PostgreSQL procedures (airflow_broker.worker.procedures)

-- messages_taken_in_transaction --
-- Whether this transaction has received anything so far: RECEIVE deletes a message from
-- queue_messages, or marks it received on a queue with RETENTION.
SELECT coalesce(sum(n_tup_del + n_tup_upd), 0)::bigint
FROM pg_stat_xact_user_tables WHERE relid = '{schema}.queue_messages'::regclass

-- Permissions (airflow_broker.permissions)

-- database_permissions --
SELECT class_desc, object_name, grantee_name, permission_name, state_desc
FROM {schema}.database_permissions
ORDER BY class, object_name, grantee_name, permission_name

-- Validation by the broker worker (airflow_broker.worker.service)

-- held_for_validation --
-- XML bodies waiting for the worker's validation, oldest first, with what validating them
-- takes; locked until the worker has settled them.
SELECT t.transmission_id, t.message_body, m.name, m.validation_kind, m.xml_collection_id,
       coalesce(c.schemas, '{}')
FROM {schema}.transmissions t
JOIN {schema}.message_types m USING (message_type_id)
LEFT JOIN {schema}.xml_schema_collections c USING (xml_collection_id)
WHERE t.awaiting_validation
ORDER BY t.transmission_id
LIMIT %s
FOR UPDATE OF t SKIP LOCKED

-- settle_validation --
SELECT {schema}.settle_validation(%s, %s)

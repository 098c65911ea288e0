-- Catalog views with SQL Server's names and columns (spec 23). Times are UTC timestamps, ids
-- integers or uuids, flags booleans. principal_id is the owning role's oid, or 1 (SQL Server's
-- dbo) for an object of the broker schema's owner.

CREATE OR REPLACE VIEW service_message_types AS
SELECT name, message_type_id, coalesce(principal_id::bigint::integer, 1) AS principal_id,
       CASE validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E' ELSE 'X' END
           AS validation,
       CASE validation_kind WHEN 'NONE' THEN 'NONE' WHEN 'EMPTY' THEN 'EMPTY' ELSE 'XML' END
           AS validation_desc,
       xml_collection_id,
       validation_kind, is_system
  FROM message_types;

CREATE OR REPLACE VIEW service_contracts AS
SELECT name, service_contract_id, coalesce(principal_id::bigint::integer, 1) AS principal_id,
       is_system
  FROM contracts;

CREATE OR REPLACE VIEW service_contract_message_usages AS
SELECT service_contract_id, message_type_id, is_sent_by_initiator, is_sent_by_target
  FROM contract_message_usages;

CREATE OR REPLACE VIEW service_queues AS
SELECT name, object_id, schema_name, 'SQ'::text AS type, 'SERVICE_QUEUE'::text AS type_desc,
       created_at AS create_date,
       max_readers, activation_procedure,
       CASE WHEN execute_as IS NULL THEN NULL WHEN execute_as = 'OWNER' THEN -2 ELSE 1 END
           AS execute_as_principal_id,
       is_activation_enabled, is_receive_enabled, is_enqueue_enabled, is_retention_enabled,
       is_poison_message_handling_enabled
  FROM queues
 -- Each login sees the queues it owns or holds a permission on (docs/security.md); the
 -- schema's owner is answered once, not per row.
 WHERE (SELECT is_broker_owner()) OR may_see(1::smallint, object_id, principal_id);

-- Beyond SQL Server (spec 5.5): why and since when a queue is disabled, and the role activated
-- readers run as.
CREATE OR REPLACE VIEW queue_status AS
SELECT q.name, q.object_id, q.schema_name, q.is_receive_enabled, q.is_enqueue_enabled,
       q.disabled_reason, q.disabled_at, q.execute_as,
       (SELECT count(*) FROM queue_messages m WHERE m.queue_id = q.object_id AND m.status = 1)
           AS ready_messages,
       (SELECT min(m.enqueued_at) FROM queue_messages m
         WHERE m.queue_id = q.object_id AND m.status = 1) AS oldest_ready_at
  FROM queues q;

CREATE OR REPLACE VIEW services AS
SELECT s.name, s.service_id, coalesce(s.principal_id::bigint::integer, 1) AS principal_id,
       s.service_queue_id, s.is_system
  FROM service_defs s
  JOIN queues q ON q.object_id = s.service_queue_id
 WHERE (SELECT is_broker_owner()) OR may_see(17::smallint, s.service_id, s.principal_id)
    OR may_see(1::smallint, q.object_id, q.principal_id);

CREATE OR REPLACE VIEW service_contract_usages AS
SELECT service_id, service_contract_id FROM service_def_contracts;

CREATE OR REPLACE VIEW service_queue_usages AS
SELECT service_id, service_queue_id FROM service_defs;

CREATE OR REPLACE VIEW conversation_groups AS
SELECT conversation_group_id, service_id, is_system FROM dialog_groups;

CREATE OR REPLACE VIEW conversation_endpoints AS
SELECT e.conversation_handle, e.conversation_id, e.is_initiator, e.service_contract_id,
       e.conversation_group_id, e.service_id, e.lifetime, e.state,
       CASE e.state
           WHEN 'SO' THEN 'STARTED_OUTBOUND' WHEN 'SI' THEN 'STARTED_INBOUND'
           WHEN 'CO' THEN 'CONVERSING' WHEN 'DI' THEN 'DISCONNECTED_INBOUND'
           WHEN 'DO' THEN 'DISCONNECTED_OUTBOUND' WHEN 'ER' THEN 'ERROR'
           WHEN 'CD' THEN 'CLOSED' END AS state_desc,
       e.far_service, e.far_broker_instance,
       1 AS principal_id, 1 AS far_principal_id,
       '00000000-0000-0000-0000-000000000000'::uuid AS outbound_session_key_identifier,
       '00000000-0000-0000-0000-000000000000'::uuid AS inbound_session_key_identifier,
       CASE WHEN e.is_initiator OR e.is_remote THEN e.security_timestamp
            ELSE target_security_timestamp(e.security_timestamp, peer.flag_sent_at)
       END AS security_timestamp,
       e.dialog_timer, e.send_sequence, e.last_send_tran_id,
       e.end_dialog_sequence,
       -- With local delivery every message the peer numbered has arrived; from another
       -- broker, the next one expected in order.
       CASE WHEN e.is_remote THEN e.inbound_sequence
            ELSE coalesce(peer.send_sequence, e.receive_sequence) END AS receive_sequence,
       0 AS receive_sequence_frag, e.system_sequence,
       coalesce(held.first_seq, 0) AS first_out_of_order_sequence,
       coalesce(held.last_seq, 0) AS last_out_of_order_sequence,
       0 AS last_out_of_order_frag,
       e.is_system, e.priority
  FROM endpoints e
  LEFT JOIN endpoints peer ON peer.conversation_handle = e.far_handle
  LEFT JOIN LATERAL (
      SELECT min(m.message_sequence_number) AS first_seq,
             max(m.message_sequence_number) AS last_seq
        FROM queue_messages m
       WHERE e.is_remote AND m.conversation_handle = e.conversation_handle AND m.status = 2
  ) held ON true
 -- A login sees the conversations of the services whose queue it may RECEIVE from.
 WHERE (SELECT is_broker_owner())
    OR (SELECT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
          FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
         WHERE s.service_id = e.service_id);

-- Beyond SQL Server's columns: how often delivery was tried, when last and when next.
CREATE OR REPLACE VIEW transmission_queue AS
SELECT t.conversation_handle, t.to_service_name,
       coalesce(e.far_broker_instance, e.to_broker_instance) AS to_broker_instance,
       t.from_service_name, t.service_contract_name, t.enqueue_time,
       t.message_sequence_number, mt.name AS message_type_name, t.is_conversation_error,
       t.is_end_of_dialog, t.message_body, t.transmission_status, t.priority,
       t.attempts, t.last_attempt_at, t.next_attempt_at
  FROM transmissions t
  JOIN message_types mt ON mt.message_type_id = t.message_type_id
  LEFT JOIN endpoints e ON e.conversation_handle = t.conversation_handle
 -- A login sees what its own services sent (RECEIVE on their queue, as for SEND).
 WHERE (SELECT is_broker_owner())
    OR (SELECT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
          FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
         WHERE s.service_id = e.service_id);

CREATE OR REPLACE VIEW routes AS
SELECT name, route_id, 1 AS principal_id, remote_service_name, broker_instance, lifetime,
       address, mirror_address
  FROM route_defs;

-- sys.databases, for this broker: its instance id and whether it delivers.
CREATE OR REPLACE VIEW databases AS
SELECT current_database()::text AS name, broker_schema() AS broker_schema,
       service_broker_guid, is_broker_enabled
  FROM broker_identity;

-- Sessions waiting in WAITFOR(RECEIVE) per queue (tasks_waiting of
-- sys.dm_broker_queue_monitors); waiters whose session is gone are not counted.
CREATE OR REPLACE VIEW queue_waiting_tasks AS
SELECT q.name AS queue_name, q.object_id AS queue_id,
       count(w.waiter_id) FILTER (
           WHERE EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.backend_pid))
           AS tasks_waiting
  FROM queues q LEFT JOIN queue_waiters w ON w.queue_id = q.object_id
 GROUP BY q.name, q.object_id;

-- The doctor's checks (airflow_broker.admin.doctor): each reads the catalog views and
-- tables a finding is about.

-- doctor_disabled_queues --
SELECT name, is_receive_enabled, is_enqueue_enabled, disabled_reason, disabled_at,
      ready_messages
 FROM {schema}.queue_status WHERE NOT (is_receive_enabled AND is_enqueue_enabled)
ORDER BY name

-- doctor_last_disable_event --
SELECT reason, message_ids FROM {schema}.queue_disable_events e
 JOIN {schema}.queues q ON q.object_id = e.queue_id
WHERE q.name = %s ORDER BY e.disabled_at DESC LIMIT 1

-- doctor_oversized_messages --
SELECT q.name, count(*), max(octet_length(m.message_body)),
      (array_agg(DISTINCT m.conversation_handle))[1:5]
 FROM {schema}.queue_messages m JOIN {schema}.queues q ON q.object_id = m.queue_id
WHERE octet_length(m.message_body) > {schema}.max_message_size()
GROUP BY q.name ORDER BY q.name

-- doctor_activation_settings --
SELECT name, is_activation_enabled, activation_procedure, max_readers
FROM {schema}.queues ORDER BY name

-- doctor_reader_roles --
-- Activated queues whose EXECUTE AS role cannot log in: their readers log in as that role.
SELECT q.name, {schema}.reader_role(q), r.rolname IS NOT NULL
FROM {schema}.queues q
LEFT JOIN pg_roles r ON r.rolname = {schema}.reader_role(q)
WHERE q.is_activation_enabled AND {schema}.reader_role(q) IS NOT NULL
  AND NOT coalesce(r.rolcanlogin, false)
ORDER BY q.name

-- doctor_last_activation --
SELECT DISTINCT ON (a.queue_id) q.name, a.exception
 FROM {schema}.activation_log a JOIN {schema}.queues q ON q.object_id = a.queue_id
WHERE q.is_activation_enabled
ORDER BY a.queue_id, a.started_at DESC

-- doctor_stuck_monitors --
SELECT queue_name, stuck_for, last_activated_time FROM {schema}.stuck_queue_monitors
ORDER BY queue_name

-- doctor_queue_monitors --
SELECT queue_name, state, state_since FROM {schema}.dm_broker_queue_monitors
WHERE queue_name NOT IN (SELECT queue_name FROM {schema}.stuck_queue_monitors)
ORDER BY queue_name

-- doctor_leaked_endpoints --
SELECT service_name, far_service, leaked, oldest FROM {schema}.leaked_endpoint_counts
ORDER BY leaked DESC

-- doctor_transmission_queue --
SELECT to_service_name, transmission_status, count(*), min(enqueue_time),
     max(attempts), min(next_attempt_at)
FROM {schema}.transmission_queue GROUP BY 1, 2 ORDER BY 3 DESC

-- doctor_services_alike --
SELECT name FROM {schema}.service_defs
WHERE lower(name) = lower(%s) AND name <> %s

-- doctor_broker_instance --
SELECT service_broker_guid FROM {schema}.broker_identity

-- doctor_unrouted_far_services --
SELECT DISTINCT far_service FROM {schema}.endpoints
WHERE is_remote AND state NOT IN ('CD', 'ER')
  AND coalesce({schema}.route_address(far_service,
                                 coalesce(far_broker_instance, to_broker_instance)),
                'LOCAL') = 'LOCAL'
ORDER BY 1

-- doctor_remote_routes --
SELECT name, remote_service_name, broker_instance, address FROM {schema}.route_defs
WHERE address NOT IN ('LOCAL', 'TRANSPORT')
  AND (lifetime IS NULL OR lifetime > {schema}.utc_now())
ORDER BY name

-- doctor_route_senders --
SELECT DISTINCT s.name FROM {schema}.endpoints e JOIN {schema}.service_defs s USING (service_id)
 WHERE e.is_remote AND (%s::text IS NULL OR e.far_service = %s)
UNION
SELECT DISTINCT from_service_name FROM {schema}.transmissions
 WHERE %s::text IS NULL OR to_service_name = %s
 ORDER BY 1

-- doctor_unacknowledged --
SELECT e.far_service, e.transmission_status, count(*) FROM {schema}.endpoints e
WHERE e.is_remote AND e.transmission_status <> ''
  AND NOT EXISTS (SELECT 1 FROM {schema}.transmissions t
                   WHERE t.conversation_handle = e.conversation_handle)
GROUP BY 1, 2 ORDER BY 3 DESC

-- doctor_refused_contracts_audited --
SELECT far_service, service_name, count(*) FROM {schema}.error_audit
WHERE code = -8408 GROUP BY 1, 2 ORDER BY 3 DESC

-- doctor_refused_contracts_waiting --
SELECT e.far_service, c.name, count(*) FROM {schema}.endpoints e
 JOIN {schema}.contracts c USING (service_contract_id)
 JOIN {schema}.queue_messages m ON m.conversation_handle = e.conversation_handle
WHERE e.state = 'ER' AND m.message_type_id = 1
  AND {schema}.utf16le_decode(m.message_body) LIKE '%%<Code>-8408</Code>%%'
GROUP BY 1, 2

-- doctor_notifications_without_contract --
SELECT n.name, n.service_name FROM {schema}.event_subscriptions n
WHERE NOT EXISTS (SELECT 1 FROM {schema}.service_defs d
                   JOIN {schema}.service_def_contracts u USING (service_id)
                   JOIN {schema}.contracts c USING (service_contract_id)
                  WHERE d.name = n.service_name
                    AND c.name = 'http://schemas.microsoft.com/SQL/Notifications/PostEventNotification')
ORDER BY 1

-- On a far broker, reached through a route's address

-- doctor_far_identity --
SELECT service_broker_guid::text, is_broker_enabled FROM {schema}.broker_identity

-- doctor_far_service_exists --
SELECT 1 FROM {schema}.service_defs WHERE name = %s

-- doctor_far_service_alike --
SELECT name FROM {schema}.service_defs WHERE lower(name) = lower(%s)

-- doctor_route_back --
SELECT {schema}.route_address(%s, %s)

-- doctor_procedure_exists --
-- An activation procedure of the form schema.procedure, as the worker will CALL it.
SELECT 1 FROM pg_proc WHERE oid = to_regprocedure(%s || '()') AND prokind = 'p'

-- doctor_table_grants --
-- Roles other than the schema's owner (and its members) with rights on its tables.
SELECT a.grantee::regrole::text, string_agg(DISTINCT c.relname, ', ' ORDER BY c.relname)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(c.relacl) a
WHERE n.oid = '{schema}'::regnamespace AND c.relkind IN ('r', 'v', 'S')
  AND a.grantee <> 0 AND NOT pg_has_role(a.grantee, n.nspowner, 'MEMBER')
GROUP BY a.grantee
ORDER BY 1

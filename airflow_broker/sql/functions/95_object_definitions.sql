-- The definition of one broker object, as the login may see it: what BrokerSetupOperator
-- (apply_spec) compares a spec with. Applications hold no right on the catalog's tables, so
-- these are the way to read it; like SQL Server's metadata visibility, an object is shown to
-- its owner, to the schema's owner and to a login holding any permission on it, and is
-- otherwise reported as not there (creating it then fails with 2714, as it would in SQL
-- Server). Routes and XML schema collections are the schema owner's alone: their CREATE
-- statements are not for applications, and route addresses may hold passwords.

CREATE OR REPLACE FUNCTION message_type_definition(p_name text)
RETURNS TABLE (validation_kind text, schema_collection text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT t.validation_kind, c.name
      FROM message_types t LEFT JOIN xml_schema_collections c USING (xml_collection_id)
     WHERE t.name = p_name
       AND (t.is_system OR is_broker_owner()
            OR may_see(15::smallint, t.message_type_id, t.principal_id))
$$;

-- One row per message type of the contract; none when there is no such contract.
CREATE OR REPLACE FUNCTION contract_definition(p_name text)
RETURNS TABLE (message_type_name text, is_sent_by_initiator boolean,
               is_sent_by_target boolean)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT t.name, u.is_sent_by_initiator, u.is_sent_by_target
      FROM contracts c
      JOIN contract_message_usages u USING (service_contract_id)
      JOIN message_types t USING (message_type_id)
     WHERE c.name = p_name
       AND (c.is_system OR is_broker_owner()
            OR may_see(16::smallint, c.service_contract_id, c.principal_id))
$$;

-- The queue named so (find_queue's rules) if the login may see it. The queues it may not see
-- take no part: a name is ambiguous (50105) only among queues the login sees, or an error
-- would tell it that a queue of that name exists in some other schema.
CREATE OR REPLACE FUNCTION visible_queue(p_name text) RETURNS SETOF queues
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_found queues[];
BEGIN
    IF is_broker_owner() THEN
        RETURN QUERY SELECT q.* FROM find_queue(p_name) q WHERE q.object_id IS NOT NULL;
        RETURN;
    END IF;
    v_found := ARRAY(SELECT q FROM queues q
                      WHERE q.name = p_name
                        AND may_see(1::smallint, q.object_id, q.principal_id));
    IF cardinality(v_found) > 1 THEN
        PERFORM raise_error(50105, p_name);
    ELSIF cardinality(v_found) = 0 AND position('.' IN coalesce(p_name, '')) > 0 THEN
        v_found := ARRAY(SELECT q FROM queues q
                          WHERE q.schema_name = split_part(p_name, '.', 1)
                            AND q.name = substr(p_name,
                                                length(split_part(p_name, '.', 1)) + 2)
                            AND may_see(1::smallint, q.object_id, q.principal_id));
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_found);
END
$$;

-- What a client needs of a queue it names: its id, as OBJECT_ID gives it, and whether its
-- rolled-back receives are counted for poison detection. No row when there is no such queue
-- or the login may not see it, so a name tells nobody more than the catalog views do.
-- PL/pgSQL, so that its statement is planned once a session: a WAITFOR that waits looks its
-- queue up every time (a queue's id is not kept), and a SQL function with settings is
-- planned anew on every call.
CREATE OR REPLACE FUNCTION queue_reference(p_name text)
RETURNS TABLE (object_id integer, is_poison_message_handling_enabled boolean)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY SELECT q.object_id, q.is_poison_message_handling_enabled
                   FROM visible_queue(p_name) q;
END
$$;

CREATE OR REPLACE FUNCTION queue_definition(p_name text)
RETURNS TABLE (is_receive_enabled boolean, is_retention_enabled boolean,
               is_activation_enabled boolean, activation_procedure text, max_readers integer,
               execute_as text, is_poison_message_handling_enabled boolean,
               poison_threshold integer, activation_min_readers integer,
               activation_ramp_interval interval, schema_name text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT is_receive_enabled, is_retention_enabled, is_activation_enabled,
           activation_procedure, max_readers, execute_as, is_poison_message_handling_enabled,
           poison_threshold, activation_min_readers, activation_ramp_interval, schema_name
      FROM visible_queue(p_name)
$$;

-- One row per contract of the service (contract NULL for a service without any); none when
-- there is no such service.
CREATE OR REPLACE FUNCTION service_definition(p_name text)
RETURNS TABLE (service_queue_id integer, contract_name text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT s.service_queue_id, c.name
      FROM service_defs s
      JOIN queues q ON q.object_id = s.service_queue_id
      LEFT JOIN service_def_contracts u ON u.service_id = s.service_id
      LEFT JOIN contracts c ON c.service_contract_id = u.service_contract_id
     WHERE s.name = p_name
       AND (is_broker_owner() OR may_see(17::smallint, s.service_id, s.principal_id)
            OR may_see(1::smallint, q.object_id, q.principal_id))
$$;

-- Event notifications belong to their queue: seen by whoever may see the queue.
CREATE OR REPLACE FUNCTION event_notification_definition(p_name text, p_queue text)
RETURNS TABLE (event_types text[], service_name text, broker_instance text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT n.event_types, n.service_name, n.broker_instance
      FROM visible_queue(p_queue) q JOIN event_notifications n ON n.parent_id = q.object_id
     WHERE n.name = p_name
$$;

CREATE OR REPLACE FUNCTION xml_schema_collection_definition(p_name text)
RETURNS TABLE (schemas text[])
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT is_broker_owner() THEN
        PERFORM raise_error(262, 'CREATE XML SCHEMA COLLECTION', current_database());
    END IF;
    RETURN QUERY SELECT c.schemas FROM xml_schema_collections c WHERE c.name = p_name;
END
$$;

CREATE OR REPLACE FUNCTION route_definition(p_name text)
RETURNS TABLE (address text, remote_service_name text, broker_instance text,
               mirror_address text)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT is_broker_owner() THEN
        PERFORM raise_error(262, 'CREATE ROUTE', current_database());
    END IF;
    RETURN QUERY
    SELECT r.address, r.remote_service_name, r.broker_instance, r.mirror_address
      FROM route_defs r WHERE r.name = p_name;
END
$$;

-- A queue's state for EnableQueueOperator, QueueDisabledSensor and enable-queue: queue_status,
-- and why poison detection disabled it last, for a login that may see the queue.
CREATE OR REPLACE FUNCTION queue_state(p_name text)
RETURNS TABLE (name text, schema_name text, is_receive_enabled boolean, disabled_reason text,
               disabled_at timestamp, ready_messages bigint, poison_reason text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT s.name, s.schema_name, s.is_receive_enabled, s.disabled_reason, s.disabled_at,
           s.ready_messages,
           (SELECT e.reason FROM queue_disable_events e
             WHERE e.queue_id = s.object_id ORDER BY e.event_id DESC LIMIT 1)
      FROM visible_queue(p_name) q JOIN queue_status s ON s.object_id = q.object_id
$$;

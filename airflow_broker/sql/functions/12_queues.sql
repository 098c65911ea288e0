-- CREATE / ALTER / DROP QUEUE (spec 5). A queue's rows live in queue_messages; each queue also
-- gets a read-only view named after it, in its own schema, showing Service Broker's columns.

-- Finds a queue by 'name' or 'schema.name'.
CREATE OR REPLACE FUNCTION find_queue(p_name text) RETURNS queues
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_found queues;
    v_count integer := 0;
BEGIN
    FOR q IN SELECT * FROM queues WHERE name = p_name LOOP
        v_count := v_count + 1;
        v_found := q;
    END LOOP;
    IF v_count > 1 THEN
        PERFORM raise_error(50105, p_name);
    ELSIF v_count = 0 AND position('.' IN coalesce(p_name, '')) > 0 THEN
        SELECT * INTO v_found FROM queues
         WHERE schema_name = split_part(p_name, '.', 1)
           AND name = substr(p_name, length(split_part(p_name, '.', 1)) + 2);
    END IF;
    RETURN v_found;
END
$$;

-- The queue a DDL statement names; 15151 when there is none.
CREATE OR REPLACE FUNCTION existing_queue(p_name text) RETURNS queues
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := find_queue(p_name);
BEGIN
    IF q.object_id IS NULL THEN
        PERFORM raise_error(15151, 'queue', coalesce(p_name, 'NULL'));
    END IF;
    RETURN q;
END
$$;

CREATE OR REPLACE FUNCTION reject_queue_dml() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM raise_error(50101, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END
$$;

-- The name of a queue's view. PostgreSQL cuts identifiers at 63 bytes, and queue names may
-- have 128 characters: a name that does not fit keeps its first bytes and gets a hash of the
-- whole name, so two names that differ only after byte 63 get two views. Names that fit are
-- used as they are (public."BrokerageQueue").
CREATE OR REPLACE FUNCTION queue_view_name(p_name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_head text := p_name;
BEGIN
    IF octet_length(p_name) <= 63 THEN
        RETURN p_name;
    END IF;
    WHILE octet_length(v_head) > 54 LOOP
        v_head := left(v_head, -1);
    END LOOP;
    RETURN v_head || '_' || left(md5(p_name), 8);
END
$$;

CREATE OR REPLACE FUNCTION create_queue_view(p_queue_id integer)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
BEGIN
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id;
    EXECUTE format($v$
        CREATE VIEW %I.%I AS
        SELECT m.status, m.priority, m.queuing_order, m.conversation_group_id,
               m.conversation_handle, m.message_sequence_number,
               s.name AS service_name, m.service_id,
               c.name AS service_contract_name, m.service_contract_id,
               t.name AS message_type_name, m.message_type_id,
               CASE t.validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E' ELSE 'X' END
                   AS validation,
               m.message_body, m.message_id
          FROM %I.queue_messages m
          JOIN %I.service_defs s ON s.service_id = m.service_id
          JOIN %I.contracts c ON c.service_contract_id = m.service_contract_id
          JOIN %I.message_types t ON t.message_type_id = m.message_type_id
         WHERE m.queue_id = %s$v$,
        q.schema_name, queue_view_name(q.name), current_schema(), current_schema(),
        current_schema(), current_schema(), p_queue_id);
    EXECUTE format('CREATE TRIGGER reject_dml INSTEAD OF INSERT OR UPDATE OR DELETE ON %I.%I '
                   'FOR EACH ROW EXECUTE FUNCTION %I.reject_queue_dml()',
                   q.schema_name, queue_view_name(q.name), current_schema());
    EXECUTE format('COMMENT ON VIEW %I.%I IS %L', q.schema_name, queue_view_name(q.name),
                   'Service Broker queue ' || q.name || ' (read-only; use RECEIVE)');
END
$$;

-- The two sequences RECEIVE counts on for the queue monitor (see queue_monitor_state).
CREATE OR REPLACE FUNCTION create_queue_counters(p_queue_id integer)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    EXECUTE format('CREATE SEQUENCE %I.%I', current_schema(), 'queue_' || p_queue_id || '_receives');
    EXECUTE format('CREATE SEQUENCE %I.%I', current_schema(),
                   'queue_' || p_queue_id || '_empty_receives');
    UPDATE queues
       SET receive_counter = format('%I.%I', current_schema(),
                                    'queue_' || p_queue_id || '_receives')::regclass,
           empty_receive_counter = format('%I.%I', current_schema(),
                                          'queue_' || p_queue_id || '_empty_receives')::regclass
     WHERE object_id = p_queue_id;
END
$$;

CREATE OR REPLACE FUNCTION check_activation(p_status boolean, p_max_readers integer)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF p_max_readers IS NOT NULL AND (p_max_readers < 0 OR p_max_readers > 32767) THEN
        PERFORM raise_error(50106, p_max_readers::text, 'MAX_QUEUE_READERS', '0 to 32767');
    END IF;
    IF p_status AND coalesce(p_max_readers, 0) = 0 THEN
        RAISE WARNING 'Msg 9648: The queue has activation enabled and MAX_QUEUE_READERS is 0; no procedures will be activated.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION create_queue(
    p_name text,
    p_status boolean DEFAULT true,
    p_retention boolean DEFAULT false,
    p_activation_status boolean DEFAULT NULL,
    p_activation_procedure text DEFAULT NULL,
    p_max_queue_readers integer DEFAULT NULL,
    p_execute_as text DEFAULT NULL,
    p_poison_message_handling boolean DEFAULT true,
    p_schema text DEFAULT 'public')
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id integer;
    v_has_activation boolean := p_activation_status IS NOT NULL
        OR p_activation_procedure IS NOT NULL OR p_max_queue_readers IS NOT NULL
        OR p_execute_as IS NOT NULL;
BEGIN
    PERFORM require_create('CREATE QUEUE');
    PERFORM check_execute_as(p_execute_as);
    PERFORM check_name(p_name);
    PERFORM check_name(p_schema);
    IF left(p_name, 1) = '#' THEN
        PERFORM raise_error(102, p_name);
    END IF;
    IF position('.' IN p_name) > 0 THEN
        -- A statement naming "a.b" means queue b in schema a: a queue named so could never
        -- be told from it.
        PERFORM raise_error(50121, p_name);
    END IF;
    IF p_status IS NULL OR p_retention IS NULL OR p_poison_message_handling IS NULL THEN
        PERFORM raise_error(50106, 'NULL', 'STATUS, RETENTION or POISON_MESSAGE_HANDLING',
                            'ON or OFF');
    END IF;
    PERFORM check_activation(coalesce(p_activation_status, v_has_activation), p_max_queue_readers);
    IF EXISTS (SELECT 1 FROM queues WHERE schema_name = p_schema AND name = p_name)
       OR to_regclass(format('%I.%I', p_schema, queue_view_name(p_name))) IS NOT NULL THEN
        PERFORM raise_error(2714, p_schema || '.' || p_name);
    END IF;
    IF to_regnamespace(format('%I', p_schema)) IS NULL THEN
        PERFORM raise_error(15151, 'schema', p_schema);
    END IF;
    INSERT INTO queues (schema_name, name, is_receive_enabled, is_enqueue_enabled,
                        is_retention_enabled, is_poison_message_handling_enabled,
                        is_activation_enabled, activation_procedure, max_readers, execute_as,
                        disabled_reason, disabled_at, created_at, principal_id)
    VALUES (p_schema, p_name, p_status, p_status, p_retention, p_poison_message_handling,
            coalesce(p_activation_status, v_has_activation), p_activation_procedure,
            coalesce(p_max_queue_readers, 0), p_execute_as,
            CASE WHEN p_status THEN NULL ELSE 'ADMIN' END,
            CASE WHEN p_status THEN NULL ELSE utc_now() END, utc_now(), creation_owner())
    RETURNING object_id INTO v_id;
    PERFORM create_queue_view(v_id);
    PERFORM create_queue_counters(v_id);
    RETURN v_id;
END
$$;

-- NULL arguments leave a setting as it is.
CREATE OR REPLACE FUNCTION alter_queue(
    p_name text,
    p_status boolean DEFAULT NULL,
    p_retention boolean DEFAULT NULL,
    p_activation_status boolean DEFAULT NULL,
    p_activation_procedure text DEFAULT NULL,
    p_max_queue_readers integer DEFAULT NULL,
    p_execute_as text DEFAULT NULL,
    p_poison_message_handling boolean DEFAULT NULL,
    p_drop_activation boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues := existing_queue(p_name);
BEGIN
    PERFORM require_on_object('ALTER', 1::smallint, q.object_id, q.principal_id, 'queue',
                              p_name);
    PERFORM check_execute_as(p_execute_as);
    PERFORM check_activation(coalesce(p_activation_status, q.is_activation_enabled)
                                 AND NOT coalesce(p_drop_activation, false),
                             coalesce(p_max_queue_readers, q.max_readers));
    IF coalesce(p_activation_status, false) AND NOT coalesce(p_drop_activation, false)
       AND EXISTS (SELECT 1 FROM event_subscriptions n
                    WHERE n.queue_id = q.object_id
                      AND 'QUEUE_ACTIVATION' = ANY (n.event_types)) THEN
        PERFORM raise_error(9717, q.name);
    END IF;
    IF p_activation_status AND NOT q.is_activation_enabled THEN
        -- Turning activation back on recycles the monitor, the documented way out of a
        -- monitor stuck in NOTIFIED (spec 20.4).
        DELETE FROM queue_monitor_state WHERE queue_id = q.object_id;
    END IF;
    UPDATE queues SET
        is_receive_enabled = coalesce(p_status, is_receive_enabled),
        is_enqueue_enabled = coalesce(p_status, is_enqueue_enabled),
        disabled_reason = CASE WHEN p_status IS NULL THEN disabled_reason
                               WHEN p_status THEN NULL ELSE 'ADMIN' END,
        disabled_at = CASE WHEN p_status IS NULL THEN disabled_at
                           WHEN p_status THEN NULL ELSE utc_now() END,
        is_retention_enabled = coalesce(p_retention, is_retention_enabled),
        is_poison_message_handling_enabled =
            coalesce(p_poison_message_handling, is_poison_message_handling_enabled),
        is_activation_enabled = CASE WHEN p_drop_activation THEN false
                                     ELSE coalesce(p_activation_status, is_activation_enabled) END,
        activation_procedure = CASE WHEN p_drop_activation THEN NULL
                                    ELSE coalesce(p_activation_procedure, activation_procedure) END,
        max_readers = CASE WHEN p_drop_activation THEN 0
                           ELSE coalesce(p_max_queue_readers, max_readers) END,
        execute_as = CASE WHEN p_drop_activation THEN NULL
                          ELSE coalesce(p_execute_as, execute_as) END
     WHERE object_id = q.object_id
    RETURNING * INTO q;
    IF p_execute_as IS NOT NULL OR p_activation_procedure IS NOT NULL THEN
        -- Whoever chooses the code or the identity must be able to act as the role it runs
        -- as: ALTER on a queue someone else owns does not lend that owner's rights.
        PERFORM check_reader_identity(q);
    END IF;
    IF p_status THEN
        -- Messages held while the queue was disabled arrive now, in order.
        PERFORM retry_transmissions(2147483647, true);
    ELSIF p_status = false THEN
        -- A WAITFOR on a disabled queue ends with 9617 at once.
        PERFORM wake_waiters(q.object_id);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION drop_queue(p_name text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues := existing_queue(p_name);
    v_service text;
BEGIN
    PERFORM require_on_object('CONTROL', 1::smallint, q.object_id, q.principal_id, 'queue',
                              p_name);
    SELECT name INTO v_service FROM service_defs WHERE service_queue_id = q.object_id
     ORDER BY name LIMIT 1;
    IF v_service IS NOT NULL THEN
        PERFORM raise_error(3729, 'QUEUE', p_name, 'service', v_service);
    END IF;
    EXECUTE format('DROP VIEW IF EXISTS %I.%I', q.schema_name, queue_view_name(q.name));
    DELETE FROM queue_messages WHERE queue_id = q.object_id;
    DELETE FROM queues WHERE object_id = q.object_id;
    EXECUTE format('DROP SEQUENCE IF EXISTS %s, %s', q.receive_counter, q.empty_receive_counter);
END
$$;

-- Settings beyond SQL Server: the activation ramp-up interval (SQL Server: 5 seconds), a floor of
-- activated readers while messages wait, and the number of consecutive rolled-back receiving
-- transactions that disables the queue (SQL Server: 5). NULL keeps a setting.
CREATE OR REPLACE FUNCTION tune_queue(p_name text, p_ramp_interval interval DEFAULT NULL,
                                      p_min_readers integer DEFAULT NULL,
                                      p_poison_threshold integer DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues := existing_queue(p_name);
BEGIN
    PERFORM require_on_object('ALTER', 1::smallint, q.object_id, q.principal_id, 'queue',
                              p_name);
    IF p_ramp_interval < interval '0' THEN
        PERFORM raise_error(50106, p_ramp_interval::text, 'the activation ramp-up interval',
                            'an interval of 0 or more');
    END IF;
    IF p_min_readers < 0 OR p_min_readers > 32767 THEN
        PERFORM raise_error(50106, p_min_readers::text, 'the minimum of activated readers',
                            '0 to 32767');
    END IF;
    IF p_poison_threshold < 1 THEN
        PERFORM raise_error(50106, p_poison_threshold::text, 'the poison threshold',
                            'a number of rollbacks of 1 or more');
    END IF;
    UPDATE queues SET activation_ramp_interval = coalesce(p_ramp_interval, activation_ramp_interval),
                      activation_min_readers = coalesce(p_min_readers, activation_min_readers),
                      poison_threshold = coalesce(p_poison_threshold, poison_threshold)
     WHERE object_id = q.object_id;
END
$$;

-- CREATE / DROP EVENT NOTIFICATION ON QUEUE (spec 19): QUEUE_ACTIVATION and
-- BROKER_QUEUE_DISABLED, delivered as EventNotification messages on a dialog of their own from
-- the broker's event notification service to the subscribed service.

CREATE OR REPLACE FUNCTION xml_text(p_value text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT replace(replace(replace(coalesce(p_value, ''), '&', '&amp;'), '<', '&lt;'), '>', '&gt;')
$$;

-- The broker's own initiator service for event notifications, created on first use. Replies on
-- its dialogs (the subscriber's EndDialog or Error) arrive on its queue. It belongs to the
-- schema's owner whoever creates the first notification, and needs no CREATE permission of
-- theirs: CREATE EVENT NOTIFICATION asks for ALTER on the queue only.
CREATE OR REPLACE FUNCTION event_notification_service() RETURNS text
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_name constant text := 'http://schemas.microsoft.com/SQL/Notifications/EventNotificationService';
    v_queue_id integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM service_defs WHERE name = v_name) THEN
        INSERT INTO queues (schema_name, name, created_at)
        VALUES (current_schema(), 'EventNotificationQueue', utc_now())
        RETURNING object_id INTO v_queue_id;
        PERFORM create_queue_view(v_queue_id);
        PERFORM create_queue_counters(v_queue_id);
        INSERT INTO service_defs (name, service_queue_id, created_at, is_system)
        VALUES (v_name, v_queue_id, utc_now(), true);
    END IF;
    RETURN v_name;
END
$$;

CREATE OR REPLACE FUNCTION create_event_notification(
    p_name text, p_queue text, p_events text[], p_service text,
    p_broker_instance text DEFAULT 'current database')
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_event text;
    v_events text[] := '{}';
    v_id integer;
BEGIN
    PERFORM check_name(p_name);
    q := existing_queue(p_queue);
    -- SQL Server: an event notification on a queue needs ALTER on the queue.
    PERFORM require_on_object('ALTER', 1::smallint, q.object_id, q.principal_id, 'queue',
                              p_queue);
    IF p_service IS NULL THEN
        PERFORM raise_error(8421);
    END IF;
    IF coalesce(cardinality(p_events), 0) = 0 THEN
        PERFORM raise_error(50110, 'NULL');
    END IF;
    FOREACH v_event IN ARRAY p_events LOOP
        IF upper(coalesce(v_event, '')) NOT IN ('QUEUE_ACTIVATION', 'BROKER_QUEUE_DISABLED') THEN
            PERFORM raise_error(50110, coalesce(v_event, 'NULL'));
        END IF;
        v_events := v_events || upper(v_event);
    END LOOP;
    IF 'QUEUE_ACTIVATION' = ANY (v_events) AND q.is_activation_enabled
       AND q.activation_procedure IS NOT NULL THEN
        PERFORM raise_error(9718, q.name);
    END IF;
    IF EXISTS (SELECT 1 FROM event_subscriptions WHERE queue_id = q.object_id AND name = p_name)
    THEN
        PERFORM raise_error(2714, p_name);
    END IF;
    INSERT INTO event_subscriptions (name, queue_id, event_types, service_name, broker_instance,
                                     created_at)
    VALUES (p_name, q.object_id, ARRAY(SELECT DISTINCT unnest(v_events) ORDER BY 1), p_service,
            coalesce(p_broker_instance, 'current database'), utc_now())
    RETURNING object_id INTO v_id;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION drop_event_notification(p_name text, p_queue text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues := find_queue(p_queue);
    n event_subscriptions;
BEGIN
    SELECT * INTO n FROM event_subscriptions WHERE queue_id = q.object_id AND name = p_name;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'event notification', coalesce(p_name, 'NULL'));
    END IF;
    PERFORM require_on_object('ALTER', 1::smallint, q.object_id, q.principal_id, 'queue',
                              p_queue);
    IF n.conversation_handle IS NOT NULL
       AND EXISTS (SELECT 1 FROM endpoints WHERE conversation_handle = n.conversation_handle
                      AND state IN ('SO', 'CO')) THEN
        -- The notification's dialog ends with it; the subscriber receives the EndDialog.
        PERFORM end_conversation(n.conversation_handle);
    END IF;
    DELETE FROM event_subscriptions WHERE object_id = n.object_id;
END
$$;

-- The EVENT_INSTANCE documents of spec 19.3, with exactly SQL Server's element names.
CREATE OR REPLACE FUNCTION event_instance(p_queue_id integer, p_event_type text,
                                          p_sequence bigint)
RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_post text := to_char(utc_now(), 'YYYY-MM-DD"T"HH24:MI:SS.MS');
BEGIN
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id;
    IF p_event_type = 'QUEUE_ACTIVATION' THEN
        RETURN '<EVENT_INSTANCE><EventType>QUEUE_ACTIVATION</EventType>'
            || '<PostTime>' || v_post || '</PostTime>'
            || '<SPID>' || pg_backend_pid() || '</SPID>'
            || '<ServerName>' || xml_text(coalesce(host(inet_server_addr()), 'localhost'))
            || '</ServerName>'
            || '<LoginName>' || xml_text(session_user::text) || '</LoginName>'
            || '<UserName>' || xml_text(current_user::text) || '</UserName>'
            || '<DatabaseName>' || xml_text(current_database()::text) || '</DatabaseName>'
            || '<SchemaName>' || xml_text(q.schema_name) || '</SchemaName>'
            || '<ObjectName>' || xml_text(q.name) || '</ObjectName>'
            || '<ObjectType>QUEUE</ObjectType></EVENT_INSTANCE>';
    END IF;
    RETURN '<EVENT_INSTANCE><EventType>BROKER_QUEUE_DISABLED</EventType>'
        || '<PostTime>' || v_post || '</PostTime>'
        || '<SPID>' || pg_backend_pid() || '</SPID>'
        || '<DatabaseID>' || (SELECT oid FROM pg_database WHERE datname = current_database())
        || '</DatabaseID>'
        || '<TransactionID/><NTUserName/><NTDomainName/><HostName/><ClientProcessID/>'
        || '<ApplicationName/>'
        || '<StartTime>' || v_post || '</StartTime>'
        || '<ObjectID>' || q.object_id || '</ObjectID>'
        || '<ServerName>' || xml_text(coalesce(host(inet_server_addr()), 'localhost'))
        || '</ServerName>'
        || '<LoginSid/><EventSequence>' || p_sequence || '</EventSequence>'
        || '<IsSystem>1</IsSystem></EVENT_INSTANCE>';
END
$$;

-- Sends the event to every notification on the queue that subscribes to it, each on its own
-- dialog (begun on the first event and kept open). Returns how many were sent.
CREATE OR REPLACE FUNCTION fire_event(p_queue_id integer, p_event_type text)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    n event_subscriptions;
    v_service text;
    v_handle uuid;
    v_count integer := 0;
BEGIN
    -- The notification is the broker's, whoever's session raised the event: no permission of
    -- that login is asked for (V015).
    INSERT INTO broker_actions VALUES (pg_backend_pid(), pg_current_xact_id())
    ON CONFLICT DO NOTHING;
    FOR n IN SELECT * FROM event_subscriptions
              WHERE queue_id = p_queue_id AND p_event_type = ANY (event_types)
              ORDER BY object_id
                FOR UPDATE
    LOOP
        v_handle := n.conversation_handle;
        IF v_handle IS NULL OR NOT EXISTS (SELECT 1 FROM endpoints
                                            WHERE conversation_handle = v_handle
                                              AND state IN ('SO', 'CO')) THEN
            v_service := event_notification_service();
            v_handle := begin_dialog(v_service, n.service_name,
                                     'http://schemas.microsoft.com/SQL/Notifications/PostEventNotification');
            UPDATE event_subscriptions SET conversation_handle = v_handle
             WHERE object_id = n.object_id;
        END IF;
        PERFORM send(ARRAY[v_handle],
                     'http://schemas.microsoft.com/SQL/Notifications/EventNotification',
                     utf16le(event_instance(p_queue_id, p_event_type, nextval('event_sequence'))),
                     false, 'WELL_FORMED_XML', NULL);
        v_count := v_count + 1;
    END LOOP;
    DELETE FROM broker_actions WHERE backend_pid = pg_backend_pid();
    RETURN v_count;
END
$$;

-- What subscribers send back on notification dialogs: an EndDialog or Error ends the dialog
-- and drops the notification, as in SQL Server (spec 19.1).
CREATE OR REPLACE FUNCTION process_notification_replies(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    m received_message;
    v_count integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queues WHERE name = 'EventNotificationQueue'
                      AND schema_name = current_schema()) THEN
        RETURN 0;
    END IF;
    FOR m IN SELECT * FROM receive(current_schema() || '.EventNotificationQueue', p_limit) LOOP
        IF m.message_type_id IN (1, 2) THEN
            DELETE FROM event_subscriptions WHERE conversation_handle = m.conversation_handle;
            IF EXISTS (SELECT 1 FROM endpoints WHERE conversation_handle = m.conversation_handle
                          AND state NOT IN ('DO', 'CD')) THEN
                PERFORM end_conversation(m.conversation_handle);
            END IF;
        END IF;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

CREATE OR REPLACE VIEW event_notifications AS
SELECT n.name, n.object_id, 'QUEUE'::text AS parent_class_desc, n.queue_id AS parent_id,
       n.created_at AS create_date, n.service_name, n.broker_instance, n.event_types,
       n.conversation_handle
  FROM event_subscriptions n;

-- The queue a BROKER_QUEUE_DISABLED event is about, and its database's name: by the event's
-- object id, or by name for an event without one. None for a queue the login may not see,
-- as for one that does not exist.
CREATE OR REPLACE FUNCTION queue_of_event(p_database_id oid, p_object_id integer, p_name text)
RETURNS TABLE (name text, schema_name text, database_name name)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT q.name, q.schema_name, d.datname
      FROM queues q
      LEFT JOIN pg_database d ON d.oid = p_database_id
     WHERE (q.object_id = p_object_id OR (q.name = p_name AND p_object_id IS NULL))
       AND (is_broker_owner() OR may_see(1::smallint, q.object_id, q.principal_id))
$$;

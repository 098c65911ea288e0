-- SEND ON CONVERSATION (spec 7). One call, one round trip: checks every handle under its
-- conversation-group lock, numbers the message per conversation and puts it straight on the
-- destination queue in the caller's transaction (or in the transmission queue when it cannot be
-- delivered yet). Readers see it when the caller commits.

-- What the target does with a body (spec 2.6): NULL when acceptable, else the Error to return.
-- XML verdicts come from the Python API (lxml) and are trusted only when they were made for the
-- type's current validation; PostgreSQL itself can check UTF-8 bodies for well-formedness.
CREATE OR REPLACE FUNCTION body_rejection(p_type message_types, p_body bytea,
                                          p_checked_as text, p_xml_error text,
                                          OUT code integer, OUT description text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_expected text := p_type.validation_kind
        || CASE WHEN p_type.validation_kind = 'VALID_XML'
                THEN ':' || p_type.xml_collection_id::text ELSE '' END;
    v_ok boolean;
BEGIN
    IF p_type.validation_kind = 'NONE' THEN
        RETURN;
    ELSIF p_type.validation_kind = 'EMPTY' THEN
        IF p_body IS NOT NULL THEN
            code := -8430;
            description := 'The message body failed the configured validation.';
        END IF;
        RETURN;
    ELSIF p_body IS NULL THEN
        RETURN;
    END IF;
    IF p_checked_as IS NOT DISTINCT FROM v_expected THEN
        v_ok := p_xml_error IS NULL;
    ELSIF p_type.validation_kind = 'VALID_XML' THEN
        PERFORM raise_error(50103, p_type.name,
                            (SELECT name FROM xml_schema_collections
                              WHERE xml_collection_id = p_type.xml_collection_id));
    ELSIF substr(p_body, 1, 2) IN ('\xfffe'::bytea, '\xfeff'::bytea) THEN
        -- PostgreSQL has no UTF-16 decoder.
        PERFORM raise_error(50108, p_type.name);
    ELSE
        BEGIN
            v_ok := xml_is_well_formed_content(convert_from(p_body, 'UTF8'));
        EXCEPTION
            WHEN character_not_in_repertoire OR untranslatable_character THEN
                v_ok := false;
            WHEN feature_not_supported THEN
                -- PostgreSQL built without libxml cannot parse XML at all.
                PERFORM raise_error(50108, p_type.name);
        END;
    END IF;
    IF NOT v_ok THEN
        code := -9615;
        description := format('A message of type ''%s'' failed XML validation on the target service. %s',
                              p_type.name, coalesce(p_xml_error, 'The body is not well-formed XML.'));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION send(
    p_handles uuid[],
    p_message_type text,
    p_body bytea,
    p_body_omitted boolean,
    p_checked_as text,
    p_xml_error text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_type message_types;
    v_body bytea := nullif(p_body, '\x'::bytea);
    v_now timestamp;
    v_found integer := 0;
    e record;
    v_seq bigint;
    v_peer uuid;
    v_dest_handle uuid;
    v_dest_group uuid;
    v_dest_service integer;
    v_dest_queue integer;
    v_dest_enabled boolean;
    v_supports boolean;
    v_reject record;
    v_status text;
BEGIN
    IF p_handles IS NULL OR cardinality(p_handles) = 0
       OR array_position(p_handles, NULL) IS NOT NULL THEN
        PERFORM raise_error(8418);
    END IF;
    IF cardinality(p_handles) > 1 THEN
        SELECT h INTO v_peer FROM unnest(p_handles) h GROUP BY h HAVING count(*) > 1 LIMIT 1;
        IF v_peer IS NOT NULL THEN
            PERFORM raise_error(50102, v_peer::text);
        END IF;
    END IF;
    SELECT * INTO v_type FROM message_types WHERE name = p_message_type;
    IF NOT FOUND THEN
        PERFORM raise_error(8428, coalesce(p_message_type, 'NULL'));
    END IF;
    IF p_body IS NULL AND NOT coalesce(p_body_omitted, false) THEN
        PERFORM raise_error(8433);
    END IF;
    v_now := utc_now();

    FOR e IN
        SELECT ce.conversation_handle, ce.conversation_id, ce.is_initiator, ce.state,
               ce.service_contract_id, ce.conversation_group_id, ce.service_id, ce.far_handle,
               ce.far_service, ce.lifetime, ce.send_sequence, ce.priority,
               s.name AS service_name, s.service_queue_id,
               q.name AS queue_name, q.is_enqueue_enabled, q.is_retention_enabled,
               u.message_type_id IS NOT NULL AS in_contract,
               u.is_sent_by_initiator, u.is_sent_by_target
          FROM endpoints ce
          JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
          JOIN service_defs s ON s.service_id = ce.service_id
          JOIN queues q ON q.object_id = s.service_queue_id
          LEFT JOIN contract_message_usages u
                 ON u.service_contract_id = ce.service_contract_id
                AND u.message_type_id = v_type.message_type_id
         WHERE ce.conversation_handle = ANY (p_handles)
         ORDER BY ce.conversation_handle
           FOR NO KEY UPDATE OF ce, g
    LOOP
        v_found := v_found + 1;
        IF e.state NOT IN ('SO', 'CO') THEN
            PERFORM raise_error(8429, e.state);
        END IF;
        IF NOT e.in_contract THEN
            PERFORM raise_error(8431, v_type.name);
        END IF;
        IF e.is_initiator AND NOT e.is_sent_by_initiator THEN
            PERFORM raise_error(8432, v_type.name);
        END IF;
        IF NOT e.is_initiator AND NOT e.is_sent_by_target THEN
            PERFORM raise_error(8434, v_type.name);
        END IF;
        IF e.is_retention_enabled AND NOT e.is_enqueue_enabled THEN
            PERFORM raise_error(9618, e.queue_name);
        END IF;
        v_seq := e.send_sequence;
        v_status := NULL;
        v_dest_handle := NULL;
        v_dest_group := NULL;
        v_dest_service := NULL;
        v_dest_queue := NULL;
        v_dest_enabled := NULL;

        IF e.far_handle IS NOT NULL THEN
            SELECT ce.conversation_handle, ce.conversation_group_id, ce.service_id,
                   s.service_queue_id, q.is_enqueue_enabled
              INTO v_dest_handle, v_dest_group, v_dest_service, v_dest_queue, v_dest_enabled
              FROM endpoints ce
              JOIN service_defs s ON s.service_id = ce.service_id
              JOIN queues q ON q.object_id = s.service_queue_id
             WHERE ce.conversation_handle = e.far_handle AND ce.state NOT IN ('DO', 'CD');
            IF v_dest_handle IS NULL THEN
                -- The peer was removed WITH CLEANUP or has already closed.
                PERFORM deliver_error(e.conversation_handle, -8462,
                    'The remote conversation endpoint is either in a state where no more '
                    'messages can be exchanged, or it has been dropped.');
                v_status := 'rejected';
            END IF;
        ELSIF EXISTS (SELECT 1 FROM transmissions
                       WHERE conversation_handle = e.conversation_handle) THEN
            -- Earlier messages are still waiting: this one waits behind them, in order.
            v_status := (SELECT transmission_status FROM transmissions
                          WHERE conversation_handle = e.conversation_handle
                          ORDER BY message_sequence_number DESC LIMIT 1);
        ELSE
            -- First message of the dialog: the target service is looked up byte for byte.
            SELECT s.service_id, s.service_queue_id, q.is_enqueue_enabled,
                   EXISTS (SELECT 1 FROM service_def_contracts u
                            WHERE u.service_id = s.service_id
                              AND u.service_contract_id = e.service_contract_id)
              INTO v_dest_service, v_dest_queue, v_dest_enabled, v_supports
              FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
             WHERE s.name = e.far_service;
            IF v_dest_service IS NULL THEN
                v_status := format('The target service name ''%s'' could not be found. Ensure '
                                   'that the service name is specified correctly and/or the '
                                   'routing information has been supplied.', e.far_service);
            ELSIF NOT v_supports THEN
                PERFORM deliver_error(e.conversation_handle, -8408,
                    format('Target service ''%s'' does not support contract ''%s''.',
                           e.far_service,
                           (SELECT name FROM contracts
                             WHERE service_contract_id = e.service_contract_id)));
                v_status := 'rejected';
            END IF;
        END IF;

        IF v_status IS NULL THEN
            v_reject := body_rejection(v_type, v_body, p_checked_as, p_xml_error);
            IF v_reject.code IS NOT NULL THEN
                PERFORM deliver_error(e.conversation_handle, v_reject.code,
                                      v_reject.description);
                v_status := 'rejected';
            ELSIF NOT v_dest_enabled THEN
                v_status := 'The target queue is disabled.';
            END IF;
        END IF;

        IF v_status IS NULL THEN
            IF e.far_handle IS NULL THEN
                -- The first message creates the target endpoint and its own group.
                v_dest_handle := gen_random_uuid();
                v_dest_group := gen_random_uuid();
                INSERT INTO dialog_groups (conversation_group_id, service_id)
                VALUES (v_dest_group, v_dest_service);
                INSERT INTO endpoints (
                    conversation_handle, conversation_id, is_initiator, service_contract_id,
                    conversation_group_id, service_id, far_handle, far_service, lifetime, state,
                    created_at)
                VALUES (
                    v_dest_handle, e.conversation_id, false, e.service_contract_id,
                    v_dest_group, v_dest_service, e.conversation_handle, e.service_name,
                    e.lifetime, 'CO', v_now);
                UPDATE endpoints SET far_handle = v_dest_handle
                 WHERE conversation_handle = e.conversation_handle;
            END IF;
            INSERT INTO queue_messages (queue_id, priority, conversation_group_id,
                                        conversation_handle, message_sequence_number,
                                        service_id, service_contract_id, message_type_id,
                                        message_body, message_id, enqueued_at)
            VALUES (v_dest_queue, e.priority, v_dest_group,
                    v_dest_handle, v_seq, v_dest_service, e.service_contract_id,
                    v_type.message_type_id, v_body, gen_random_uuid(), v_now);
            PERFORM wake_waiters(v_dest_queue);
        ELSIF v_status <> 'rejected' THEN
            INSERT INTO transmissions (conversation_handle, to_service_name,
                                            from_service_name, service_contract_name,
                                            enqueue_time, message_sequence_number,
                                            message_type_id, message_body, priority,
                                            transmission_status, message_id)
            VALUES (e.conversation_handle, e.far_service, e.service_name,
                    (SELECT name FROM contracts WHERE service_contract_id = e.service_contract_id),
                    v_now, v_seq, v_type.message_type_id, v_body, e.priority, v_status,
                    gen_random_uuid());
        END IF;

        IF e.is_retention_enabled THEN
            INSERT INTO queue_messages (queue_id, status, priority, conversation_group_id,
                                        conversation_handle, message_sequence_number,
                                        service_id, service_contract_id, message_type_id,
                                        message_body, message_id, enqueued_at)
            VALUES (e.service_queue_id, 3, e.priority, e.conversation_group_id,
                    e.conversation_handle, v_seq, e.service_id, e.service_contract_id,
                    v_type.message_type_id, v_body, gen_random_uuid(), v_now);
        END IF;

        UPDATE endpoints
           SET send_sequence = v_seq + 1,
               state = CASE WHEN state = 'SO' AND v_status IS DISTINCT FROM 'rejected'
                            THEN 'CO' ELSE state END
         WHERE conversation_handle = e.conversation_handle;
    END LOOP;

    IF v_found < cardinality(p_handles) THEN
        SELECT h INTO v_peer FROM unnest(p_handles) h
         WHERE NOT EXISTS (SELECT 1 FROM endpoints
                            WHERE conversation_handle = h)
         LIMIT 1;
        PERFORM raise_error(8426, v_peer::text);
    END IF;
END
$$;

-- SEND with the body omitted: an empty (NULL) body.
CREATE OR REPLACE FUNCTION send(p_handles uuid[], p_message_type text DEFAULT 'DEFAULT')
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT send(p_handles, p_message_type, NULL::bytea, true, NULL::text, NULL::text)
$$;

-- SEND with a body expression; a NULL expression is error 8433, as in SQL Server.
CREATE OR REPLACE FUNCTION send(p_handles uuid[], p_message_type text, p_body bytea)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT send(p_handles, p_message_type, p_body, false, NULL::text, NULL::text)
$$;

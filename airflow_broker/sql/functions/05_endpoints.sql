-- What happens to endpoints besides SEND and RECEIVE: closing and deleting them, holding
-- messages in the transmission queue, and the audit of errors nobody will receive.

-- Removes an endpoint with everything it still holds; its group goes when it is empty.
CREATE OR REPLACE FUNCTION delete_endpoint(p_handle uuid)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_group uuid;
BEGIN
    DELETE FROM queue_messages WHERE conversation_handle = p_handle;
    DELETE FROM transmissions WHERE conversation_handle = p_handle;
    DELETE FROM endpoints WHERE conversation_handle = p_handle
    RETURNING conversation_group_id INTO v_group;
    DELETE FROM dialog_groups g
     WHERE g.conversation_group_id = v_group
       AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.conversation_group_id = v_group);
END
$$;

-- The endpoint is CLOSED: an initiator is deleted at once; a target stays until reclaimed, so a
-- replayed message 0 cannot open the dialog again (spec 15.1).
CREATE OR REPLACE FUNCTION close_endpoint(p_handle uuid)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF (SELECT is_initiator FROM endpoints WHERE conversation_handle = p_handle) THEN
        PERFORM delete_endpoint(p_handle);
    ELSE
        DELETE FROM queue_messages WHERE conversation_handle = p_handle;
        UPDATE endpoints SET state = 'CD', dialog_timer = '1900-01-01'
         WHERE conversation_handle = p_handle;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION audit_error(p_handle uuid, p_body bytea, p_reason text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_code integer;
    v_description text;
    v_text text;
BEGIN
    -- Broker-generated bodies are UTF-16; application bodies may be anything, so the audit
    -- keeps whatever Code and Description it can read and never fails on the body.
    BEGIN
        v_text := convert_from(p_body, 'UTF8');
    EXCEPTION WHEN OTHERS THEN
        v_text := NULL;
    END;
    IF v_text IS NULL AND substr(p_body, 1, 2) = '\xfffe'::bytea THEN
        v_text := utf16le_decode(p_body);
    END IF;
    v_code := substring(v_text FROM '<Code>(-?[0-9]+)</Code>')::integer;
    v_description := substring(v_text FROM '<Description>(.*)</Description>');
    INSERT INTO error_audit (recorded_at, conversation_handle, conversation_id, is_initiator,
                             service_name, far_service, code, description, reason)
    SELECT utc_now(), e.conversation_handle, e.conversation_id, e.is_initiator, s.name,
           e.far_service, v_code, v_description, p_reason
      FROM endpoints e JOIN service_defs s USING (service_id)
     WHERE e.conversation_handle = p_handle;
END
$$;

-- ASCII and BMP text back from the UTF-16LE bodies the broker writes (for the audit only).
CREATE OR REPLACE FUNCTION utf16le_decode(p_body bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path FROM CURRENT AS $$
DECLARE
    v_out text := '';
    v_unit integer;
BEGIN
    FOR i IN 1 .. (length(p_body) / 2) - 1 LOOP
        v_unit := get_byte(p_body, 2 * i) + 256 * get_byte(p_body, 2 * i + 1);
        v_out := v_out || CASE WHEN v_unit BETWEEN 1 AND 55295 THEN chr(v_unit) ELSE '?' END;
    END LOOP;
    RETURN v_out;
END
$$;

-- Keeps a message in the transmission queue, behind the conversation's earlier ones.
CREATE OR REPLACE FUNCTION hold_for_transmission(
    p_handle uuid, p_to_service text, p_from_service text, p_contract_id integer,
    p_seq bigint, p_type_id integer, p_body bytea, p_priority smallint, p_status text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_now timestamp := utc_now();
    v_next timestamp;
    v_attempts integer;
BEGIN
    -- A conversation backs off as one: a new message waits for the next attempt of the ones
    -- ahead of it, which all share it, so the last one tells (the maximum read the whole
    -- backlog on every SEND). An empty status (not attempted yet) is due at once.
    SELECT next_attempt_at, attempts INTO v_next, v_attempts
      FROM transmissions WHERE conversation_handle = p_handle
     ORDER BY message_sequence_number DESC LIMIT 1;
    INSERT INTO transmissions (conversation_handle, to_service_name, from_service_name,
                               service_contract_name, enqueue_time, message_sequence_number,
                               message_type_id, message_body, is_conversation_error,
                               is_end_of_dialog, priority, transmission_status, message_id,
                               next_attempt_at, attempts)
    VALUES (p_handle, p_to_service, p_from_service,
            (SELECT name FROM contracts WHERE service_contract_id = p_contract_id),
            v_now, p_seq, p_type_id, p_body, p_type_id = 1, p_type_id = 2, p_priority,
            p_status, gen_random_uuid(),
            coalesce(v_next, CASE WHEN p_status IN ('', peer_busy_status()) THEN v_now
                                  ELSE v_now + interval '4 seconds' END),
            coalesce(v_attempts, 0));
    IF p_status = '' THEN
        -- Wakes the transport (LISTEN in the broker worker) when this transaction commits.
        PERFORM pg_notify(current_schema() || '_transmit', '');
    END IF;
END
$$;

-- A target's security timestamp: its own once set (when it ended or heard from the open
-- initiator), else 30 minutes after the initiator first sent the flag "message 0 acknowledged".
CREATE OR REPLACE FUNCTION target_security_timestamp(p_own timestamp, p_flag_sent_at timestamp)
RETURNS timestamp LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_own = '1900-01-01' AND p_flag_sent_at IS NOT NULL
                THEN p_flag_sent_at + interval '30 minutes' ELSE p_own END
$$;

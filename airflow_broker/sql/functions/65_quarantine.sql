-- The quarantine: messages moved aside by a reader (spec 18.3), and putting them back.

CREATE OR REPLACE FUNCTION quarantine_message(
    p_queue text, p_conversation_handle uuid, p_conversation_group_id uuid,
    p_service_name text, p_contract_name text, p_message_type_name text, p_sequence bigint,
    p_message_id uuid, p_body bytea, p_error text, p_traceback text, p_attempts integer,
    p_status text DEFAULT 'quarantined')
RETURNS bigint LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues := find_queue(p_queue);
    v_id bigint;
BEGIN
    IF q.object_id IS NULL THEN
        PERFORM raise_error(208, coalesce(p_queue, 'NULL'));
    END IF;
    INSERT INTO quarantine (queue_id, conversation_handle, conversation_group_id, service_name,
                            service_contract_name, message_type_name, message_sequence_number,
                            message_id, message_body, error, traceback, attempts, status,
                            quarantined_at)
    VALUES (q.object_id, p_conversation_handle, p_conversation_group_id, p_service_name,
            p_contract_name, p_message_type_name, p_sequence, p_message_id, p_body,
            coalesce(p_error, 'unknown error'), p_traceback, p_attempts, p_status, utc_now())
    RETURNING quarantine_id INTO v_id;
    RETURN v_id;
END
$$;

-- Puts a quarantined message back on its conversation, with its own sequence number, so it is
-- received before any later message of the conversation still waiting. Only while the
-- conversation's endpoint can still receive.
CREATE OR REPLACE FUNCTION replay_quarantined(p_quarantine_id bigint)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r quarantine;
    e endpoints;
    v_queue integer;
    v_type integer;
BEGIN
    SELECT * INTO r FROM quarantine WHERE quarantine_id = p_quarantine_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'quarantined message', coalesce(p_quarantine_id::text, 'NULL'));
    END IF;
    IF r.status NOT IN ('quarantined', 'retrying') THEN
        PERFORM raise_error(50111, p_quarantine_id::text, r.status);
    END IF;
    SELECT ce.* INTO e FROM endpoints ce
      JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
     WHERE ce.conversation_handle = r.conversation_handle
       FOR NO KEY UPDATE OF ce, g;
    IF NOT FOUND OR e.state IN ('DO', 'CD') THEN
        PERFORM raise_error(50112, p_quarantine_id::text, r.conversation_handle::text,
                            coalesce(e.state, 'gone'));
    END IF;
    SELECT service_queue_id INTO v_queue FROM service_defs WHERE service_id = e.service_id;
    SELECT message_type_id INTO v_type FROM message_types WHERE name = r.message_type_name;
    IF v_type IS NULL THEN
        PERFORM raise_error(8428, r.message_type_name);
    END IF;
    INSERT INTO queue_messages (queue_id, priority, conversation_group_id, conversation_handle,
                                message_sequence_number, precedence, service_id,
                                service_contract_id, message_type_id, message_body, message_id,
                                enqueued_at)
    VALUES (v_queue, e.priority, e.conversation_group_id, e.conversation_handle,
            r.message_sequence_number, CASE WHEN v_type = 1 THEN 1 ELSE 2 END, e.service_id,
            e.service_contract_id, v_type, r.message_body, r.message_id, utc_now());
    -- A replayed message starts its attempts afresh.
    DELETE FROM message_attempts WHERE message_id = r.message_id;
    UPDATE quarantine SET status = 'replayed', resolved_at = utc_now()
     WHERE quarantine_id = p_quarantine_id;
    PERFORM wake_waiters(v_queue);
END
$$;

CREATE OR REPLACE FUNCTION discard_quarantined(p_quarantine_id bigint)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_status text;
BEGIN
    SELECT status INTO v_status FROM quarantine WHERE quarantine_id = p_quarantine_id FOR UPDATE;
    IF v_status IS NULL THEN
        PERFORM raise_error(15151, 'quarantined message', coalesce(p_quarantine_id::text, 'NULL'));
    END IF;
    IF v_status NOT IN ('quarantined', 'retrying') THEN
        PERFORM raise_error(50111, p_quarantine_id::text, v_status);
    END IF;
    UPDATE quarantine SET status = 'discarded', resolved_at = utc_now()
     WHERE quarantine_id = p_quarantine_id;
END
$$;

CREATE OR REPLACE VIEW quarantined_messages AS
SELECT x.quarantine_id, q.name AS queue_name, x.status, x.quarantined_at, x.attempts,
       x.conversation_handle, x.conversation_group_id, x.service_name, x.service_contract_name,
       x.message_type_name, x.message_sequence_number, x.message_id, x.message_body, x.error,
       x.traceback, x.resolved_at
  FROM quarantine x JOIN queues q ON q.object_id = x.queue_id;

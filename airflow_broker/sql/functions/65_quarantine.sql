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
    PERFORM require_on_queue('RECEIVE', q);
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

-- Poison strategies' parked messages (airflow_broker.readers.queue_reader), for the readers of
-- their queue only.

-- Which of these conversations have parked messages.
CREATE OR REPLACE FUNCTION parked_conversations(p_handles uuid[]) RETURNS SETOF uuid
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT DISTINCT r.conversation_handle
      FROM quarantine r JOIN queues q ON q.object_id = r.queue_id
     WHERE r.status = 'retrying' AND r.conversation_handle = ANY(p_handles)
       AND has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
$$;

-- A conversation's parked messages, in order, locked while they are retried.
CREATE OR REPLACE FUNCTION parked_messages(p_handle uuid)
RETURNS TABLE (quarantine_id bigint, message_id uuid, message_type_name text,
               message_sequence_number bigint, message_body bytea, attempts integer,
               conversation_group_id uuid, service_name text, service_contract_name text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM require_visible_queue('RECEIVE', r.queue_id, 8426, p_handle::text)
       FROM quarantine r
      WHERE r.status = 'retrying' AND r.conversation_handle = p_handle
      LIMIT 1;
    RETURN QUERY
    SELECT r.quarantine_id, r.message_id, r.message_type_name, r.message_sequence_number,
           r.message_body, r.attempts, r.conversation_group_id, r.service_name,
           r.service_contract_name
      FROM quarantine r
     WHERE r.status = 'retrying' AND r.conversation_handle = p_handle
     ORDER BY r.message_sequence_number
       FOR UPDATE;
END
$$;

-- What came of retrying a parked message: 'done' (removed), 'failed' (parked again) or
-- 'quarantined' (left for a person).
CREATE OR REPLACE FUNCTION settle_parked(p_quarantine_id bigint, p_outcome text,
                                         p_attempts integer, p_error text, p_traceback text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM require_visible_queue('RECEIVE', r.queue_id, 15151, 'quarantined message',
                                  p_quarantine_id::text)
       FROM quarantine r WHERE r.quarantine_id = p_quarantine_id;
    IF p_outcome = 'done' THEN
        DELETE FROM quarantine WHERE quarantine_id = p_quarantine_id;
    ELSIF p_outcome = 'failed' THEN
        UPDATE quarantine SET attempts = p_attempts, error = p_error
         WHERE quarantine_id = p_quarantine_id;
    ELSIF p_outcome = 'quarantined' THEN
        UPDATE quarantine
           SET status = 'quarantined', attempts = p_attempts, error = p_error,
               traceback = p_traceback
         WHERE quarantine_id = p_quarantine_id;
    ELSE
        PERFORM raise_error(50106, coalesce(p_outcome, 'NULL'), 'the outcome of a retry',
                            'done, failed or quarantined');
    END IF;
END
$$;

-- BEGIN CONVERSATION TIMER (spec 12) and MOVE CONVERSATION (spec 13).

CREATE OR REPLACE FUNCTION begin_conversation_timer(p_handle uuid, p_timeout integer)
RETURNS timestamp LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
DECLARE
    e endpoints := lock_endpoint(p_handle);
    v_due timestamp;
BEGIN
    IF e.state IN ('DO', 'CD') THEN
        PERFORM raise_error(8458, e.state);
    END IF;
    IF p_timeout IS NULL OR p_timeout <= 0 THEN
        PERFORM raise_error(50106, coalesce(p_timeout::text, 'NULL'), 'TIMEOUT',
                            'a number of seconds greater than 0');
    END IF;
    v_due := utc_now() + make_interval(secs => p_timeout);
    IF v_due > e.lifetime THEN
        PERFORM raise_error(8410);
    END IF;
    -- Each endpoint has one timer: a second call replaces the deadline.
    UPDATE endpoints SET dialog_timer = v_due WHERE conversation_handle = p_handle;
    RETURN v_due;
END
$$;

CREATE OR REPLACE FUNCTION move_conversation(p_handle uuid, p_group uuid)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
DECLARE
    e endpoints := lock_endpoint(p_handle);
    v_service integer;
BEGIN
    IF p_group IS NULL THEN
        PERFORM raise_error(8420);
    END IF;
    IF e.state IN ('DO', 'CD') THEN
        PERFORM raise_error(8438, e.state);
    END IF;
    IF p_group = e.conversation_group_id THEN
        RETURN;
    END IF;
    -- A message on its way here carries the group its sender read, and is only visible when
    -- that sender commits. Every local delivery runs while its sender holds its own endpoint
    -- (SEND, END CONVERSATION and the worker lock it first), so locking the peer, when it is
    -- in this database, waits for those messages and holds off new ones until this
    -- transaction ends: they are moved below, or read the new group. (A peer in another
    -- broker delivers through accept_transmissions, which locks this endpoint itself.)
    PERFORM 1 FROM endpoints WHERE conversation_handle = e.far_handle FOR NO KEY UPDATE;
    -- A group id nobody uses yet becomes a new group of this service, as BEGIN DIALOG does.
    INSERT INTO dialog_groups (conversation_group_id, service_id)
    VALUES (p_group, e.service_id) ON CONFLICT (conversation_group_id) DO NOTHING;
    SELECT service_id INTO v_service FROM dialog_groups
     WHERE conversation_group_id = p_group FOR NO KEY UPDATE;
    IF v_service <> e.service_id THEN
        PERFORM raise_error(8439, p_group::text);
    END IF;
    UPDATE endpoints SET conversation_group_id = p_group WHERE conversation_handle = p_handle;
    UPDATE queue_messages SET conversation_group_id = p_group WHERE conversation_handle = p_handle;
    DELETE FROM dialog_groups g
     WHERE g.conversation_group_id = e.conversation_group_id
       AND NOT EXISTS (SELECT 1 FROM endpoints x
                        WHERE x.conversation_group_id = e.conversation_group_id);
END
$$;

-- END CONVERSATION (spec 11): normal, WITH ERROR, WITH CLEANUP.

-- Locks an endpoint and its group for a statement that changes it; 8426 when it is unknown.
CREATE OR REPLACE FUNCTION lock_endpoint(p_handle uuid) RETURNS endpoints
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    e endpoints;
    v_queue_id integer;
    v_queue_name text;
    v_queue_schema text;
    v_may_receive boolean;
BEGIN
    IF p_handle IS NULL THEN
        PERFORM raise_error(8418);
    END IF;
    SELECT ce.* INTO e
      FROM endpoints ce
      JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
     WHERE ce.conversation_handle = p_handle
       FOR NO KEY UPDATE OF ce, g;
    IF NOT FOUND THEN
        PERFORM raise_error(8426, p_handle::text);
    END IF;
    -- END CONVERSATION, timers and MOVE act for the endpoint's service: RECEIVE on its queue.
    SELECT sq.object_id, sq.name, sq.schema_name,
           (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint, sq.object_id,
                                   sq.principal_id))
      INTO v_queue_id, v_queue_name, v_queue_schema, v_may_receive
      FROM service_defs s JOIN queues sq ON sq.object_id = s.service_queue_id
     WHERE s.service_id = e.service_id;
    IF NOT v_may_receive AND NOT broker_is_acting() THEN
        -- To a login that may not see the queue either, the handle does not exist.
        PERFORM require_visible_queue('RECEIVE', v_queue_id, 8426, p_handle::text);
        PERFORM raise_error(229, 'RECEIVE', v_queue_name, current_database(), v_queue_schema);
    END IF;
    RETURN e;
END
$$;

-- Returns 'fire_and_forget' when an initiator ends in the transaction that sent message 0,
-- before anything came back: the pattern that leaks target endpoints (spec 15.3).
-- Generic plans: once one conversation holds many messages and most hold one or two, the plan
-- of a lookup by conversation for the value at hand looks cheaper than the one for any value,
-- and PostgreSQL would plan the same plan anew on every call (60 µs for the purge
-- below, PostgreSQL 15; test_query_plans).
CREATE OR REPLACE FUNCTION end_conversation(p_handle uuid, p_with_error boolean,
                                            p_error_code integer, p_error_description text)
RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    e endpoints;
    v_service text;
    v_type integer;
    v_body bytea;
    v_status text;
    v_warning text;
    v_peer_sent bigint;
    v_queue integer;
    v_group uuid;
    v_waiters boolean;
    v_common boolean;
    v_audited bigint;
BEGIN
    -- The endpoint and its group locked, when the caller may RECEIVE on its service's queue:
    -- what lock_endpoint() does, in one statement instead of a call and two. Anything else
    -- (no such handle, no right, NULL) goes to lock_endpoint(), which raises the error or
    -- lets the broker itself act.
    -- explain end_lock: p_handle uuid
    SELECT ce.* INTO e
      FROM endpoints ce
      JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
      JOIN service_defs s ON s.service_id = ce.service_id
      JOIN queues q ON q.object_id = s.service_queue_id
     WHERE ce.conversation_handle = p_handle
       AND (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint, q.object_id,
                                   q.principal_id))
       FOR NO KEY UPDATE OF ce, g;
    IF NOT FOUND THEN
        e := lock_endpoint(p_handle);
    END IF;
    IF p_with_error THEN
        IF p_error_code IS NULL AND p_error_description IS NULL THEN
            PERFORM raise_error(8419);
        ELSIF p_error_code IS NULL THEN
            PERFORM raise_error(8422);
        ELSIF p_error_description IS NULL THEN
            PERFORM raise_error(8424);
        ELSIF p_error_code <= 0 THEN
            PERFORM raise_error(50109, p_error_code::text);
        ELSIF length(p_error_description) > 3000 THEN
            PERFORM raise_error(50106, length(p_error_description)::text,
                                'the length of the error description', 'at most 3000');
        END IF;
    END IF;
    IF e.state IN ('DO', 'CD') THEN
        PERFORM raise_error(8427, e.state);
    END IF;

    IF e.state = 'DI' AND e.is_initiator THEN
        -- The common close of a dialog: the initiator ends after receiving everything the
        -- target sent, its EndDialog last. With nothing of the conversation left on the queue
        -- or in the transmission queue, the endpoint and its group (when no other
        -- conversation is in it) go in one statement, as delete_endpoint() would remove them.
        -- Otherwise nothing is deleted and the general path below decides.
        -- explain end_closed: p_handle uuid
        WITH gone AS (
            DELETE FROM endpoints ce
             WHERE ce.conversation_handle = p_handle
               AND NOT EXISTS (SELECT 1 FROM queue_messages m
                                WHERE m.conversation_handle = p_handle)
               AND NOT EXISTS (SELECT 1 FROM transmissions t
                                WHERE t.conversation_handle = p_handle)
            RETURNING ce.conversation_group_id
        ), emptied AS (
            DELETE FROM dialog_groups g
             USING gone
             WHERE g.conversation_group_id = gone.conversation_group_id
               AND NOT EXISTS (SELECT 1 FROM endpoints o
                                WHERE o.conversation_group_id = gone.conversation_group_id
                                  AND o.conversation_handle <> p_handle)
        )
        SELECT conversation_group_id INTO v_group FROM gone;
        IF v_group IS NOT NULL THEN
            RETURN NULL;
        END IF;
    END IF;

    -- The common END: the peer is in this broker (below).
    v_common := NOT p_with_error AND e.state = 'CO' AND e.far_handle IS NOT NULL
                AND NOT e.is_remote;
    IF NOT v_common THEN
        -- Unreceived messages of the conversation go; an Error among them is audited first.
        -- (The common END's statement purges them itself.)
        PERFORM audit_error(p_handle, m.message_body,
                            'purged by END CONVERSATION before it was received')
           FROM queue_messages m
          WHERE m.conversation_handle = p_handle AND m.message_type_id = 1 AND m.status = 1;
        DELETE FROM queue_messages WHERE conversation_handle = p_handle;
    END IF;

    IF e.state = 'SO' AND NOT EXISTS (SELECT 1 FROM transmissions
                                       WHERE conversation_handle = p_handle) THEN
        -- Nothing was ever sent: there is no peer to tell.
        PERFORM delete_endpoint(p_handle);
        RETURN NULL;
    END IF;
    IF e.state IN ('DI', 'ER') THEN
        -- The peer has ended already (or the dialog failed): nothing more to send.
        PERFORM close_endpoint(p_handle);
        RETURN NULL;
    END IF;

    IF v_common THEN
        -- The common END: the peer is in this broker, open, not held by another transaction,
        -- on an enabled queue, and nothing waits in the transmission queue. One statement
        -- purges the conversation's unreceived messages (auditing an Error among them) and
        -- does what deliver() and the endpoint's UPDATE below do (each statement of a PL/pgSQL
        -- function is a round through the executor); when any condition does not hold it
        -- finds no peer, and the general path decides, with the messages purged.
        -- explain end_local: e.far_handle uuid, p_handle uuid, e.priority smallint,
        --   e.send_sequence bigint, e.service_contract_id integer, e.is_initiator boolean,
        --   e.flag_sent_at timestamp, e.message0_xid xid8
        WITH purged AS (
            DELETE FROM queue_messages m
             WHERE m.conversation_handle = p_handle
            RETURNING m.message_type_id, m.status, m.message_body
        ), peer AS (
            SELECT p.conversation_handle, p.conversation_group_id, p.service_id,
                   p.send_sequence, p.flag_sent_at, ps.service_queue_id, utc_now() AS now
              FROM endpoints p
              JOIN service_defs ps ON ps.service_id = p.service_id
              JOIN queues pq ON pq.object_id = ps.service_queue_id
             WHERE p.conversation_handle = e.far_handle
               AND p.state IN ('SI', 'CO') AND pq.is_enqueue_enabled
               AND (SELECT is_broker_enabled FROM broker_identity)
               AND NOT EXISTS (SELECT 1 FROM transmissions
                                WHERE conversation_handle = p_handle)
               -- As deliver(): an EndDialog never waits for its peer's row.
               FOR NO KEY UPDATE OF p SKIP LOCKED
        ), ended AS (
            INSERT INTO queue_messages (queue_id, priority, conversation_group_id,
                                        conversation_handle, message_sequence_number,
                                        precedence, service_id, service_contract_id,
                                        message_type_id, message_body, message_id, enqueued_at)
            SELECT service_queue_id, e.priority, conversation_group_id, conversation_handle,
                   e.send_sequence, 2, service_id, e.service_contract_id, 2, NULL,
                   gen_random_uuid(), now
              FROM peer
            RETURNING queue_id
        ), told AS (
            UPDATE endpoints p
               SET state = 'DI', end_dialog_sequence = e.send_sequence,
                   -- An initiator that saw message 0 acknowledged starts the target's replay
                   -- protection with its EndDialog (spec 15.1), as deliver() does.
                   security_timestamp =
                       CASE WHEN e.is_initiator AND p.security_timestamp = '1900-01-01'
                                 AND e.message0_xid <> pg_current_xact_id()
                            THEN coalesce(e.flag_sent_at, peer.now) + interval '30 minutes'
                            ELSE p.security_timestamp END
              FROM peer
             WHERE p.conversation_handle = peer.conversation_handle
        ), closed AS (
            -- A target goes straight to CLOSED (see below), its replay protection started
            -- by its own EndDialog if nothing started it before.
            UPDATE endpoints ce
               SET send_sequence = ce.send_sequence + 1, end_dialog_sequence = e.send_sequence,
                   state = 'CD', dialog_timer = '1900-01-01',
                   security_timestamp =
                       CASE WHEN ce.security_timestamp = '1900-01-01'
                            THEN coalesce(peer.flag_sent_at, peer.now) + interval '30 minutes'
                            ELSE ce.security_timestamp END
              FROM peer
             WHERE ce.conversation_handle = p_handle AND NOT e.is_initiator
        )
        -- One row whatever was found: the audit of the purged messages always runs. (The
        -- broker puts an Error on a queue only as it moves the endpoint to ERROR or
        -- DISCONNECTED_INBOUND, so an open endpoint has none today, and the audit keeps END's
        -- rule without depending on that. v_audited only receives the count.)
        SELECT (SELECT queue_id FROM ended), (SELECT send_sequence FROM peer),
               EXISTS (SELECT 1 FROM ended d JOIN queue_waiters w ON w.queue_id = d.queue_id),
               (SELECT count(audit_error(p_handle, message_body,
                                         'purged by END CONVERSATION before it was received'))
                  FROM purged WHERE message_type_id = 1 AND status = 1)
          INTO v_queue, v_peer_sent, v_waiters, v_audited;
        IF v_queue IS NOT NULL THEN
            IF e.is_initiator THEN
                IF e.message0_xid = pg_current_xact_id() AND v_peer_sent = 0 THEN
                    v_warning := 'fire_and_forget';
                END IF;
                PERFORM delete_endpoint(p_handle);
            END IF;
            IF v_waiters THEN
                PERFORM wake_waiters(v_queue);
            END IF;
            RETURN v_warning;
        END IF;
    END IF;

    SELECT name INTO v_service FROM service_defs WHERE service_id = e.service_id;
    IF e.is_initiator THEN
        SELECT send_sequence INTO v_peer_sent FROM endpoints
         WHERE conversation_handle = e.far_handle;
        IF (e.message0_xid = pg_current_xact_id() AND coalesce(v_peer_sent, 0) = 0)
           OR (e.is_remote AND NOT e.message0_acked AND e.inbound_sequence = 0) THEN
            v_warning := 'fire_and_forget';
        END IF;
    END IF;
    IF p_with_error THEN
        -- An Error replaces whatever the conversation still had waiting (spec 11.2).
        DELETE FROM transmissions WHERE conversation_handle = p_handle;
        v_type := 1;
        v_body := error_body(p_error_code, p_error_description);
    ELSE
        v_type := 2;
    END IF;
    v_status := (SELECT transmission_status FROM transmissions
                  WHERE conversation_handle = p_handle
                  ORDER BY message_sequence_number DESC LIMIT 1);
    IF v_status IS NULL AND (e.far_handle IS NOT NULL OR e.is_remote) THEN
        v_status := deliver(p_handle, e.conversation_id, e.is_initiator, e.service_contract_id,
                            v_service, e.far_handle, e.far_service, e.lifetime, e.priority,
                            e.send_sequence, v_type, v_body);
    ELSIF v_status IS NULL THEN
        -- Message 0 never reached a target (it was refused): nobody to tell.
        PERFORM close_endpoint(p_handle);
        RETURN v_warning;
    END IF;
    IF v_status IS NOT NULL THEN
        -- Waits in the transmission queue, DISCONNECTED_OUTBOUND; the endpoint closes once it
        -- is delivered.
        UPDATE endpoints SET send_sequence = send_sequence + 1,
                             end_dialog_sequence = e.send_sequence, state = 'DO'
         WHERE conversation_handle = p_handle;
        PERFORM hold_for_transmission(p_handle, e.far_service, v_service, e.service_contract_id,
                                      e.send_sequence, v_type, v_body, e.priority, v_status);
        RETURN v_warning;
    END IF;
    -- Local delivery is acknowledged at once: the endpoint goes straight to CLOSED (one write
    -- of the row instead of DISCONNECTED_OUTBOUND first; the state is in partial index
    -- predicates, so every change of it writes every index). An initiator goes at once.
    IF e.is_initiator THEN
        PERFORM delete_endpoint(p_handle);
    ELSE
        UPDATE endpoints SET send_sequence = send_sequence + 1,
                             end_dialog_sequence = e.send_sequence, state = 'CD',
                             dialog_timer = '1900-01-01'
         WHERE conversation_handle = p_handle;
    END IF;
    RETURN v_warning;
END
$$;

CREATE OR REPLACE FUNCTION end_conversation(p_handle uuid) RETURNS text
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN end_conversation(p_handle, false, NULL::integer, NULL::text);
END
$$;

CREATE OR REPLACE FUNCTION end_conversation_with_error(p_handle uuid, p_error_code integer,
                                                       p_error_description text)
RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN end_conversation(p_handle, true, p_error_code, p_error_description);
END
$$;

-- WITH CLEANUP: the endpoint and everything it holds go; the peer is never told.
CREATE OR REPLACE FUNCTION end_conversation_with_cleanup(p_handle uuid) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
DECLARE
    -- As END CONVERSATION: 8426 for a conversation the login may not see, 229 without
    -- RECEIVE on its queue; then, since the peer is never told, the schema owner's alone.
    e endpoints := lock_endpoint(p_handle);
BEGIN
    IF NOT is_broker_owner() THEN
        PERFORM raise_error(229, 'CONTROL', p_handle::text, current_database(),
                            current_schema());
    END IF;
    INSERT INTO cleanup_log (cleaned_at, cleaned_by, conversation_handle, conversation_id,
                             is_initiator, state, service_name, far_service, queued_messages,
                             pending_messages)
    SELECT utc_now(), session_user, e.conversation_handle, e.conversation_id, e.is_initiator,
           e.state, s.name, e.far_service,
           (SELECT count(*) FROM queue_messages WHERE conversation_handle = p_handle),
           (SELECT count(*) FROM transmissions WHERE conversation_handle = p_handle)
      FROM service_defs s WHERE s.service_id = e.service_id;
    PERFORM delete_endpoint(p_handle);
END
$$;

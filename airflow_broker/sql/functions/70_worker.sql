-- The background work SQL Server does inside its engine, as short transactions the broker
-- worker calls: fire conversation timers, expire lifetimes, deliver what waits in the
-- transmission queue, reclaim closed endpoints. Each takes its rows with SKIP LOCKED, so
-- several workers can run at once, and each is atomic, so a worker killed half-way leaves
-- nothing half done: the next pass does the work exactly once.

CREATE OR REPLACE FUNCTION fire_timers(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    e record;
    v_count integer := 0;
    v_now timestamp := utc_now();
BEGIN
    FOR e IN
        SELECT conversation_handle, state FROM endpoints
         WHERE dialog_timer > '1900-01-01' AND dialog_timer <= v_now
         ORDER BY dialog_timer
         LIMIT p_limit
           FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        IF e.state NOT IN ('DO', 'CD') THEN
            -- DialogTimer goes to the endpoint's own queue only; it is received first.
            PERFORM enqueue_local(e.conversation_handle, 5, NULL, 0::smallint);
            v_count := v_count + 1;
        END IF;
        UPDATE endpoints SET dialog_timer = '1900-01-01'
         WHERE conversation_handle = e.conversation_handle;
    END LOOP;
    RETURN v_count;
END
$$;

-- A dialog still open at its lifetime gets Error -8489 on each side, and both endpoints go to
-- ERROR; what still waited for delivery is dropped (spec 16).
CREATE OR REPLACE FUNCTION expire_lifetimes(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    e record;
    v_count integer := 0;
    -- A variable, not utc_now() in the WHERE: a volatile call there is evaluated per row and
    -- cannot bound the index scan.
    v_now timestamp := utc_now();
BEGIN
    FOR e IN
        SELECT conversation_handle, state FROM endpoints
         WHERE state IN ('SO', 'CO', 'DI', 'DO') AND lifetime <= v_now
         ORDER BY lifetime
         LIMIT p_limit
           FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        DELETE FROM transmissions WHERE conversation_handle = e.conversation_handle;
        IF e.state = 'DO' THEN
            -- Ended locally, never acknowledged: nobody is left to tell.
            PERFORM close_endpoint(e.conversation_handle);
        ELSE
            PERFORM deliver_error(e.conversation_handle, -8489,
                                  'The dialog has exceeded the specified LIFETIME.');
        END IF;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

-- Delivers, in order, what waits in the transmission queue for a peer in this broker: for a
-- target queue that was disabled, a service or route that did not exist yet, or while the
-- broker was disabled. Retries back off 4, 8, 16, 32, then 64 s.
CREATE OR REPLACE FUNCTION retry_transmissions(p_limit integer DEFAULT 1000,
                                               p_all boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c record;
    m record;
    e record;
    v_status text;
    v_now timestamp := utc_now();
    v_delivered integer := 0;
BEGIN
    FOR c IN
        SELECT t.conversation_handle FROM transmissions t
         WHERE (p_all OR t.next_attempt_at IS NULL OR t.next_attempt_at <= v_now)
           -- Conversations with a peer in another broker are the transport's.
           AND NOT EXISTS (SELECT 1 FROM endpoints r
                            WHERE r.conversation_handle = t.conversation_handle AND r.is_remote)
         GROUP BY t.conversation_handle
         ORDER BY min(t.transmission_id)
         LIMIT p_limit
    LOOP
        PERFORM 1 FROM endpoints WHERE conversation_handle = c.conversation_handle
           FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        FOR m IN SELECT * FROM transmissions WHERE conversation_handle = c.conversation_handle
                  ORDER BY message_sequence_number, transmission_id
        LOOP
            -- It and what follows it wait for the broker worker's validation.
            EXIT WHEN m.awaiting_validation;
            SELECT ce.*, s.name AS service_name INTO e
              FROM endpoints ce JOIN service_defs s USING (service_id)
             WHERE ce.conversation_handle = c.conversation_handle;
            v_status := deliver(e.conversation_handle, e.conversation_id, e.is_initiator,
                                e.service_contract_id, e.service_name, e.far_handle,
                                e.far_service, e.lifetime, m.priority,
                                m.message_sequence_number, m.message_type_id, m.message_body);
            IF v_status = '' THEN
                -- Routed to another broker just now: the transport takes it from here.
                UPDATE transmissions SET transmission_status = '', next_attempt_at = v_now,
                                         attempts = 0
                 WHERE conversation_handle = c.conversation_handle;
                EXIT;
            ELSIF v_status IS NOT NULL THEN
                PERFORM hold_transmissions(c.conversation_handle, v_status);
                EXIT;
            END IF;
            DELETE FROM transmissions WHERE transmission_id = m.transmission_id;
            v_delivered := v_delivered + 1;
            IF m.is_end_of_dialog OR m.is_conversation_error THEN
                -- The peer has the EndDialog or Error: DISCONNECTED_OUTBOUND becomes CLOSED.
                PERFORM close_endpoint(c.conversation_handle);
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    RETURN v_delivered;
END
$$;

-- Deletes CLOSED target endpoints whose replay protection is over (spec 15.2): the security
-- timestamp has passed, or it was never initialised and the lifetime ended 30 minutes ago.
CREATE OR REPLACE FUNCTION reclaim_endpoints(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_handle uuid;
    v_count integer := 0;
    v_now timestamp := utc_now();
BEGIN
    FOR v_handle IN
        SELECT conversation_handle FROM endpoints
         WHERE state = 'CD' AND NOT is_initiator
           AND ((security_timestamp > '1900-01-01' AND security_timestamp < v_now)
             OR (security_timestamp = '1900-01-01'
                 AND lifetime < v_now - interval '30 minutes'))
         LIMIT p_limit
           FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        PERFORM delete_endpoint(v_handle);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

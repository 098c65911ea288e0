-- The dialog protocol between brokers (spec 21.4), in three parts the transport
-- (airflow_broker/worker/transport.py) calls:
--   outbound_transmissions()      sender: what is due, with its route, in sequence order;
--   accept_transmissions()        receiver: puts messages on its queues in its own transaction,
--                                 dropping duplicates and holding early arrivals, and answers
--                                 with an acknowledgement, an Error or a reason to wait;
--   apply_transmission_outcomes() sender: removes what was acknowledged, applies Errors and
--                                 backs off what has to wait.
-- Messages travel by (conversation_id, direction, sequence), so a message delivered twice (its
-- acknowledgement lost, the transport killed) is acknowledged again and enqueued once.

-- Everything a conversation still has to send waits for its next attempt: 4, 8, 16, 32, then
-- every 64 seconds.
CREATE OR REPLACE FUNCTION hold_transmissions(p_handle uuid, p_status text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_now timestamp := utc_now();
BEGIN
    UPDATE transmissions
       SET transmission_status = p_status, attempts = attempts + 1, last_attempt_at = v_now,
           -- A busy peer is tried again at the next pass: the wait is a transaction's, not
           -- a fault's.
           next_attempt_at = CASE WHEN p_status = peer_busy_status() THEN v_now
                                  ELSE v_now + make_interval(
                                      secs => least(64, 4 * power(2, least(attempts, 4))::integer))
                             END
     WHERE conversation_handle = p_handle;
    UPDATE endpoints SET transmission_status = p_status WHERE conversation_handle = p_handle;
END
$$;

CREATE OR REPLACE FUNCTION outbound_transmissions(p_limit integer DEFAULT 1000)
RETURNS TABLE (transmission_id bigint, conversation_handle uuid, address text,
               conversation_id uuid, sender_is_initiator boolean, from_service text,
               to_service text, to_broker_instance text, contract_name text,
               lifetime_left interval, message0_acked boolean,
               message_sequence_number bigint, message_type_name text, message_body bytea)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    e record;
    v_now timestamp := utc_now();
    v_enabled boolean := (SELECT is_broker_enabled FROM broker_identity);
    v_address text;
    v_taken bigint := 0;
    v_rows bigint;
    v_handle uuid;
    v_due timestamp := '-infinity';
    v_id bigint := 0;
    v_seen uuid[] := '{}';
BEGIN
    -- Conversations in the order their first due message became due, each found by resuming
    -- the walk after the previous one's: a conversation that fills the batch ends the step
    -- without reading the rest of the queue. (Messages of conversations already taken are
    -- passed over by the filter, which reads them only when a step goes on past them.)
    LOOP
        EXIT WHEN v_taken >= p_limit;
        SELECT t.conversation_handle, t.next_attempt_at, t.transmission_id
          INTO v_handle, v_due, v_id
          FROM transmissions t
          JOIN endpoints ce ON ce.conversation_handle = t.conversation_handle AND ce.is_remote
         WHERE (t.next_attempt_at, t.transmission_id) > (v_due, v_id)
           AND t.next_attempt_at <= v_now
           AND t.conversation_handle <> ALL (v_seen)
         ORDER BY t.next_attempt_at, t.transmission_id
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        v_seen := v_seen || v_handle;
        -- One transport per conversation at a time (the lock ends with the caller's
        -- transaction); the application's SENDs on it are not blocked.
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(
            hashtextextended(current_schema() || ':transmit:' || v_handle::text, 0));
        SELECT ce.*, s.name AS service_name, k.name AS contract_name INTO e
          FROM endpoints ce
          JOIN service_defs s ON s.service_id = ce.service_id
          JOIN contracts k ON k.service_contract_id = ce.service_contract_id
         WHERE ce.conversation_handle = v_handle;
        IF NOT v_enabled THEN
            PERFORM hold_transmissions(v_handle,
                                       'The broker is disabled in the sender''s database.');
            CONTINUE;
        END IF;
        v_address := route_address(e.far_service,
                                   coalesce(e.far_broker_instance, e.to_broker_instance));
        IF v_address IS NULL OR v_address = 'LOCAL' THEN
            PERFORM hold_transmissions(v_handle, no_route_status(e.far_service));
            CONTINUE;
        END IF;
        RETURN QUERY
            SELECT t.transmission_id, t.conversation_handle, v_address, e.conversation_id,
                   e.is_initiator, e.service_name, e.far_service,
                   coalesce(e.far_broker_instance, e.to_broker_instance), e.contract_name,
                   e.lifetime - v_now, e.message0_acked, t.message_sequence_number,
                   mt.name, t.message_body
              FROM transmissions t
              JOIN message_types mt ON mt.message_type_id = t.message_type_id
             WHERE t.conversation_handle = v_handle
               -- Nothing from a message awaiting the broker worker's validation on.
               AND t.message_sequence_number < coalesce(
                       (SELECT min(v.message_sequence_number) FROM transmissions v
                         WHERE v.conversation_handle = v_handle AND v.awaiting_validation),
                       9223372036854775807)
             ORDER BY t.message_sequence_number
             LIMIT p_limit - v_taken;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_taken := v_taken + v_rows;
    END LOOP;
END
$$;

-- What a message arriving on an endpoint tells it besides its content (spec 15.1, 21.4): from
-- the initiator, the flag that starts the target's 30 minutes of replay protection; from the
-- target, that message 0 has arrived (acknowledgements piggy-back on the messages flowing
-- back). Returns whether this side's answer carries the flag (an initiator's always does).
CREATE OR REPLACE FUNCTION note_arrival(e endpoints, p_from_broker text, p_flag boolean)
RETURNS boolean LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF p_flag AND NOT e.is_initiator AND e.security_timestamp = '1900-01-01' THEN
        UPDATE endpoints SET security_timestamp = utc_now() + interval '30 minutes'
         WHERE conversation_handle = e.conversation_handle;
    END IF;
    IF e.is_initiator AND NOT e.message0_acked THEN
        UPDATE endpoints
           SET message0_acked = true,
               far_broker_instance = coalesce(far_broker_instance, p_from_broker)
         WHERE conversation_handle = e.conversation_handle;
        DELETE FROM transmissions
         WHERE conversation_handle = e.conversation_handle AND message_sequence_number = 0;
    END IF;
    RETURN e.is_initiator;
END
$$;

-- One message arriving from another broker. outcome: 'ack' (it is on the queue, or was
-- already), 'error' (refused: code and description go back as an Error), or 'hold' (cannot be
-- taken now: status says why; the sender retries).
-- Generic plans: its lookups by conversation were planned anew for every message
-- (end_conversation() says why).
CREATE OR REPLACE FUNCTION accept_message(
    p_from_broker text, p_conversation_id uuid, p_sender_is_initiator boolean,
    p_from_service text, p_to_service text, p_to_broker_instance text, p_contract text,
    p_lifetime interval, p_flag boolean, p_seq bigint, p_type text, p_body bytea,
    p_checked_as text, p_xml_error text,
    OUT o_outcome text, OUT o_code integer, OUT o_description text, OUT o_status text,
    OUT o_peer_flag boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    e endpoints;
    v_type message_types;
    v_usage contract_message_usages;
    v_kind text;
    v_body bytea := nullif(p_body, '\x'::bytea);
    v_contract integer;
    v_service integer;
    v_queue integer;
    v_enabled boolean;
    v_reject record;
    v_next bigint;
    v_released integer;
    v_early boolean;
    v_now timestamp := utc_now();
BEGIN
    o_outcome := 'ack';
    o_peer_flag := false;
    SELECT * INTO v_type FROM message_types WHERE name = p_type;
    v_kind := CASE v_type.message_type_id WHEN 1 THEN 'error' WHEN 2 THEN 'end' ELSE 'data' END;
    SELECT * INTO e FROM endpoints
     WHERE conversation_id = p_conversation_id AND is_initiator = NOT p_sender_is_initiator
       FOR NO KEY UPDATE;

    IF e.conversation_handle IS NULL THEN
        IF p_seq < 0 OR v_kind <> 'data' AND (NOT p_sender_is_initiator OR v_kind = 'error') THEN
            -- An EndDialog or Error for an endpoint that is gone: nobody is left to tell.
            RETURN;
        END IF;
        IF NOT p_sender_is_initiator THEN
            o_outcome := 'error';
            o_code := -8462;
            o_description := 'The remote conversation endpoint is either in a state where no '
                           'more messages can be exchanged, or it has been dropped.';
            RETURN;
        END IF;
        -- The first message of a dialog to arrive here: the target service, byte for byte.
        SELECT s.service_id, s.service_queue_id, q.is_enqueue_enabled
          INTO v_service, v_queue, v_enabled
          FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
         WHERE s.name = p_to_service;
        IF v_service IS NULL AND p_to_broker_instance IS NOT NULL THEN
            o_outcome := 'error';
            o_code := -8490;
            o_description := format('Cannot find the remote service ''%s'' because it does not '
                                  'exist.', p_to_service);
            RETURN;
        ELSIF v_service IS NULL THEN
            o_outcome := 'hold';
            o_status := format('The target service name ''%s'' could not be found in broker %s. '
                             'Ensure that the service name is specified correctly (names '
                             'match byte for byte) and/or the routing information has been '
                             'supplied.', p_to_service,
                             (SELECT service_broker_guid FROM broker_identity));
            RETURN;
        END IF;
        SELECT service_contract_id INTO v_contract FROM contracts WHERE name = p_contract;
        IF v_contract IS NULL THEN
            o_outcome := 'error';
            o_code := -8425;
            o_description := format('The service contract ''%s'' is not found in the target '
                                  'broker.', p_contract);
            RETURN;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM service_def_contracts
                        WHERE service_id = v_service AND service_contract_id = v_contract) THEN
            o_outcome := 'error';
            o_code := -8408;
            o_description := format('Target service ''%s'' does not support contract ''%s''.',
                                  p_to_service, p_contract);
            RETURN;
        END IF;
        -- The remote initiator is the login its broker's transport connects as: it needs SEND
        -- on the target service.
        IF NOT may_send_to(session_user, v_service) THEN
            o_outcome := 'error';
            o_code := -8494;
            o_description := format('You do not have permission to access the service ''%s''.',
                                  p_to_service);
            RETURN;
        END IF;
    ELSE
        v_contract := e.service_contract_id;
        SELECT s.service_queue_id, q.is_enqueue_enabled INTO v_queue, v_enabled
          FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
         WHERE s.service_id = e.service_id;
    END IF;

    IF p_seq < 0 THEN
        -- An unsequenced broker Error (the peer's database was restored, ...).
        IF e.state = 'DO' THEN
            PERFORM audit_error(e.conversation_handle, v_body,
                                'arrived after the endpoint ended');
            PERFORM close_endpoint(e.conversation_handle);
        ELSIF e.state NOT IN ('CD', 'ER') THEN
            PERFORM enqueue_local(e.conversation_handle, 1, v_body, 1::smallint);
            UPDATE endpoints SET state = 'ER', system_sequence = system_sequence + 1
             WHERE conversation_handle = e.conversation_handle;
        END IF;
        RETURN;
    END IF;
    IF e.conversation_handle IS NOT NULL AND p_seq < e.inbound_sequence THEN
        -- A duplicate: acknowledged again, enqueued once.
        o_peer_flag := e.is_initiator;
        RETURN;
    END IF;
    IF e.state IN ('DO', 'CD') THEN
        -- This side has ended: the message is discarded (an Error is audited first).
        IF v_kind = 'error' THEN
            PERFORM audit_error(e.conversation_handle, v_body, 'arrived after the endpoint ended');
        END IF;
        RETURN;
    END IF;

    -- What the target checks (spec 17.2): the type, the contract, the direction, the body.
    IF v_type.message_type_id IS NULL THEN
        o_outcome := 'error';
        o_code := -8428;
        o_description := format('The message type ''%s'' is not found in the target broker.', p_type);
        RETURN;
    END IF;
    IF v_kind = 'data' THEN
        SELECT * INTO v_usage FROM contract_message_usages
         WHERE service_contract_id = v_contract AND message_type_id = v_type.message_type_id;
        IF NOT FOUND THEN
            o_outcome := 'error';
            o_code := -8498;
            o_description := format('The remote service has sent a message of type ''%s'' that '
                                  'is not part of the local contract.', p_type);
            RETURN;
        ELSIF p_sender_is_initiator AND NOT v_usage.is_sent_by_initiator THEN
            o_outcome := 'error';
            o_code := -8457;
            o_description := format('The message received was sent by the initiator of the '
                                  'conversation, but the message type ''%s'' is marked SENT BY '
                                  'TARGET in the contract.', p_type);
            RETURN;
        ELSIF NOT p_sender_is_initiator AND NOT v_usage.is_sent_by_target THEN
            o_outcome := 'error';
            o_code := -8437;
            o_description := format('The message received was sent by a target service, but the '
                                  'message type ''%s'' is marked SENT BY INITIATOR in the '
                                  'contract.', p_type);
            RETURN;
        END IF;
        IF v_type.validation_kind IN ('WELL_FORMED_XML', 'VALID_XML') THEN
            -- Only XML checks can raise (a verdict made for another definition of the type);
            -- the sub-transaction of an EXCEPTION block is not paid for other messages.
            BEGIN
                v_reject := body_rejection(v_type, v_body, p_checked_as, p_xml_error);
            EXCEPTION WHEN SQLSTATE 'SB000' THEN
                o_outcome := 'hold';
                o_status := SQLERRM;
                RETURN;
            END;
        ELSE
            v_reject := body_rejection(v_type, v_body, p_checked_as, p_xml_error);
        END IF;
        IF v_reject.code IS NOT NULL THEN
            o_outcome := 'error';
            o_code := v_reject.code;
            o_description := v_reject.description;
            RETURN;
        END IF;
    END IF;
    IF NOT v_enabled THEN
        o_outcome := 'hold';
        o_status := 'The target queue is disabled.';
        RETURN;
    END IF;

    IF e.conversation_handle IS NULL THEN
        -- Creates the target endpoint and its group; it lives as long as the initiator's.
        INSERT INTO dialog_groups (conversation_group_id, service_id)
        VALUES (gen_random_uuid(), v_service)
        RETURNING conversation_group_id INTO e.conversation_group_id;
        INSERT INTO endpoints (
            conversation_handle, conversation_id, is_initiator, service_contract_id,
            conversation_group_id, service_id, far_service, far_broker_instance, lifetime,
            state, is_remote, created_at)
        VALUES (gen_random_uuid(), p_conversation_id, false, v_contract,
                e.conversation_group_id, v_service, p_from_service, p_from_broker,
                v_now + greatest(p_lifetime, interval '0'), 'CO', true, v_now)
        RETURNING * INTO e;
    END IF;
    o_peer_flag := note_arrival(e, p_from_broker, p_flag);

    -- Early (later than the next one expected): held with status 2, not receivable, until
    -- the gap before it is filled. An Error is never early.
    v_early := v_kind <> 'error' AND p_seq > e.inbound_sequence;
    IF v_early AND EXISTS (SELECT 1 FROM queue_messages
                            WHERE conversation_handle = e.conversation_handle
                              AND message_sequence_number = p_seq AND status = 2) THEN
        RETURN;
    END IF;
    INSERT INTO queue_messages (queue_id, status, priority, conversation_group_id,
                                conversation_handle, message_sequence_number, precedence,
                                service_id, service_contract_id, message_type_id, message_body,
                                message_id, enqueued_at)
    VALUES (v_queue, CASE WHEN v_early THEN 2 ELSE 1 END, e.priority, e.conversation_group_id,
            e.conversation_handle, p_seq, CASE v_kind WHEN 'error' THEN 1 ELSE 2 END,
            e.service_id, v_contract, v_type.message_type_id, v_body, gen_random_uuid(), v_now);
    IF v_early THEN
        RETURN;
    END IF;
    v_next := p_seq + 1;
    IF v_kind = 'error' THEN
        -- An Error ends the dialog whatever is still missing before it; what arrived early
        -- becomes receivable (the Error is received first).
        UPDATE queue_messages SET status = 1
         WHERE conversation_handle = e.conversation_handle AND status = 2;
        UPDATE endpoints SET state = 'ER'
         WHERE conversation_handle = e.conversation_handle AND state IN ('SI', 'CO', 'DI');
    ELSE
        IF v_kind = 'end' THEN
            UPDATE endpoints SET state = 'DI', end_dialog_sequence = p_seq
             WHERE conversation_handle = e.conversation_handle AND state IN ('SI', 'CO');
        END IF;
        -- Messages held for this gap follow in order.
        LOOP
            UPDATE queue_messages SET status = 1
             WHERE conversation_handle = e.conversation_handle
               AND message_sequence_number = v_next AND status = 2
            RETURNING message_type_id INTO v_released;
            EXIT WHEN NOT FOUND;
            IF v_released = 2 THEN
                UPDATE endpoints SET state = 'DI', end_dialog_sequence = v_next
                 WHERE conversation_handle = e.conversation_handle AND state IN ('SI', 'CO');
            END IF;
            v_next := v_next + 1;
        END LOOP;
    END IF;
    UPDATE endpoints SET inbound_sequence = greatest(inbound_sequence, v_next)
     WHERE conversation_handle = e.conversation_handle;
    PERFORM wake_waiters(v_queue);
END
$$;

-- A run of the batch taken in one INSERT: consecutive messages of one conversation and one
-- type that arrive in order and need no decision per message (the common case of a stream).
-- Returns the last index it took (p_first - 1 when the run is left to accept_message).
CREATE OR REPLACE FUNCTION accept_run(
    p_from_broker text, p_conversation_ids uuid[], p_sender_is_initiator boolean[],
    p_flags boolean[], p_seqs bigint[], p_types text[], p_bodies bytea[],
    p_checked_as text[], p_xml_errors text[], p_first integer,
    OUT o_last integer, OUT o_peer_flag boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    e endpoints;
    v_type message_types;
    v_usage contract_message_usages;
    v_last integer := p_first;
    v_queue integer;
    v_enabled boolean;
    v_expected text;
    v_now timestamp := utc_now();
    v_batch uuid;
BEGIN
    o_last := p_first - 1;
    o_peer_flag := false;
    WHILE v_last < cardinality(p_seqs)
          AND p_conversation_ids[v_last + 1] = p_conversation_ids[p_first]
          AND p_sender_is_initiator[v_last + 1] = p_sender_is_initiator[p_first]
          AND p_types[v_last + 1] = p_types[p_first]
          AND p_seqs[v_last + 1] = p_seqs[v_last] + 1 LOOP
        v_last := v_last + 1;
    END LOOP;
    IF v_last = p_first THEN
        RETURN;
    END IF;
    SELECT * INTO v_type FROM message_types WHERE name = p_types[p_first];
    IF v_type.message_type_id IS NULL OR v_type.message_type_id IN (1, 2) THEN
        RETURN;
    END IF;
    SELECT * INTO e FROM endpoints
     WHERE conversation_id = p_conversation_ids[p_first]
       AND is_initiator = NOT p_sender_is_initiator[p_first]
       FOR NO KEY UPDATE;
    IF e.conversation_handle IS NULL OR e.state <> 'CO'
       OR e.inbound_sequence <> p_seqs[p_first]
       OR EXISTS (SELECT 1 FROM queue_messages
                   WHERE conversation_handle = e.conversation_handle AND status = 2) THEN
        RETURN;
    END IF;
    SELECT * INTO v_usage FROM contract_message_usages
     WHERE service_contract_id = e.service_contract_id
       AND message_type_id = v_type.message_type_id;
    IF NOT FOUND
       OR (p_sender_is_initiator[p_first] AND NOT v_usage.is_sent_by_initiator)
       OR (NOT p_sender_is_initiator[p_first] AND NOT v_usage.is_sent_by_target) THEN
        RETURN;
    END IF;
    v_expected := v_type.validation_kind || CASE WHEN v_type.validation_kind = 'VALID_XML'
                                                 THEN ':' || v_type.xml_collection_id ELSE '' END;
    IF NOT (v_type.validation_kind = 'NONE'
            OR (v_type.validation_kind = 'EMPTY'
                AND NOT EXISTS (SELECT 1 FROM unnest(p_bodies[p_first:v_last]) b
                                 WHERE nullif(b, '\x'::bytea) IS NOT NULL))
            OR (v_type.validation_kind IN ('WELL_FORMED_XML', 'VALID_XML')
                AND NOT EXISTS (SELECT 1
                                  FROM unnest(p_bodies[p_first:v_last],
                                              p_checked_as[p_first:v_last],
                                              p_xml_errors[p_first:v_last]) AS x(b, c, err)
                                 WHERE nullif(x.b, '\x'::bytea) IS NOT NULL
                                   AND (x.c IS DISTINCT FROM v_expected
                                        OR x.err IS NOT NULL)))) THEN
        RETURN;
    END IF;
    SELECT s.service_queue_id, q.is_enqueue_enabled INTO v_queue, v_enabled
      FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
     WHERE s.service_id = e.service_id;
    IF NOT v_enabled THEN
        RETURN;
    END IF;

    o_peer_flag := note_arrival(e, p_from_broker, p_flags[p_first]);
    v_batch := gen_random_uuid();
    INSERT INTO queue_messages (queue_id, priority, conversation_group_id, conversation_handle,
                                message_sequence_number, precedence, service_id,
                                service_contract_id, message_type_id, message_body, message_id,
                                enqueued_at)
    SELECT v_queue, e.priority, e.conversation_group_id, e.conversation_handle,
           p_seqs[p_first] + x.ord - 1, 2, e.service_id, e.service_contract_id,
           v_type.message_type_id, nullif(x.body, '\x'::bytea), nth_message_id(v_batch, x.ord),
           v_now
      FROM unnest(p_bodies[p_first:v_last]) WITH ORDINALITY AS x(body, ord);
    UPDATE endpoints SET inbound_sequence = p_seqs[v_last] + 1
     WHERE conversation_handle = e.conversation_handle;
    PERFORM wake_waiters(v_queue);
    o_last := v_last;
END
$$;

-- A batch from one sending broker, in its own transaction here. Acknowledgements and Errors
-- travel back on this broker's route to the sender's service: without one, what arrived stays
-- here but cannot be acknowledged (the classic missing return route; the sender retries and
-- each retry is dropped as a duplicate until the route exists).
CREATE OR REPLACE FUNCTION accept_transmissions(
    p_from_broker text, p_conversation_ids uuid[], p_sender_is_initiator boolean[],
    p_from_services text[], p_to_services text[], p_to_broker_instances text[],
    p_contracts text[], p_lifetimes interval[], p_flags boolean[], p_seqs bigint[],
    p_types text[], p_bodies bytea[], p_checked_as text[], p_xml_errors text[])
RETURNS TABLE (outcome text, code integer, description text, status text,
               peer_message0_acked boolean, broker_instance text)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_self text;
    v_enabled boolean;
    v_back_service text;
    v_back text;
    v_run_start integer := 0;
    v_run_end integer := 0;
    v_run_flag boolean;
    r record;
BEGIN
    PERFORM check_isolation();
    SELECT service_broker_guid::text, is_broker_enabled INTO v_self, v_enabled
      FROM broker_identity;
    broker_instance := v_self;
    FOR i IN 1 .. coalesce(cardinality(p_seqs), 0) LOOP
        code := NULL;
        description := NULL;
        status := NULL;
        peer_message0_acked := false;
        IF NOT v_enabled THEN
            outcome := 'hold';
            status := format('The broker is disabled in the target database (broker %s).',
                             v_self);
        ELSIF lower(p_from_broker) = v_self THEN
            -- A copied database (CREATE DATABASE ... TEMPLATE, a restore) keeps the broker
            -- instance of its original; two brokers with one instance must not deliver.
            outcome := 'hold';
            status := format('The target broker has the same broker instance %s as this one '
                             '(a copied or restored database?). Give one of them a new '
                             'instance with ALTER DATABASE ... SET NEW_BROKER (alter_broker).',
                             v_self);
        ELSIF p_to_broker_instances[i] IS NOT NULL
              AND lower(p_to_broker_instances[i]) <> v_self THEN
            outcome := 'hold';
            status := format('The route for service ''%s'' leads to broker %s, not to the '
                             'broker instance %s of the conversation.', p_to_services[i],
                             v_self, p_to_broker_instances[i]);
        ELSE
            IF i > v_run_end THEN
                v_run_start := i;
                r := accept_run(p_from_broker, p_conversation_ids, p_sender_is_initiator,
                                p_flags, p_seqs, p_types, p_bodies, p_checked_as, p_xml_errors,
                                i);
                v_run_end := r.o_last;
                v_run_flag := r.o_peer_flag;
            END IF;
            IF i <= v_run_end THEN
                outcome := 'ack';
                peer_message0_acked := v_run_flag;
            ELSE
                r := accept_message(p_from_broker, p_conversation_ids[i],
                                    p_sender_is_initiator[i], p_from_services[i],
                                    p_to_services[i], p_to_broker_instances[i], p_contracts[i],
                                    p_lifetimes[i], p_flags[i], p_seqs[i], p_types[i],
                                    p_bodies[i], p_checked_as[i], p_xml_errors[i]);
                outcome := r.o_outcome;
                code := r.o_code;
                description := r.o_description;
                status := r.o_status;
                peer_message0_acked := r.o_peer_flag;
            END IF;
            IF outcome <> 'hold' THEN
                IF p_from_services[i] IS DISTINCT FROM v_back_service THEN
                    v_back_service := p_from_services[i];
                    v_back := route_address(v_back_service, p_from_broker);
                END IF;
                IF v_back IS NULL OR v_back = 'LOCAL' THEN
                    UPDATE endpoints SET transmission_status = no_route_status(v_back_service)
                     WHERE conversation_id = p_conversation_ids[i]
                       AND is_initiator = NOT p_sender_is_initiator[i];
                    outcome := 'hold';
                    status := format('Delivered to broker %s, which cannot acknowledge it: it '
                                     'has no route back to service ''%s''.', v_self,
                                     v_back_service);
                ELSIF i = v_run_start OR i > v_run_end THEN
                    -- Once per in-order run: nothing within a run changes the status.
                    UPDATE endpoints SET transmission_status = ''
                     WHERE conversation_id = p_conversation_ids[i]
                       AND is_initiator = NOT p_sender_is_initiator[i]
                       AND transmission_status <> '';
                END IF;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The answers of a far broker, applied in the sender's transaction.
CREATE OR REPLACE FUNCTION apply_transmission_outcomes(
    p_ids bigint[], p_outcomes text[], p_codes integer[], p_descriptions text[],
    p_statuses text[], p_peer_flags boolean[], p_far_broker text)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    m record;
    i integer;
    v_rest integer[];
    v_held uuid;
    v_acked integer := 0;
    v_now timestamp := utc_now();
BEGIN
    -- Acknowledged messages that are neither the first of their conversation nor its last
    -- word go in one statement; the loop below sees only the rest (their positions in the
    -- batch, in order), which may change an endpoint. Looking each removed one up again cost
    -- more than the removal.
    WITH plain AS (
        SELECT x.id FROM unnest(p_ids, p_outcomes) AS x(id, outcome)
          JOIN transmissions t ON t.transmission_id = x.id
          JOIN endpoints ce ON ce.conversation_handle = t.conversation_handle
         WHERE x.outcome = 'ack' AND t.message_sequence_number > 0
           AND NOT t.is_end_of_dialog AND NOT t.is_conversation_error
           AND ce.far_broker_instance IS NOT NULL AND ce.transmission_status = ''
           AND (ce.message0_acked OR NOT ce.is_initiator)
           AND (ce.is_initiator OR ce.security_timestamp > '1900-01-01')
    )
    , gone AS (
        DELETE FROM transmissions t USING plain WHERE t.transmission_id = plain.id
        RETURNING t.transmission_id
    )
    SELECT (SELECT count(*) FROM gone),
           (SELECT array_agg(x.i ORDER BY x.i)
              FROM unnest(p_ids) WITH ORDINALITY AS x(id, i)
             WHERE x.id NOT IN (SELECT transmission_id FROM gone))
      INTO v_acked, v_rest;
    FOREACH i IN ARRAY coalesce(v_rest, '{}') LOOP
        SELECT t.transmission_id, t.conversation_handle, t.message_sequence_number,
               t.is_end_of_dialog, t.is_conversation_error, ce.state, ce.is_initiator,
               ce.far_broker_instance, ce.transmission_status, ce.message0_acked,
               ce.security_timestamp
          INTO m
          FROM transmissions t JOIN endpoints ce USING (conversation_handle)
         WHERE t.transmission_id = p_ids[i]
           FOR NO KEY UPDATE OF ce;
        -- Gone meanwhile: ended WITH CLEANUP or WITH ERROR, or acknowledged by a reply.
        CONTINUE WHEN NOT FOUND;
        IF p_outcomes[i] = 'ack' THEN
            DELETE FROM transmissions WHERE transmission_id = m.transmission_id;
            v_acked := v_acked + 1;
            IF m.far_broker_instance IS NULL OR m.transmission_status <> ''
               OR (m.is_initiator AND NOT m.message0_acked)
               OR (NOT m.is_initiator AND p_peer_flags[i]
                   AND m.security_timestamp = '1900-01-01') THEN
                -- Only when it changes something: a row version per acknowledgement would
                -- bloat the endpoint.
                UPDATE endpoints
                   SET far_broker_instance = coalesce(far_broker_instance, p_far_broker),
                       message0_acked = message0_acked
                                        OR (is_initiator AND m.message_sequence_number = 0),
                       transmission_status = '',
                       security_timestamp = CASE
                           WHEN NOT is_initiator AND p_peer_flags[i]
                                AND security_timestamp = '1900-01-01'
                           THEN v_now + interval '30 minutes' ELSE security_timestamp END
                 WHERE conversation_handle = m.conversation_handle;
            END IF;
            -- Apart: PostgreSQL planned the lookup anew on every acknowledgement (a generic
            -- plan for the whole function reads each acknowledged message twice above).
            IF m.state = 'DO' AND (m.is_end_of_dialog OR m.is_conversation_error) THEN
                IF NOT EXISTS (SELECT 1 FROM transmissions
                                WHERE conversation_handle = m.conversation_handle) THEN
                    -- The peer has this side's last word: DISCONNECTED_OUTBOUND becomes
                    -- CLOSED.
                    PERFORM close_endpoint(m.conversation_handle);
                END IF;
            END IF;
        ELSIF p_outcomes[i] = 'error' THEN
            DELETE FROM transmissions WHERE conversation_handle = m.conversation_handle;
            UPDATE endpoints SET transmission_status = format('%s %s', p_codes[i], p_descriptions[i])
             WHERE conversation_handle = m.conversation_handle;
            IF m.state IN ('DO', 'CD') THEN
                -- The fire-and-forget case: nobody will receive it, so it is audited.
                PERFORM audit_error(m.conversation_handle,
                                    error_body(p_codes[i], p_descriptions[i]),
                                    'arrived after the endpoint ended');
                PERFORM close_endpoint(m.conversation_handle);
            ELSIF m.state <> 'ER' THEN
                PERFORM deliver_error(m.conversation_handle, p_codes[i], p_descriptions[i]);
            END IF;
        ELSIF m.conversation_handle IS DISTINCT FROM v_held THEN
            PERFORM hold_transmissions(m.conversation_handle, p_statuses[i]);
            v_held := m.conversation_handle;
        END IF;
    END LOOP;
    RETURN v_acked;
END
$$;

-- GET_TRANSMISSION_STATUS(handle): why the conversation's messages (or its acknowledgements)
-- have not gone through; empty when the last transmission succeeded or none was tried.
-- A conversation is the business of the readers of its own service's queue, as in the
-- conversation_endpoints view: to any other login it is a handle that does not exist (8426).
CREATE OR REPLACE FUNCTION get_transmission_status(p_handle uuid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_status text;
BEGIN
    SELECT e.transmission_status INTO v_status
      FROM endpoints e
     WHERE e.conversation_handle = p_handle
       AND (is_broker_owner()
            OR (SELECT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
                  FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
                 WHERE s.service_id = e.service_id));
    IF NOT FOUND THEN
        PERFORM raise_error(8426, coalesce(p_handle::text, 'NULL'));
    END IF;
    RETURN coalesce((SELECT t.transmission_status FROM transmissions t
                      WHERE t.conversation_handle = p_handle AND t.transmission_status <> ''
                      ORDER BY t.message_sequence_number LIMIT 1), v_status);
END
$$;

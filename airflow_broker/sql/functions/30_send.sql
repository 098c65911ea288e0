-- SEND ON CONVERSATION (spec 7). One call, one round trip: checks every handle under its
-- conversation-group lock, numbers the message per conversation and puts it straight on the
-- destination queue in the caller's transaction (or in the transmission queue when it cannot be
-- delivered yet). Readers see it when the caller commits.

-- Whether PostgreSQL finds a body well-formed XML: NULL when it cannot tell (UTF-16, which it
-- cannot decode, or a server built without libxml, which parses no XML at all).
CREATE OR REPLACE FUNCTION server_well_formed(p_body bytea) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF substr(p_body, 1, 2) IN ('\xfffe'::bytea, '\xfeff'::bytea) THEN
        RETURN NULL;
    END IF;
    RETURN xml_is_well_formed_content(convert_from(p_body, 'UTF8'));
EXCEPTION
    WHEN character_not_in_repertoire OR untranslatable_character THEN
        RETURN false;
    WHEN feature_not_supported THEN
        RETURN NULL;
END
$$;

-- What the target does with a body (spec 2.6): NULL when acceptable, else the Error to return.
-- XML verdicts come from the Python API (lxml), made for the type's current validation.
-- PostgreSQL itself checks UTF-8 bodies for well-formedness where it has XML support, whoever
-- sends. A verdict it cannot check is trusted from the schema's owner (the broker's own code);
-- from anyone else the body is "unverified": it waits in the transmission queue until the
-- broker worker has validated it (32_validation.sql), so a forged verdict delivers nothing.
CREATE OR REPLACE FUNCTION body_rejection(p_type message_types, p_body bytea,
                                          p_checked_as text, p_xml_error text,
                                          OUT code integer, OUT description text,
                                          OUT unverified boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_expected text := p_type.validation_kind
        || CASE WHEN p_type.validation_kind = 'VALID_XML'
                THEN ':' || p_type.xml_collection_id::text ELSE '' END;
    v_ok boolean;
BEGIN
    unverified := false;
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
        IF v_ok AND p_type.validation_kind = 'WELL_FORMED_XML' THEN
            v_ok := server_well_formed(p_body);
        END IF;
        IF v_ok IS NULL OR (v_ok AND p_type.validation_kind = 'VALID_XML') THEN
            -- A verdict PostgreSQL cannot check.
            v_ok := true;
            unverified := NOT (is_broker_owner() OR broker_is_acting());
        END IF;
    ELSIF p_type.validation_kind = 'VALID_XML' THEN
        -- The error names the type's schema collection: to a login that may not see the type,
        -- it is a type that does not exist.
        IF NOT may_see_message_type(p_type) THEN
            PERFORM raise_error(8428, p_type.name);
        END IF;
        PERFORM raise_error(50103, p_type.name,
                            (SELECT name FROM xml_schema_collections
                              WHERE xml_collection_id = p_type.xml_collection_id));
    ELSE
        v_ok := server_well_formed(p_body);
        IF v_ok IS NULL THEN
            PERFORM raise_error(50108, p_type.name);
        END IF;
    END IF;
    IF NOT v_ok THEN
        code := -9615;
        description := format('A message of type ''%s'' failed XML validation on the target service. %s',
                              p_type.name, coalesce(p_xml_error, 'The body is not well-formed XML.'));
    END IF;
END
$$;

-- The transmission status of an EndDialog or Error held because its peer's row was locked.
CREATE OR REPLACE FUNCTION peer_busy_status() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'The peer conversation endpoint is in use by another transaction: delivered by the '
           'broker worker once that transaction ends.'::text
$$;

-- Puts one message of an endpoint on its peer's queue, in this transaction (local delivery).
-- Returns NULL when the message was delivered or has been dealt with (refused with an Error to
-- the sender, or discarded because the peer has ended), and otherwise the transmission status
-- with which it has to wait in the transmission queue.
-- Generic plans: the check of the target's replay protection below, a lookup by conversation,
-- was planned anew on every message 0 (end_conversation() says why).
CREATE OR REPLACE FUNCTION deliver(
    p_handle uuid, p_conversation_id uuid, p_is_initiator boolean, p_contract_id integer,
    p_service_name text, p_far_handle uuid, p_far_service text, p_lifetime timestamp,
    p_priority smallint, p_seq bigint, p_type_id integer, p_body bytea)
RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_kind text := CASE p_type_id WHEN 1 THEN 'error' WHEN 2 THEN 'end' ELSE 'data' END;
    v_handle uuid;
    v_group uuid;
    v_service integer;
    v_queue integer;
    v_enabled boolean;
    v_state char(2);
    v_supports boolean;
    v_now timestamp;
    v_remote boolean;
    v_instance text;
    v_address text;
    v_peer_timestamp timestamp;
    v_peer_flag timestamp;
    v_own record;
BEGIN
    IF NOT (SELECT is_broker_enabled FROM broker_identity) THEN
        RETURN 'The broker is disabled in the sender''s database.';
    END IF;
    IF p_far_handle IS NULL THEN
        SELECT is_remote, coalesce(far_broker_instance, to_broker_instance)
          INTO v_remote, v_instance
          FROM endpoints WHERE conversation_handle = p_handle;
        IF NOT v_remote THEN
            -- Message 0 (or a message behind one that has not been delivered yet): routed.
            v_address := route_address(p_far_service, v_instance);
            IF v_address IS NULL THEN
                RETURN no_route_status(p_far_service);
            END IF;
            v_remote := v_address <> 'LOCAL';
            IF v_remote THEN
                UPDATE endpoints SET is_remote = true WHERE conversation_handle = p_handle;
            END IF;
        END IF;
        IF v_remote THEN
            -- The peer lives in another broker: the transport delivers it (empty status: not
            -- attempted yet).
            RETURN '';
        END IF;
    END IF;
    IF p_far_handle IS NOT NULL THEN
        IF v_kind <> 'data' THEN
            -- An EndDialog or Error changes the peer's state, so it takes the peer's row, and
            -- never waits for it: the transaction holding it may be ending the peer and about
            -- to wait for this sender's row (both sides ending at once would deadlock). A busy
            -- peer gets the message from the transmission queue at the worker's next pass.
            PERFORM 1 FROM endpoints WHERE conversation_handle = p_far_handle
               FOR NO KEY UPDATE SKIP LOCKED;
            IF NOT FOUND
               AND EXISTS (SELECT 1 FROM endpoints WHERE conversation_handle = p_far_handle) THEN
                RETURN peer_busy_status();
            END IF;
        END IF;
        -- The peer's group is read without a lock: MOVE CONVERSATION of the peer waits for
        -- this transaction through the sender's endpoint, which every caller holds.
        -- explain deliver_far_endpoint: p_far_handle uuid
        SELECT e.conversation_handle, e.conversation_group_id, e.service_id, e.state,
               e.security_timestamp, e.flag_sent_at, s.service_queue_id, q.is_enqueue_enabled
          INTO v_handle, v_group, v_service, v_state, v_peer_timestamp, v_peer_flag, v_queue,
               v_enabled
          FROM endpoints e
          JOIN service_defs s ON s.service_id = e.service_id
          JOIN queues q ON q.object_id = s.service_queue_id
         WHERE e.conversation_handle = p_far_handle;
        IF v_handle IS NULL OR v_state IN ('DO', 'CD') THEN
            -- The peer has ended or was removed WITH CLEANUP: the message is discarded.
            IF v_kind = 'error' THEN
                PERFORM audit_error(p_handle, p_body, 'arrived after the peer endpoint ended');
            ELSIF v_kind = 'data' AND v_handle IS NULL THEN
                PERFORM deliver_error(p_handle, -8462,
                    'The remote conversation endpoint is either in a state where no more '
                    'messages can be exchanged, or it has been dropped.');
            END IF;
            RETURN NULL;
        END IF;
        IF NOT v_enabled THEN
            RETURN 'The target queue is disabled.';
        END IF;
    ELSE
        -- Message 0: the target service is looked up byte for byte.
        SELECT s.service_id, s.service_queue_id, q.is_enqueue_enabled,
               EXISTS (SELECT 1 FROM service_def_contracts u
                        WHERE u.service_id = s.service_id
                          AND u.service_contract_id = p_contract_id)
          INTO v_service, v_queue, v_enabled, v_supports
          FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
         WHERE s.name = p_far_service;
        IF v_service IS NULL AND v_instance IS NOT NULL THEN
            -- Addressed to this broker by its instance, which has no such service.
            PERFORM deliver_error(p_handle, -8490,
                format('Cannot find the remote service ''%s'' because it does not exist.',
                       p_far_service));
            RETURN NULL;
        END IF;
        IF v_service IS NULL THEN
            RETURN format('The target service name ''%s'' could not be found: it matched a '
                          'LOCAL route, but this broker has no service by that name. Ensure '
                          'that the service name is specified correctly (names match byte for '
                          'byte) and/or the routing information has been supplied.',
                          p_far_service);
        END IF;
        IF NOT v_supports THEN
            PERFORM deliver_error(p_handle, -8408,
                format('Target service ''%s'' does not support contract ''%s''.', p_far_service,
                       (SELECT name FROM contracts WHERE service_contract_id = p_contract_id)));
            RETURN NULL;
        END IF;
        -- The owner of the initiating service needs SEND on the target service; without it
        -- the initiator gets an Error message, as from SQL Server's target.
        IF NOT may_send_to((SELECT pg_get_userbyid(principal_id) FROM service_defs
                             WHERE name = p_service_name),
                           v_service) THEN
            PERFORM deliver_error(p_handle, -8494,
                format('You do not have permission to access the service ''%s''.',
                       p_far_service));
            RETURN NULL;
        END IF;
        IF NOT v_enabled THEN
            RETURN 'The target queue is disabled.';
        END IF;
        -- The first message creates the target endpoint and its own group.
        v_handle := gen_random_uuid();
        v_group := gen_random_uuid();
        v_state := 'CO';
        v_now := utc_now();
        INSERT INTO dialog_groups (conversation_group_id, service_id) VALUES (v_group, v_service);
        v_instance := (SELECT service_broker_guid::text FROM broker_identity);
        INSERT INTO endpoints (
            conversation_handle, conversation_id, is_initiator, service_contract_id,
            conversation_group_id, service_id, far_handle, far_service, far_broker_instance,
            lifetime, state, created_at)
        VALUES (v_handle, p_conversation_id, false, p_contract_id, v_group, v_service,
                p_handle, p_service_name, v_instance, p_lifetime, 'CO', v_now);
        -- Local delivery is acknowledged in this transaction: the dialog is pinned to this
        -- broker at once.
        UPDATE endpoints SET far_handle = v_handle, message0_xid = pg_current_xact_id(),
                             far_broker_instance = v_instance
         WHERE conversation_handle = p_handle;
    END IF;

    -- explain deliver_insert: v_queue integer, p_priority smallint, v_group uuid, v_handle uuid,
    --   p_seq bigint, v_kind text, v_service integer, p_contract_id integer, p_type_id integer,
    --   p_body bytea, v_now timestamp
    INSERT INTO queue_messages (queue_id, priority, conversation_group_id, conversation_handle,
                                message_sequence_number, precedence, service_id,
                                service_contract_id, message_type_id, message_body, message_id,
                                enqueued_at)
    VALUES (v_queue, p_priority, v_group, v_handle, p_seq,
            CASE v_kind WHEN 'error' THEN 1 ELSE 2 END, v_service, p_contract_id, p_type_id,
            p_body, gen_random_uuid(), coalesce(v_now, utc_now()));
    IF v_kind = 'end' THEN
        UPDATE endpoints SET state = 'DI', end_dialog_sequence = p_seq
         WHERE conversation_handle = v_handle AND state IN ('SI', 'CO');
    ELSIF v_kind = 'error' THEN
        UPDATE endpoints SET state = 'ER'
         WHERE conversation_handle = v_handle AND state IN ('SI', 'CO', 'DI');
    END IF;
    IF p_is_initiator AND v_kind = 'end' AND v_peer_timestamp = '1900-01-01' THEN
        SELECT message0_xid, flag_sent_at INTO v_own
          FROM endpoints WHERE conversation_handle = p_handle;
        IF v_own.message0_xid <> pg_current_xact_id() THEN
            -- The initiator saw message 0 acknowledged before it ended: its EndDialog carries
            -- the flag that starts the target's 30 minutes of replay protection (spec 15.1),
            -- counted from the first message that carried it. The peer's row is this
            -- transaction's already (above).
            UPDATE endpoints
               SET security_timestamp = coalesce(v_own.flag_sent_at, utc_now())
                                        + interval '30 minutes'
             WHERE conversation_handle = v_handle;
        END IF;
    END IF;
    IF NOT p_is_initiator AND v_state NOT IN ('DO', 'CD')
       AND (SELECT security_timestamp FROM endpoints WHERE conversation_handle = p_handle)
           = '1900-01-01' THEN
        -- The open initiator acknowledges this message with the flag "message 0 acknowledged",
        -- which starts the target's 30 minutes of replay protection (spec 15.1), unless an
        -- initiator message carried it earlier.
        UPDATE endpoints
           SET security_timestamp = coalesce(v_peer_flag, utc_now()) + interval '30 minutes'
         WHERE conversation_handle = p_handle;
    END IF;
    PERFORM wake_waiters(v_queue);
    RETURN NULL;
END
$$;

-- join_collapse_limit = 1: the joins run in the order written, from the endpoint found by its
-- handle. Before the tables have statistics the planner would start the one-statement SENDs
-- from the message type and reach the endpoint through its contract's index, a read of every
-- endpoint of the contract: message 0 went from 1.3 ms to 1.8 ms a dialog over the second
-- thousand dialogs of a new broker, and stays at 1.1 ms with the setting. Generic plans: as
-- the tables grow, PostgreSQL would weigh a custom plan of a one-statement SEND cheaper than
-- its generic one on some calls and plan it again on each of them
-- (test_a_dialogs_statements_are_planned_once_a_session_when_one_conversation_holds_many
-- failed about one run in three on a loaded machine without it); every lookup is by key.
-- Both settings hold for the functions send() calls as well (deliver(), route_address(),
-- hold_for_transmission(), ...), whose statements are key lookups of one table or joins
-- written from their key in the same way.
CREATE OR REPLACE FUNCTION send(
    p_handles uuid[],
    p_message_type text,
    p_body bytea,
    p_body_omitted boolean,
    p_checked_as text,
    p_xml_error text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off SET join_collapse_limit = 1
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_type message_types;
    v_body bytea := nullif(p_body, '\x'::bytea);
    v_handle uuid;
    e record;
    v_seq bigint;
    v_missing uuid;
    v_handles uuid[] := p_handles;
    -- The target's verdict on the body (body_rejection()).
    v_reject_code integer;
    v_reject_description text;
    v_unverified boolean := false;
    v_status text;
    v_rejected boolean;
    v_queue integer;
    v_waiters boolean;
BEGIN
    IF p_handles IS NULL OR cardinality(p_handles) = 0
       OR array_position(p_handles, NULL) IS NOT NULL THEN
        PERFORM raise_error(8418);
    END IF;
    IF cardinality(p_handles) > 1 THEN
        SELECT h INTO v_missing FROM unnest(p_handles) h GROUP BY h HAVING count(*) > 1 LIMIT 1;
        IF v_missing IS NOT NULL THEN
            PERFORM raise_error(50102, v_missing::text);
        END IF;
    END IF;
    IF cardinality(p_handles) = 1 AND (p_body IS NOT NULL OR coalesce(p_body_omitted, false))
       AND coalesce(octet_length(v_body), 0) <= max_message_size() THEN
        -- The common SEND in one statement: a data message of a type without validation on
        -- a conversation whose peer is in this broker, open, on an enabled queue, with
        -- nothing ahead of it in the transmission queue, sent by a reader of its own
        -- service's queue (spec 7), without retention. It does what the lookup, the checks
        -- and send_local below do for it; when any condition does not hold it finds no
        -- row, writes nothing, and the general path decides and raises the errors.
        -- The peer and the transmission queue are read with the statement's snapshot, taken
        -- before the endpoint's lock: the endpoint's row version must be the one that
        -- snapshot saw (its xmin), so a SEND or END that changed the conversation while this
        -- one waited for the lock (and may have put a message in the transmission queue this
        -- snapshot cannot see) sends this one the general way, which reads after the lock.
        -- explain send_ready: p_handles uuid[], p_message_type text, v_body bytea
        WITH sender AS (
            SELECT ce.conversation_handle, ce.far_handle, ce.send_sequence, ce.priority,
                   ce.service_contract_id, mt.message_type_id
              FROM endpoints ce
              JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
              JOIN service_defs s ON s.service_id = ce.service_id
              JOIN queues q ON q.object_id = s.service_queue_id
              JOIN message_types mt ON mt.name = p_message_type
              JOIN contract_message_usages u
                ON u.service_contract_id = ce.service_contract_id
               AND u.message_type_id = mt.message_type_id
             WHERE ce.conversation_handle = p_handles[1]
               AND ce.state = 'CO' AND ce.far_handle IS NOT NULL AND NOT ce.is_remote
               AND mt.validation_kind = 'NONE' AND mt.message_type_id > 2
               AND CASE WHEN ce.is_initiator THEN u.is_sent_by_initiator
                        ELSE u.is_sent_by_target END
               AND NOT q.is_retention_enabled
               AND (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint,
                                           s.service_queue_id, q.principal_id))
               AND ce.xmin = (SELECT seen.xmin FROM endpoints seen
                               WHERE seen.conversation_handle = p_handles[1])
               FOR NO KEY UPDATE OF ce, g
        ), peer AS (
            SELECT p.conversation_handle, p.conversation_group_id, p.service_id,
                   p.flag_sent_at, ps.service_queue_id, utc_now() AS now
              FROM sender
              JOIN endpoints p ON p.conversation_handle = sender.far_handle
              JOIN service_defs ps ON ps.service_id = p.service_id
              JOIN queues pq ON pq.object_id = ps.service_queue_id
             WHERE p.state NOT IN ('DO', 'CD') AND pq.is_enqueue_enabled
               AND (SELECT is_broker_enabled FROM broker_identity)
               AND NOT EXISTS (SELECT 1 FROM transmissions t
                                WHERE t.conversation_handle = sender.conversation_handle)
        ), delivered AS (
            INSERT INTO queue_messages (queue_id, priority, conversation_group_id,
                                        conversation_handle, message_sequence_number,
                                        precedence, service_id, service_contract_id,
                                        message_type_id, message_body, message_id, enqueued_at)
            SELECT peer.service_queue_id, sender.priority, peer.conversation_group_id,
                   peer.conversation_handle, sender.send_sequence, 2, peer.service_id,
                   sender.service_contract_id, sender.message_type_id, v_body,
                   gen_random_uuid(), peer.now
              FROM sender, peer
            RETURNING queue_id
        ), counted AS (
            -- As send_local below sets them.
            UPDATE endpoints ce
               SET send_sequence = sender.send_sequence + 1,
                   flag_sent_at = CASE WHEN ce.flag_sent_at IS NULL AND ce.is_initiator
                                            AND ce.message0_xid <> pg_current_xact_id()
                                       THEN peer.now ELSE ce.flag_sent_at END,
                   security_timestamp =
                       CASE WHEN NOT ce.is_initiator
                                 AND ce.security_timestamp = '1900-01-01'
                            THEN coalesce(peer.flag_sent_at, peer.now)
                                 + interval '30 minutes'
                            ELSE ce.security_timestamp END
              FROM sender, peer
             WHERE ce.conversation_handle = sender.conversation_handle
        )
        SELECT d.queue_id, EXISTS (SELECT 1 FROM queue_waiters w
                                    WHERE w.queue_id = d.queue_id)
          INTO v_queue, v_waiters FROM delivered d;
        IF v_queue IS NULL THEN
            -- Message 0 in one statement: the initiator's first SEND on a dialog whose
            -- target service is in this broker, found as deliver() finds it (no route names
            -- the service, the route to any service is LOCAL, or the dialog names this
            -- broker), accepting the contract, its owner allowed to SEND to it (spec 6), its
            -- queue enabled. It creates the target's endpoint in a group of its own, stores
            -- the message and opens and numbers the initiator's endpoint, as deliver() and the
            -- general path do; the row version of the endpoint is required as above.
            -- explain send_first: p_handles uuid[], p_message_type text, v_body bytea
            WITH sender AS (
                SELECT ce.conversation_handle, ce.conversation_id, ce.send_sequence, ce.priority,
                       ce.service_contract_id, ce.lifetime, s.name AS service_name,
                       mt.message_type_id, t.service_id AS target_id,
                       t.service_queue_id AS target_queue, b.service_broker_guid::text AS instance,
                       gen_random_uuid() AS target_handle, gen_random_uuid() AS target_group,
                       utc_now() AS now
                  FROM endpoints ce
                  JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
                  JOIN service_defs s ON s.service_id = ce.service_id
                  JOIN queues q ON q.object_id = s.service_queue_id
                  JOIN message_types mt ON mt.name = p_message_type
                  JOIN contract_message_usages u
                    ON u.service_contract_id = ce.service_contract_id
                   AND u.message_type_id = mt.message_type_id AND u.is_sent_by_initiator
                  JOIN service_defs t ON t.name = ce.far_service
                  JOIN queues tq ON tq.object_id = t.service_queue_id
                  JOIN service_def_contracts tc
                    ON tc.service_id = t.service_id
                   AND tc.service_contract_id = ce.service_contract_id
                  CROSS JOIN broker_identity b
                 WHERE ce.conversation_handle = p_handles[1]
                   AND ce.state = 'SO' AND ce.is_initiator AND ce.far_handle IS NULL
                   AND NOT ce.is_remote
                   AND mt.validation_kind = 'NONE' AND mt.message_type_id > 2
                   AND NOT q.is_retention_enabled AND tq.is_enqueue_enabled AND b.is_broker_enabled
                   AND (ce.to_broker_instance = b.service_broker_guid::text
                        OR (ce.to_broker_instance IS NULL
                            AND NOT EXISTS (SELECT 1 FROM route_defs r
                                             WHERE r.remote_service_name = ce.far_service)
                            AND EXISTS (SELECT 1 FROM route_defs r
                                         WHERE r.remote_service_name IS NULL
                                           AND r.broker_instance IS NULL AND r.address = 'LOCAL'
                                           AND (r.lifetime IS NULL OR r.lifetime > utc_now()))))
                   AND (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint,
                                               s.service_queue_id, q.principal_id))
                   AND (SELECT * FROM role_may(pg_get_userbyid(s.principal_id), 'SEND',
                                               17::smallint, t.service_id, t.principal_id))
                   AND NOT EXISTS (SELECT 1 FROM transmissions tr
                                    WHERE tr.conversation_handle = ce.conversation_handle)
                   AND ce.xmin = (SELECT seen.xmin FROM endpoints seen
                                   WHERE seen.conversation_handle = p_handles[1])
                   FOR NO KEY UPDATE OF ce, g
            ), grouped AS (
                INSERT INTO dialog_groups (conversation_group_id, service_id)
                SELECT target_group, target_id FROM sender
            ), target AS (
                INSERT INTO endpoints (conversation_handle, conversation_id, is_initiator,
                                       service_contract_id, conversation_group_id, service_id,
                                       far_handle, far_service, far_broker_instance, lifetime,
                                       state, created_at)
                SELECT target_handle, conversation_id, false, service_contract_id, target_group,
                       target_id, conversation_handle, service_name, instance, lifetime, 'CO', now
                  FROM sender
            ), delivered AS (
                INSERT INTO queue_messages (queue_id, priority, conversation_group_id,
                                            conversation_handle, message_sequence_number,
                                            precedence, service_id, service_contract_id,
                                            message_type_id, message_body, message_id, enqueued_at)
                SELECT target_queue, priority, target_group, target_handle, send_sequence, 2,
                       target_id, service_contract_id, message_type_id, v_body, gen_random_uuid(),
                       now
                  FROM sender
                RETURNING queue_id
            ), opened AS (
                -- Local delivery is acknowledged in this transaction, as deliver() records it.
                UPDATE endpoints ce
                   SET send_sequence = sender.send_sequence + 1, state = 'CO',
                       far_handle = sender.target_handle, message0_xid = pg_current_xact_id(),
                       far_broker_instance = sender.instance
                  FROM sender
                 WHERE ce.conversation_handle = sender.conversation_handle
            )
            SELECT d.queue_id, EXISTS (SELECT 1 FROM queue_waiters w
                                        WHERE w.queue_id = d.queue_id)
              INTO v_queue, v_waiters FROM delivered d;
        END IF;
        IF v_queue IS NOT NULL THEN
            IF v_waiters THEN
                PERFORM wake_waiters(v_queue);
            END IF;
            RETURN;
        END IF;
    END IF;
    SELECT * INTO v_type FROM message_types WHERE name = p_message_type;
    IF NOT FOUND THEN
        PERFORM raise_error(8428, coalesce(p_message_type, 'NULL'));
    END IF;
    IF p_body IS NULL AND NOT coalesce(p_body_omitted, false) THEN
        PERFORM raise_error(8433);
    END IF;
    IF octet_length(v_body) > max_message_size() THEN
        PERFORM raise_error(50122, octet_length(v_body)::text, max_message_size()::text);
    END IF;
    -- The target's verdict on the body does not depend on which conversation carries it.
    -- A type without validation accepts any body, and most types have none: the call, a round
    -- through the executor, is left out for them.
    IF v_type.validation_kind <> 'NONE' THEN
        SELECT r.code, r.description, r.unverified
          INTO v_reject_code, v_reject_description, v_unverified
          FROM body_rejection(v_type, v_body, p_checked_as, p_xml_error) r;
    END IF;

    -- One handle at a time, in handle order (so concurrent multi-conversation SENDs cannot
    -- deadlock), each looked up with "= handle": a lookup PostgreSQL keeps one cached plan for,
    -- where "= ANY(array)" is planned again on every call. Duplicates were refused above; a
    -- single handle needs no sorting query.
    IF cardinality(p_handles) > 1 THEN
        v_handles := ARRAY(SELECT h FROM unnest(p_handles) h ORDER BY h);
    END IF;
    FOREACH v_handle IN ARRAY v_handles LOOP
        -- explain send_endpoint: v_handle uuid, v_type.message_type_id integer
        SELECT ce.conversation_handle, ce.conversation_id, ce.is_initiator, ce.state,
               ce.service_contract_id, ce.conversation_group_id, ce.service_id, ce.far_handle,
               ce.far_service, ce.lifetime, ce.send_sequence, ce.priority, ce.is_remote,
               s.name AS service_name, s.service_queue_id,
               q.name AS queue_name, q.is_enqueue_enabled, q.is_retention_enabled,
               q.schema_name AS queue_schema,
               u.message_type_id IS NOT NULL AS in_contract,
               u.is_sent_by_initiator, u.is_sent_by_target,
               -- RECEIVE on the sending service's queue (spec 7).
               (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint,
                                       s.service_queue_id, q.principal_id)) AS may_receive
          INTO e
          FROM endpoints ce
          JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
          JOIN service_defs s ON s.service_id = ce.service_id
          JOIN queues q ON q.object_id = s.service_queue_id
          LEFT JOIN contract_message_usages u
                 ON u.service_contract_id = ce.service_contract_id
                AND u.message_type_id = v_type.message_type_id
         WHERE ce.conversation_handle = v_handle
           FOR NO KEY UPDATE OF ce, g;
        IF NOT FOUND THEN
            PERFORM raise_error(8426, v_handle::text);
        END IF;
        IF NOT e.may_receive AND NOT broker_is_acting() THEN
            -- A conversation is seen by the readers of its service's queue only: to a login
            -- that may not see that queue either, the handle does not exist.
            PERFORM require_visible_queue('RECEIVE', e.service_queue_id, 8426,
                                          v_handle::text);
            PERFORM raise_error(229, 'RECEIVE', e.queue_name, current_database(),
                                e.queue_schema);
        END IF;
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
        v_rejected := v_reject_code IS NOT NULL;
        v_status := NULL;

        IF NOT v_rejected AND NOT v_unverified AND NOT e.is_retention_enabled
           AND e.state = 'CO' AND e.far_handle IS NOT NULL AND NOT e.is_remote
           AND v_type.message_type_id > 2 THEN
            -- The common SEND: a data message on a conversation whose peer is in this broker,
            -- open, on an enabled queue, with nothing ahead of it in the transmission queue.
            -- One statement does what deliver() and the endpoint's UPDATE below do for it,
            -- each statement of a PL/pgSQL function being a round through the executor; when
            -- any condition does not hold it finds no peer, and the general path decides. The
            -- peer is read after the lock above, as deliver() reads it.
            -- explain send_local: e.far_handle uuid, e.conversation_handle uuid,
            --   e.priority smallint, v_seq bigint, e.service_contract_id integer,
            --   v_type.message_type_id integer, v_body bytea
            WITH peer AS (
                SELECT p.conversation_handle, p.conversation_group_id, p.service_id,
                       p.flag_sent_at, ps.service_queue_id, utc_now() AS now
                  FROM endpoints p
                  JOIN service_defs ps ON ps.service_id = p.service_id
                  JOIN queues pq ON pq.object_id = ps.service_queue_id
                 WHERE p.conversation_handle = e.far_handle
                   AND p.state NOT IN ('DO', 'CD') AND pq.is_enqueue_enabled
                   AND (SELECT is_broker_enabled FROM broker_identity)
                   AND NOT EXISTS (SELECT 1 FROM transmissions
                                    WHERE conversation_handle = e.conversation_handle)
            ), delivered AS (
                INSERT INTO queue_messages (queue_id, priority, conversation_group_id,
                                            conversation_handle, message_sequence_number,
                                            precedence, service_id, service_contract_id,
                                            message_type_id, message_body, message_id,
                                            enqueued_at)
                SELECT service_queue_id, e.priority, conversation_group_id, conversation_handle,
                       v_seq, 2, service_id, e.service_contract_id, v_type.message_type_id,
                       v_body, gen_random_uuid(), now
                  FROM peer
                RETURNING queue_id
            ), counted AS (
                UPDATE endpoints ce
                   SET send_sequence = v_seq + 1,
                       -- As deliver() and the UPDATE below set them: the flag "message 0
                       -- acknowledged" on the initiator's messages, and the target's replay
                       -- protection from the first message it sends (spec 15.1).
                       flag_sent_at = CASE WHEN ce.flag_sent_at IS NULL AND ce.is_initiator
                                                AND ce.message0_xid <> pg_current_xact_id()
                                           THEN peer.now ELSE ce.flag_sent_at END,
                       security_timestamp =
                           CASE WHEN NOT ce.is_initiator
                                     AND ce.security_timestamp = '1900-01-01'
                                THEN coalesce(peer.flag_sent_at, peer.now)
                                     + interval '30 minutes'
                                ELSE ce.security_timestamp END
                  FROM peer
                 WHERE ce.conversation_handle = e.conversation_handle
            )
            SELECT d.queue_id, EXISTS (SELECT 1 FROM queue_waiters w
                                        WHERE w.queue_id = d.queue_id)
              INTO v_queue, v_waiters FROM delivered d;
            IF v_queue IS NOT NULL THEN
                IF v_waiters THEN
                    PERFORM wake_waiters(v_queue);
                END IF;
                CONTINUE;
            END IF;
        END IF;

        IF v_rejected THEN
            PERFORM deliver_error(e.conversation_handle, v_reject_code, v_reject_description);
        ELSE
            -- Messages already waiting in the transmission queue go first.
            -- explain send_pending: e.conversation_handle uuid
            v_status := (SELECT transmission_status FROM transmissions
                          WHERE conversation_handle = e.conversation_handle
                          ORDER BY message_sequence_number DESC LIMIT 1);
            IF v_unverified THEN
                v_status := validation_pending_status(v_type.name);
            END IF;
            IF v_status IS NULL THEN
                v_status := deliver(e.conversation_handle, e.conversation_id, e.is_initiator,
                                    e.service_contract_id, e.service_name, e.far_handle,
                                    e.far_service, e.lifetime, e.priority, v_seq,
                                    v_type.message_type_id, v_body);
            END IF;
            IF v_status IS NOT NULL THEN
                PERFORM hold_for_transmission(e.conversation_handle, e.far_service,
                                              e.service_name, e.service_contract_id, v_seq,
                                              v_type.message_type_id, v_body, e.priority,
                                              v_status);
                IF v_unverified THEN
                    UPDATE transmissions SET awaiting_validation = true
                     WHERE conversation_handle = e.conversation_handle
                       AND message_sequence_number = v_seq;
                END IF;
            END IF;
        END IF;

        IF e.is_retention_enabled THEN
            INSERT INTO queue_messages (queue_id, status, priority, conversation_group_id,
                                        conversation_handle, message_sequence_number,
                                        service_id, service_contract_id, message_type_id,
                                        message_body, message_id, enqueued_at)
            VALUES (e.service_queue_id, 3, e.priority, e.conversation_group_id,
                    e.conversation_handle, v_seq, e.service_id, e.service_contract_id,
                    v_type.message_type_id, v_body, gen_random_uuid(), utc_now());
        END IF;

        -- explain send_update_endpoint: v_seq bigint, v_rejected boolean, e.far_handle uuid,
        --   e.conversation_handle uuid
        UPDATE endpoints
           SET send_sequence = v_seq + 1,
               state = CASE WHEN state = 'SO' AND NOT v_rejected THEN 'CO' ELSE state END,
               -- The flag "message 0 acknowledged" travels with every initiator message after
               -- the transaction that delivered message 0 (locally, its acknowledgement).
               flag_sent_at = CASE WHEN flag_sent_at IS NULL AND is_initiator AND NOT is_remote
                                        AND e.far_handle IS NOT NULL AND NOT v_rejected
                                        AND message0_xid <> pg_current_xact_id()
                                   THEN utc_now() ELSE flag_sent_at END
         WHERE conversation_handle = e.conversation_handle;
    END LOOP;
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

-- A reply that is dropped, rather than failing with 8429, when the peer has already ended the
-- conversation (its EndDialog or Error may arrive while the reply is being prepared). Returns
-- whether it was sent.
CREATE OR REPLACE FUNCTION send_if_open(p_handle uuid, p_message_type text, p_body bytea,
                                        p_body_omitted boolean, p_checked_as text,
                                        p_xml_error text)
RETURNS boolean LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
DECLARE
    e endpoints := lock_endpoint(p_handle);
BEGIN
    IF e.state NOT IN ('SO', 'CO') THEN
        RETURN false;
    END IF;
    PERFORM send(ARRAY[p_handle], p_message_type, p_body, p_body_omitted, p_checked_as,
                 p_xml_error);
    RETURN true;
END
$$;

-- Several messages of one type on one conversation in one call (a batch of SENDs): the first
-- goes through send() with every check; the rest, when nothing about them needs a decision
-- per message, go in one INSERT with consecutive sequence numbers: on the peer's queue, or
-- for a peer in another broker into the transmission queue.
CREATE OR REPLACE FUNCTION send_many(p_handle uuid, p_message_type text, p_bodies bytea[],
                                     p_checked_as text, p_xml_errors text[])
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
DECLARE
    v_count integer := coalesce(cardinality(p_bodies), 0);
    v_type message_types;
    e record;
    v_fast boolean;
    v_valid boolean;
    v_inserted integer;
    -- Once, not per row: utc_now() is volatile, and a call per message cost a third of a
    -- 100-message batch.
    v_now timestamp := utc_now();
    v_batch uuid;
BEGIN
    IF v_count = 0 THEN
        RETURN;
    END IF;
    -- send() checks the first body; the others go in one INSERT below.
    PERFORM raise_error(50122, octet_length(b)::text, max_message_size()::text)
       FROM unnest(p_bodies[2:]) b
      WHERE octet_length(b) > max_message_size();
    PERFORM send(ARRAY[p_handle], p_message_type, p_bodies[1], p_bodies[1] IS NULL,
                 p_checked_as, p_xml_errors[1]);
    IF v_count = 1 THEN
        RETURN;
    END IF;
    v_batch := gen_random_uuid();
    SELECT * INTO v_type FROM message_types WHERE name = p_message_type;
    SELECT ce.send_sequence, ce.priority, ce.service_contract_id, ce.state, ce.is_remote,
           p.conversation_handle AS peer_handle, p.conversation_group_id AS peer_group,
           p.service_id AS peer_service, ps.service_queue_id AS peer_queue,
           pq.is_enqueue_enabled AS peer_enabled, oq.is_retention_enabled AS retention
      INTO e
      FROM endpoints ce
      JOIN service_defs os ON os.service_id = ce.service_id
      JOIN queues oq ON oq.object_id = os.service_queue_id
      LEFT JOIN endpoints p ON p.conversation_handle = ce.far_handle
                           AND p.state NOT IN ('DO', 'CD')
      LEFT JOIN service_defs ps ON ps.service_id = p.service_id
      LEFT JOIN queues pq ON pq.object_id = ps.service_queue_id
     WHERE ce.conversation_handle = p_handle;
    v_valid := (v_type.validation_kind = 'NONE'
                   OR (v_type.validation_kind = 'EMPTY'
                       AND NOT EXISTS (SELECT 1 FROM unnest(p_bodies[2:]) b
                                        WHERE nullif(b, '\x'::bytea) IS NOT NULL))
                   OR (p_checked_as IS NOT DISTINCT FROM
                           v_type.validation_kind || CASE WHEN v_type.validation_kind = 'VALID_XML'
                               THEN ':' || v_type.xml_collection_id ELSE '' END
                       AND NOT EXISTS (SELECT 1 FROM unnest(p_xml_errors[2:]) x
                                        WHERE x IS NOT NULL)
                       -- Anyone else's verdicts are checked one by one in send().
                       AND is_broker_owner()));
    IF e.state = 'CO' AND e.is_remote AND NOT e.retention AND v_valid THEN
        -- A peer in another broker: the rest wait in the transmission queue behind the first,
        -- with its status and schedule, for the transport.
        INSERT INTO transmissions (conversation_handle, to_service_name, from_service_name,
                                   service_contract_name, enqueue_time, message_sequence_number,
                                   message_type_id, message_body, priority,
                                   transmission_status, message_id, next_attempt_at, attempts)
        SELECT t.conversation_handle, t.to_service_name, t.from_service_name,
               t.service_contract_name, t.enqueue_time, e.send_sequence + x.ord - 1,
               v_type.message_type_id, nullif(x.body, '\x'::bytea), t.priority,
               t.transmission_status, nth_message_id(v_batch, x.ord), t.next_attempt_at,
               t.attempts
          FROM (SELECT * FROM transmissions
                 WHERE conversation_handle = p_handle
                 ORDER BY message_sequence_number DESC LIMIT 1) t,
               unnest(p_bodies[2:]) WITH ORDINALITY AS x(body, ord);
        GET DIAGNOSTICS v_inserted = ROW_COUNT;
        -- (None when the first message was refused and the conversation failed.)
        IF v_inserted > 0 THEN
            PERFORM pg_notify(current_schema() || '_transmit', '');
            UPDATE endpoints SET send_sequence = send_sequence + v_count - 1
             WHERE conversation_handle = p_handle;
            RETURN;
        END IF;
    END IF;
    v_fast := e.state = 'CO' AND e.peer_handle IS NOT NULL AND e.peer_enabled
              AND NOT e.retention AND v_valid
              AND NOT EXISTS (SELECT 1 FROM transmissions WHERE conversation_handle = p_handle);
    IF NOT v_fast THEN
        FOR i IN 2 .. v_count LOOP
            PERFORM send(ARRAY[p_handle], p_message_type, p_bodies[i], p_bodies[i] IS NULL,
                         p_checked_as, p_xml_errors[i]);
        END LOOP;
        RETURN;
    END IF;
    INSERT INTO queue_messages (queue_id, priority, conversation_group_id, conversation_handle,
                                message_sequence_number, precedence, service_id,
                                service_contract_id, message_type_id, message_body, message_id,
                                enqueued_at)
    SELECT e.peer_queue, e.priority, e.peer_group, e.peer_handle,
           e.send_sequence + x.ord - 1, 2, e.peer_service, e.service_contract_id,
           v_type.message_type_id, nullif(x.body, '\x'::bytea), nth_message_id(v_batch, x.ord),
           v_now
      FROM unnest(p_bodies[2:]) WITH ORDINALITY AS x(body, ord);
    UPDATE endpoints SET send_sequence = send_sequence + v_count - 1
     WHERE conversation_handle = p_handle;
    PERFORM wake_waiters(e.peer_queue);
END
$$;

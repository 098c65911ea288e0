-- What the broker's pages in Airflow's UI (airflow_broker.ui) read and change, for any login:
-- each function applies the broker's permission checks to the calling login, so the pages'
-- login needs only broker permissions (docs/security.md, "The UI in Airflow"), never
-- membership of the schema's owner.
--
-- As SQL Server's metadata visibility: a queue is listed to a login that owns it or holds any
-- permission on it (VIEW DEFINITION included, on the queue or on the database). Its messages
-- and its quarantine are shown to a login that may RECEIVE from it: SQL Server guards SELECT
-- on a queue with a SELECT permission of its own, which the broker does not have, and RECEIVE
-- (held by the queue's readers, implied by CONTROL and ownership) is the right to read those
-- messages. Putting quarantined messages back is a reader's act (RECEIVE); enabling a queue
-- is ALTER QUEUE's (ALTER on the queue, alter_queue()).

-- A queue's ready messages, counted exactly up to p_exact_limit and estimated above it from
-- the planner's statistics of queue_messages.queue_id (as the planner would for
-- "WHERE queue_id = ..."): the overview refreshes every few seconds, and counting a backlog of
-- a million rows on each refresh would keep a database core busy for every open page. And the
-- enqueue time of its head, the first ready message of each priority by the ready index (a
-- loose index scan over the few priorities present), rather than min() over every message.
CREATE OR REPLACE FUNCTION console_queue_depth(p_queue integer, p_exact_limit integer,
    OUT ready_messages bigint, OUT is_estimate boolean, OUT oldest_ready_at timestamp)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_rows real;
    v_values integer[];
    v_freqs real[];
    v_distinct real;
    v_at integer;
    v_estimate bigint;
BEGIN
    SELECT count(*) INTO ready_messages
      FROM (SELECT 1 FROM queue_messages m
             WHERE m.queue_id = p_queue AND m.status = 1 LIMIT p_exact_limit + 1) head;
    is_estimate := ready_messages > p_exact_limit;
    IF is_estimate THEN
        SELECT c.reltuples, st.most_common_vals::text::integer[], st.most_common_freqs,
               st.n_distinct
          INTO v_rows, v_values, v_freqs, v_distinct
          FROM pg_class c
          JOIN pg_stats st ON st.schemaname = current_schema()
                          AND st.tablename = 'queue_messages' AND st.attname = 'queue_id'
         WHERE c.oid = 'queue_messages'::regclass;
        IF v_rows > 0 THEN
            v_at := array_position(v_values, p_queue);
            IF v_at IS NOT NULL THEN
                v_estimate := round(v_freqs[v_at] * v_rows);
            ELSE
                v_distinct := CASE WHEN v_distinct < 0 THEN -v_distinct * v_rows
                                   ELSE v_distinct END;
                v_estimate := round((1 - coalesce((SELECT sum(f) FROM unnest(v_freqs) f), 0))
                                    * v_rows / greatest(v_distinct
                                                        - coalesce(cardinality(v_values), 0), 1));
            END IF;
            -- Statistics older than the backlog say less than was just counted.
            ready_messages := greatest(ready_messages, v_estimate);
        END IF;
    END IF;
    WITH RECURSIVE priorities(priority) AS (
        (SELECT m.priority FROM queue_messages m
          WHERE m.queue_id = p_queue AND m.status = 1 ORDER BY m.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT m.priority FROM queue_messages m
                 WHERE m.queue_id = p_queue AND m.status = 1 AND m.priority < p.priority
                 ORDER BY m.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL)
    SELECT min((SELECT m.enqueued_at FROM queue_messages m
                 WHERE m.queue_id = p_queue AND m.status = 1 AND m.priority = p.priority
                 ORDER BY m.queuing_order LIMIT 1))
      INTO oldest_ready_at
      FROM priorities p WHERE p.priority IS NOT NULL;
END
$$;

-- Every queue the login may see: its state, depth (exact up to p_exact_limit ready messages,
-- estimated above) and oldest ready message, its activated readers, its latest disable event
-- and the size of its quarantine; its queue monitor (sys.dm_broker_queue_monitors' state,
-- stuck when NOTIFIED for a minute while messages wait, as stuck_queue_monitors says) and how
-- many RECEIVEs have taken messages from it (the monitor's two counters, all RECEIVEs less
-- the empty ones, which the pages turn into a rate);
-- and whether the login may RECEIVE from it and ALTER it, so the pages offer only what the
-- broker would allow. The ids of the messages that made poison detection disable the queue
-- are a reader's to know.
-- (Dropped first: the monitor's columns and the counter are new, as were depth_is_estimate
-- and p_exact_limit before.)
DROP FUNCTION IF EXISTS console_queues();
DROP FUNCTION IF EXISTS console_queues(integer);
CREATE FUNCTION console_queues(p_exact_limit integer)
RETURNS TABLE (name text, schema_name text, is_receive_enabled boolean, disabled_reason text,
               disabled_at timestamp, is_activation_enabled boolean, max_readers integer,
               ready_messages bigint, oldest_ready_at timestamp, readers_running bigint,
               poison_reason text, poison_at timestamp, poison_message_ids uuid[],
               quarantined bigint, may_receive boolean, may_alter boolean,
               depth_is_estimate boolean, monitor_state text, monitor_state_since timestamp,
               monitor_stuck boolean, last_activated_time timestamp, receives bigint)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT q.name, q.schema_name, q.is_receive_enabled, q.disabled_reason, q.disabled_at,
           q.is_activation_enabled, q.max_readers, depth.ready_messages, depth.oldest_ready_at,
           (SELECT count(*) FROM activated_tasks t WHERE t.queue_id = q.object_id),
           e.reason, e.disabled_at, CASE WHEN r.may_receive THEN e.message_ids END,
           (SELECT count(*) FROM quarantine x
             WHERE x.queue_id = q.object_id AND x.status IN ('quarantined', 'retrying')),
           r.may_receive, r.may_alter, depth.is_estimate,
           CASE WHEN mq.queue_id IS NOT NULL THEN coalesce(m.state, 'INACTIVE') END,
           m.state_since,
           coalesce(m.state = 'NOTIFIED' AND m.state_since < utc_now() - interval '60 seconds'
                    AND depth.ready_messages > 0, false),
           m.last_activated_time,
           coalesce(pg_sequence_last_value(q.receive_counter::regclass), 0)
               - coalesce(pg_sequence_last_value(q.empty_receive_counter::regclass), 0)
      FROM queues q
      CROSS JOIN LATERAL (
          SELECT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
                     AS may_receive,
                 has_permission('ALTER', 1::smallint, q.object_id, q.principal_id)
                     AS may_alter) r
      LEFT JOIN LATERAL (
          SELECT d.reason, d.disabled_at, d.message_ids FROM queue_disable_events d
           WHERE d.queue_id = q.object_id ORDER BY d.event_id DESC LIMIT 1) e ON true
      LEFT JOIN monitored_queues mq ON mq.queue_id = q.object_id
      LEFT JOIN queue_monitor_state m ON m.queue_id = q.object_id
      CROSS JOIN LATERAL console_queue_depth(q.object_id, p_exact_limit) depth
     WHERE (SELECT is_broker_owner()) OR may_see(1::smallint, q.object_id, q.principal_id)
     ORDER BY q.name, q.schema_name
$$;

-- Whether the login may RECEIVE from and ALTER the named queue, as the broker judges it; no
-- row for a queue it may not see. A queue page asks on each refresh: one queue, not
-- console_queues()' depths of them all.
CREATE OR REPLACE FUNCTION console_queue_rights(p_queue text)
RETURNS TABLE (may_receive boolean, may_alter boolean)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    SELECT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id),
           has_permission('ALTER', 1::smallint, q.object_id, q.principal_id)
      FROM visible_queue(p_queue) q;
END
$$;

-- The queue a console read or replay names, if the login may RECEIVE from it: 208 for a queue
-- it may not see (as RECEIVE answers), 229 for one it sees without RECEIVE.
CREATE OR REPLACE FUNCTION console_readable_queue(p_queue text) RETURNS queues
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
BEGIN
    SELECT * INTO q FROM visible_queue(p_queue);
    IF q.object_id IS NULL THEN
        PERFORM raise_error(208, coalesce(p_queue, 'NULL'));
    END IF;
    PERFORM require_on_queue('RECEIVE', q);
    RETURN q;
END
$$;

-- The head of a queue: its first p_limit ready messages in the order RECEIVE takes them
-- (priority, then queuing order, by the ready index, so a backlog of millions is not sorted
-- for a page of 500), then those held back until an earlier one arrives (status 2), by
-- conversation and sequence number.
CREATE OR REPLACE FUNCTION console_queue_messages(p_queue text, p_limit integer)
RETURNS TABLE (conversation_group_id uuid, conversation_handle uuid,
               message_sequence_number bigint, message_type_name text, status smallint,
               priority smallint, enqueued_at timestamp, message_id uuid,
               message_body bytea)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := console_readable_queue(p_queue);
BEGIN
    RETURN QUERY
    SELECT m.conversation_group_id, m.conversation_handle, m.message_sequence_number,
           t.name, m.status::smallint, m.priority::smallint, m.enqueued_at, m.message_id,
           m.message_body
      FROM ((SELECT x.*, 1 AS part FROM queue_messages x
              WHERE x.queue_id = q.object_id AND x.status = 1
              ORDER BY x.priority DESC, x.queuing_order LIMIT p_limit)
            UNION ALL
            (SELECT x.*, 2 FROM queue_messages x
              WHERE x.queue_id = q.object_id AND x.status = 2
              ORDER BY x.conversation_handle, x.message_sequence_number LIMIT p_limit)) m
      JOIN message_types t ON t.message_type_id = m.message_type_id
     ORDER BY m.part, CASE WHEN m.part = 1 THEN -m.priority END,
              CASE WHEN m.part = 1 THEN m.queuing_order END, m.conversation_handle,
              m.message_sequence_number
     LIMIT p_limit;
END
$$;

-- The newest reader runs of a queue (Spark jobs of readers, or any run of QueueReader), with
-- the Airflow task instance that started one (the "airflow" key ActivatedReaderOperator puts in
-- its plan) and its counts: a running run's are the summary so far.
CREATE OR REPLACE FUNCTION console_reader_runs(p_queue text, p_limit integer)
RETURNS TABLE (run_id uuid, started_at timestamp, ended_at timestamp, airflow jsonb,
               summary jsonb)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := console_readable_queue(p_queue);
BEGIN
    RETURN QUERY
    SELECT r.run_id, r.started_at, r.ended_at, r.summary -> 'airflow',
           CASE WHEN r.ended_at IS NULL THEN reader_run_summary(r.run_id) ELSE r.summary END
      FROM reader_runs r
     WHERE r.queue_name IN (q.name, q.schema_name || '.' || q.name)
     ORDER BY r.started_at DESC
     LIMIT p_limit;
END
$$;

-- The newest activations of a queue's procedure (internal activation): who ran it, how it
-- ended, what it received and rolled back, and the exception that ended it.
CREATE OR REPLACE FUNCTION console_activations(p_queue text, p_limit integer)
RETURNS TABLE (task_id uuid, procedure text, execute_as text, started_at timestamp,
               ended_at timestamp, outcome text, messages_received bigint, rollbacks bigint,
               exception text)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := console_readable_queue(p_queue);
BEGIN
    RETURN QUERY
    SELECT a.task_id, a.procedure, a.execute_as, a.started_at, a.ended_at, a.outcome,
           a.messages_received, a.rollbacks, a.exception
      FROM activation_log a
     WHERE a.queue_id = q.object_id
     ORDER BY a.started_at DESC
     LIMIT p_limit;
END
$$;

-- A queue's quarantined and parked (retrying) messages, oldest first: those whose error holds
-- p_error (ignoring case) and that were quarantined at or after p_since (NULL: any), at most
-- p_limit (NULL: all). The queue's open quarantine is read in this order through its index
-- (quarantine_open_by_time), so a page stops at its end; a filter on body content, which must
-- decode each body as the client does, is the caller's.
DROP FUNCTION IF EXISTS console_quarantine(text);
CREATE OR REPLACE FUNCTION console_quarantine(p_queue text, p_error text, p_since timestamp,
                                              p_limit integer)
RETURNS TABLE (quarantine_id bigint, status text, quarantined_at timestamp, attempts integer,
               conversation_handle uuid, message_type_name text,
               message_sequence_number bigint, message_id uuid, message_body bytea,
               error text)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := console_readable_queue(p_queue);
BEGIN
    RETURN QUERY
    SELECT x.quarantine_id, x.status, x.quarantined_at, x.attempts, x.conversation_handle,
           x.message_type_name, x.message_sequence_number, x.message_id, x.message_body,
           x.error
      FROM quarantine x
     WHERE x.queue_id = q.object_id AND x.status IN ('quarantined', 'retrying')
       AND (p_since IS NULL OR x.quarantined_at >= p_since)
       AND (p_error IS NULL OR strpos(lower(x.error), lower(p_error)) > 0)
     ORDER BY x.quarantined_at, x.quarantine_id
     LIMIT p_limit;
END
$$;

-- The same messages by error, the largest group first: how many, when the first and the last
-- were quarantined, and the ids of the oldest p_ids of them (what replaying the group takes,
-- p_ids at a time), however many the page lists.
CREATE OR REPLACE FUNCTION console_quarantine_groups(p_queue text, p_error text,
                                                     p_since timestamp, p_ids integer)
RETURNS TABLE (error text, messages bigint, first_quarantined_at timestamp,
               last_quarantined_at timestamp, quarantine_ids bigint[])
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := console_readable_queue(p_queue);
BEGIN
    RETURN QUERY
    SELECT x.error, count(*), min(x.quarantined_at), max(x.quarantined_at),
           (array_agg(x.quarantine_id ORDER BY x.quarantined_at, x.quarantine_id))[1:p_ids]
      FROM quarantine x
     WHERE x.queue_id = q.object_id AND x.status IN ('quarantined', 'retrying')
       AND (p_since IS NULL OR x.quarantined_at >= p_since)
       AND (p_error IS NULL OR strpos(lower(x.error), lower(p_error)) > 0)
     GROUP BY x.error
     ORDER BY count(*) DESC, min(x.quarantined_at), min(x.quarantine_id);
END
$$;

-- Replays (p_replay) or discards the quarantined messages, once every id is found waiting.
CREATE OR REPLACE FUNCTION console_settle(p_queue text, p_quarantine_ids bigint[],
                                          p_replay boolean)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id bigint;
    v_count integer := 0;
BEGIN
    FOR v_id IN SELECT console_quarantined(p_queue, p_quarantine_ids) LOOP
        IF p_replay THEN
            PERFORM replay_quarantined(v_id);
        ELSE
            PERFORM discard_quarantined(v_id);
        END IF;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

-- Puts quarantined messages of one queue back on their conversations, in order: a reader's
-- act, so RECEIVE on the queue. An id that is not waiting in this queue's quarantine is, to
-- this login, one that does not exist (15151), and nothing is replayed.
CREATE OR REPLACE FUNCTION console_replay(p_queue text, p_quarantine_ids bigint[])
RETURNS integer LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT console_settle(p_queue, p_quarantine_ids, true)
$$;

-- Discards quarantined messages of one queue (RECEIVE on it): kept as 'discarded', never
-- delivered; 15151 for an id not waiting in the queue's quarantine, and nothing discarded.
CREATE OR REPLACE FUNCTION console_discard(p_queue text, p_quarantine_ids bigint[])
RETURNS integer LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT console_settle(p_queue, p_quarantine_ids, false)
$$;

-- The ids, in order and once each, if every one waits in the quarantine of a queue the login
-- may RECEIVE from; 15151 for the first that does not, before anything is changed.
CREATE OR REPLACE FUNCTION console_quarantined(p_queue text, p_quarantine_ids bigint[])
RETURNS SETOF bigint LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues := console_readable_queue(p_queue);
    v_missing bigint;
BEGIN
    SELECT i INTO v_missing
      FROM unnest(p_quarantine_ids) i
     WHERE NOT EXISTS (SELECT 1 FROM quarantine x
                        WHERE x.quarantine_id = i AND x.queue_id = q.object_id
                          AND x.status IN ('quarantined', 'retrying'))
     ORDER BY i LIMIT 1;
    IF v_missing IS NOT NULL OR EXISTS (SELECT 1 FROM unnest(p_quarantine_ids) i
                                         WHERE i IS NULL) THEN
        PERFORM raise_error(15151, 'quarantined message', coalesce(v_missing::text, 'NULL'));
    END IF;
    RETURN QUERY SELECT DISTINCT i FROM unnest(p_quarantine_ids) i ORDER BY i;
END
$$;

-- The conversations the login may see, as conversation_endpoints shows them (RECEIVE on the
-- queue of the conversation's own service), newest first, leaks flagged: CLOSED targets whose
-- security timestamp was never set and whose lifetime is more than a month away
-- (leaked_endpoints, 80_leaks.sql), which reclaim would not remove for decades. p_state
-- (SQL Server's two-letter state), p_leaked_only and p_handle narrow the list.
CREATE OR REPLACE FUNCTION console_conversations(p_state text, p_leaked_only boolean,
                                                 p_limit integer, p_handle uuid DEFAULT NULL)
RETURNS TABLE (conversation_handle uuid, conversation_id uuid, is_initiator boolean,
               service_name text, far_service text, state text, state_desc text,
               lifetime timestamp, created_at timestamp, is_leaked boolean)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT * FROM (
        SELECT e.conversation_handle, e.conversation_id, e.is_initiator, s.name,
               e.far_service, e.state::text,
               CASE e.state
                   WHEN 'SO' THEN 'STARTED_OUTBOUND' WHEN 'SI' THEN 'STARTED_INBOUND'
                   WHEN 'CO' THEN 'CONVERSING' WHEN 'DI' THEN 'DISCONNECTED_INBOUND'
                   WHEN 'DO' THEN 'DISCONNECTED_OUTBOUND' WHEN 'ER' THEN 'ERROR'
                   WHEN 'CD' THEN 'CLOSED' END,
               e.lifetime, e.created_at,
               e.state = 'CD' AND NOT e.is_initiator AND e.security_timestamp = '1900-01-01'
                   AND e.lifetime > (SELECT utc_now()) + interval '1 month' AS is_leaked
          FROM endpoints e
          JOIN service_defs s USING (service_id)
          JOIN queues q ON q.object_id = s.service_queue_id
         WHERE NOT e.is_system
           AND (p_state IS NULL OR e.state = p_state)
           AND (p_handle IS NULL OR e.conversation_handle = p_handle)
           AND ((SELECT is_broker_owner())
                OR has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id))) c
     WHERE NOT coalesce(p_leaked_only, false) OR c.is_leaked
     ORDER BY c.created_at DESC, c.conversation_handle
     LIMIT p_limit
$$;

-- How many of those conversations are in each state, and how many are leaks.
CREATE OR REPLACE FUNCTION console_conversation_counts()
RETURNS TABLE (state text, endpoints bigint, leaked bigint)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT c.state, count(*), count(*) FILTER (WHERE c.is_leaked)
      FROM console_conversations(NULL, false, NULL) c
     GROUP BY c.state ORDER BY c.state
$$;

-- What waits in the transmission queue (sys.transmission_queue), per route: per destination
-- service and broker instance, as a route matches them (spec 21.2). For each, how many
-- messages of how many conversations, the oldest, the attempts so far, the status of the
-- latest attempt ('' = not attempted yet) and when the next is due; where the broker would
-- send them now ('local': a queue of this broker, 'remote': another broker through a route,
-- 'no route'), never the route's address, which may carry a password and is the owner's to
-- read. A login sees what the services whose queue it may see sent (as console_queues shows a
-- queue's depth); may_retry says whether it may RECEIVE from every such queue, which
-- console_retry_transmissions() asks.
CREATE OR REPLACE FUNCTION console_transmissions(p_limit integer)
RETURNS TABLE (to_service_name text, to_broker_instance text, delivery text, messages bigint,
               conversations bigint, oldest_enqueue_time timestamp, attempts integer,
               transmission_status text, last_attempt_at timestamp,
               next_attempt_at timestamp, may_retry boolean)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT w.to_service_name, w.to_broker_instance,
           CASE WHEN r.address IS NULL THEN 'no route'
                -- A conversation with a peer in another broker is not delivered locally.
                WHEN r.address = 'LOCAL' THEN CASE WHEN w.is_remote THEN 'no route'
                                                   ELSE 'local' END
                ELSE 'remote' END,
           w.messages, w.conversations, w.oldest, w.attempts, w.status, w.last_attempt_at,
           w.next_attempt_at, w.may_retry
      FROM (
        SELECT t.to_service_name,
               coalesce(e.far_broker_instance, e.to_broker_instance) AS to_broker_instance,
               bool_or(e.is_remote) AS is_remote, count(*) AS messages,
               count(DISTINCT t.conversation_handle) AS conversations,
               min(t.enqueue_time) AS oldest, max(t.attempts) AS attempts,
               -- The latest attempt tells why the route's messages still wait.
               (array_agg(t.transmission_status ORDER BY t.last_attempt_at DESC NULLS LAST,
                          t.transmission_id DESC))[1] AS status,
               max(t.last_attempt_at) AS last_attempt_at,
               min(t.next_attempt_at) AS next_attempt_at,
               bool_and(v.may_receive) AS may_retry
          FROM transmissions t
          JOIN endpoints e ON e.conversation_handle = t.conversation_handle
          JOIN service_defs s ON s.service_id = e.service_id
          JOIN queues q ON q.object_id = s.service_queue_id
          CROSS JOIN LATERAL (
              SELECT (SELECT is_broker_owner())
                         OR has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
                         AS may_receive) v
         WHERE (SELECT is_broker_owner()) OR may_see(1::smallint, q.object_id, q.principal_id)
         GROUP BY t.to_service_name, coalesce(e.far_broker_instance, e.to_broker_instance)) w
     CROSS JOIN LATERAL (
         SELECT route_address(w.to_service_name, w.to_broker_instance) AS address) r
     ORDER BY w.oldest, w.to_service_name, w.to_broker_instance
     LIMIT p_limit
$$;

-- Retry now: what waits for one route (destination service and broker instance; NULL for
-- none) is due at once, as CREATE and ALTER ROUTE make it, instead of at the end of its
-- back-off (up to 64 s). The broker worker tries it at its next pass (the transport at once,
-- woken as by a SEND). Attempts are kept, so a failure backs off again from where it was: a
-- click is one more attempt, not a new series of quick ones. It changes when, never what or
-- where. Retrying is the sender's act, as SEND on the conversation is: RECEIVE on the queue
-- of each waiting conversation's own service (229 for the first it lacks, and nothing
-- changes). Returns how many messages were made due; 0 when nothing the login may see waits.
CREATE OR REPLACE FUNCTION console_retry_transmissions(p_to_service text,
                                                       p_to_broker_instance text)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_now timestamp := utc_now();
    v_owner boolean := is_broker_owner();
    v_handles uuid[];
    v_queues integer[];
    v_denied queues;
    v_count integer;
BEGIN
    -- Found through transmissions_destination, their endpoints by key.
    SELECT array_agg(DISTINCT t.conversation_handle), array_agg(DISTINCT q.object_id)
      INTO v_handles, v_queues
      FROM transmissions t
      JOIN endpoints e ON e.conversation_handle = t.conversation_handle
      JOIN service_defs s ON s.service_id = e.service_id
      JOIN queues q ON q.object_id = s.service_queue_id
     WHERE t.to_service_name = p_to_service
       AND coalesce(e.far_broker_instance, e.to_broker_instance)
           IS NOT DISTINCT FROM p_to_broker_instance
       AND (v_owner OR may_see(1::smallint, q.object_id, q.principal_id));
    IF v_handles IS NULL THEN
        RETURN 0;
    END IF;
    IF NOT v_owner THEN
        SELECT q.* INTO v_denied
          FROM queues q
         WHERE q.object_id = ANY (v_queues)
           AND NOT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
         ORDER BY q.name LIMIT 1;
        IF v_denied.object_id IS NOT NULL THEN
            PERFORM require_on_queue('RECEIVE', v_denied);
        END IF;
    END IF;
    UPDATE transmissions SET next_attempt_at = v_now
     WHERE to_service_name = p_to_service AND conversation_handle = ANY (v_handles);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        -- Wakes the transport (LISTEN in the broker worker) when this transaction commits.
        PERFORM pg_notify(current_schema() || '_transmit', '');
    END IF;
    RETURN v_count;
END
$$;

-- What one Airflow consumer holds in the Airflow inbox (airflow_inbox: a sensor's task
-- instance is 'task:<dag_id>/<run_id>/<task_id>/<map_index>'), oldest first: the messages it
-- received, in which state (claimed, delivered, rejected, consumed) and since when. A row is
-- shown only to a login that may RECEIVE from its queue, as the queue's own messages are
-- (console_queue_messages): the inbox holds what a RECEIVE took from that queue. Rows of other
-- queues are left out rather than refused, as console_conversations leaves out conversations
-- of queues the login may not read, so a task instance that received from several queues shows
-- what the login may read. Bodies of consumed rows are gone already (airflow_consume).
CREATE OR REPLACE FUNCTION console_inbox(p_consumer text, p_limit integer)
RETURNS TABLE (inbox_id bigint, queue_name text, state text, claimed_at timestamp,
               delivered_at timestamp, consumed_at timestamp,
               conversation_group_id uuid, conversation_handle uuid,
               message_sequence_number bigint, service_name text,
               service_contract_name text, message_type_name text, message_id uuid,
               message_body bytea)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT i.inbox_id, i.queue_name, i.state, i.claimed_at, i.delivered_at, i.consumed_at,
           i.conversation_group_id, i.conversation_handle, i.message_sequence_number,
           i.service_name, i.service_contract_name, i.message_type_name, i.message_id,
           i.message_body
      FROM airflow_inbox i
      -- The queue as the RECEIVE named it; a queue dropped since is no longer anyone's to
      -- read, bar the owner.
      LEFT JOIN LATERAL find_queue(i.queue_name) q ON true
     WHERE i.consumer = p_consumer
       AND ((SELECT is_broker_owner())
            OR (q.object_id IS NOT NULL
                AND has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)))
     ORDER BY i.inbox_id
     LIMIT p_limit
$$;

-- One conversation end to end, as far as the login may see it: the endpoint p_handle names and
-- its peer when the peer lives in this broker (the same conversation_id), each only with
-- RECEIVE on the queue of its own service; 8426 when the named endpoint is not one the login
-- may see, as GET_TRANSMISSION_STATUS answers. A peer in another broker is named by its
-- service and broker instance: its endpoint is that broker's to show. The columns the catalog
-- view derives (state_desc, a local target's receive_sequence and security_timestamp) come
-- from conversation_endpoints itself, so the page and the view never disagree.
DROP FUNCTION IF EXISTS console_conversation_endpoints(uuid);
CREATE FUNCTION console_conversation_endpoints(p_handle uuid)
RETURNS TABLE (conversation_handle uuid, conversation_id uuid, is_initiator boolean,
               service_name text, queue_name text, far_service text,
               far_broker_instance text, state text, state_desc text, lifetime timestamp,
               security_timestamp timestamp, send_sequence bigint, receive_sequence bigint,
               created_at timestamp, transmission_status text)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_id uuid;
BEGIN
    SELECT e.conversation_id INTO v_id
      FROM endpoints e
      JOIN service_defs s USING (service_id)
      JOIN queues q ON q.object_id = s.service_queue_id
     WHERE e.conversation_handle = p_handle AND NOT e.is_system
       AND (is_broker_owner()
            OR has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id));
    IF v_id IS NULL THEN
        PERFORM raise_error(8426, coalesce(p_handle::text, 'NULL'));
    END IF;
    RETURN QUERY
    SELECT c.conversation_handle, c.conversation_id, c.is_initiator, s.name, q.name,
           c.far_service, c.far_broker_instance, c.state::text, c.state_desc, c.lifetime,
           c.security_timestamp, c.send_sequence, c.receive_sequence, e.created_at,
           get_transmission_status(c.conversation_handle)
      FROM conversation_endpoints c
      JOIN endpoints e ON e.conversation_handle = c.conversation_handle
      JOIN service_defs s ON s.service_id = c.service_id
      JOIN queues q ON q.object_id = s.service_queue_id
     WHERE c.conversation_id = v_id AND NOT c.is_system
     ORDER BY c.is_initiator DESC;
END
$$;

-- The messages of that conversation this broker holds, for each endpoint the login may see:
-- those waiting in the endpoint's queue (ready, or held back until an earlier one arrives) and
-- those waiting in the transmission queue to be sent from it, with their transmission status;
-- at most p_limit of each, in sequence order.
CREATE OR REPLACE FUNCTION console_conversation_messages(p_handle uuid, p_limit integer)
RETURNS TABLE (conversation_handle uuid, place text, message_sequence_number bigint,
               message_type_name text, status text, at timestamp, transmission_status text,
               message_id uuid, message_body bytea)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN QUERY
    WITH seen AS (
        SELECT x.conversation_handle, x.conversation_group_id
          FROM console_conversation_endpoints(p_handle) c
          JOIN endpoints x ON x.conversation_handle = c.conversation_handle)
    (SELECT m.conversation_handle, 'queue'::text, m.message_sequence_number, t.name,
            CASE m.status WHEN 1 THEN 'ready' ELSE 'held back' END, m.enqueued_at,
            NULL::text, m.message_id, m.message_body
       FROM seen
       JOIN queue_messages m ON m.conversation_group_id = seen.conversation_group_id
                            AND m.conversation_handle = seen.conversation_handle
       JOIN message_types t ON t.message_type_id = m.message_type_id
      WHERE m.status IN (1, 2)
      ORDER BY m.conversation_handle, m.message_sequence_number
      LIMIT p_limit)
    UNION ALL
    (SELECT r.conversation_handle, 'transmission'::text, r.message_sequence_number, t.name,
            'waiting to be sent', r.enqueue_time, r.transmission_status, r.message_id,
            r.message_body
       FROM seen
       JOIN transmissions r ON r.conversation_handle = seen.conversation_handle
       JOIN message_types t ON t.message_type_id = r.message_type_id
      ORDER BY r.conversation_handle, r.message_sequence_number
      LIMIT p_limit);
END
$$;

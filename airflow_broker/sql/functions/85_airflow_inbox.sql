-- What the Airflow provider needs from the broker: a peek that tells a trigger whether RECEIVE
-- would return something, and the Airflow inbox (V004), where a RECEIVE made for an Airflow
-- consumer keeps its messages until the consumer has used them.

-- An Airflow consumer's rows are for readers of their queues: the functions that act on a
-- consumer's rows first check RECEIVE on each of them. A consumer of a queue the login may
-- not see is not found (15151): the refusal does not name that queue.
CREATE OR REPLACE FUNCTION require_inbox_consumers(p_consumers text[])
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    r record;
BEGIN
    IF is_broker_owner() THEN
        RETURN;
    END IF;
    FOR r IN SELECT i.consumer, f.object_id
               FROM (SELECT DISTINCT consumer, queue_name FROM airflow_inbox
                      WHERE consumer = ANY (p_consumers)) i,
                    find_queue(i.queue_name) f
              WHERE f.object_id IS NOT NULL LOOP
        PERFORM require_visible_queue('RECEIVE', r.object_id, 15151, 'Airflow consumer',
                                      r.consumer);
    END LOOP;
END
$$;

-- The queue a trigger watches: whether it exists, and whether (and why) it is disabled.
CREATE OR REPLACE FUNCTION airflow_queue_state(p_queue text)
RETURNS TABLE (queue_id integer, queue_name text, schema_name text, is_receive_enabled boolean,
               disabled_reason text, disabled_at timestamp)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
BEGIN
    -- A queue the login may not see is answered as one that does not exist.
    SELECT * INTO q FROM visible_queue(p_queue);
    IF q.object_id IS NULL THEN
        PERFORM raise_error(208, coalesce(p_queue, 'NULL'));
    END IF;
    RETURN QUERY SELECT q.object_id, q.name, q.schema_name, q.is_receive_enabled,
                        q.disabled_reason, q.disabled_at;
END
$$;

-- Up to p_limit ready messages that a RECEIVE could take now, without taking them: messages of
-- groups that a reader holds are left out, as RECEIVE would skip them. The groups are probed
-- with FOR SHARE SKIP LOCKED inside a subtransaction that is rolled back, so the probe leaves
-- no lock behind even when the caller is inside a transaction. Like lock_next_group, the probe
-- takes the groups of a window of messages at once, and a held group is then passed over by a
-- filter: probing per message tried a held group's lock once for each of its messages, on every
-- poll of a trigger.
CREATE OR REPLACE FUNCTION airflow_peek(
    p_queue text,
    p_limit integer DEFAULT 1,
    p_conversation_handle uuid DEFAULT NULL,
    p_conversation_group_id uuid DEFAULT NULL,
    p_message_types text[] DEFAULT NULL)
RETURNS SETOF received_message LANGUAGE plpgsql SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan SET enable_bitmapscan = off SET enable_sort = off AS $$
DECLARE
    q queues := find_queue(p_queue);
    v_window bigint := p_limit::bigint + 16;
    v_rows received_message[];
    v_groups uuid[];
    v_free uuid[];
    v_locked uuid[] := '{}';
    v_msg received_message;
    v_returned integer := 0;
BEGIN
    IF q.object_id IS NULL THEN
        PERFORM raise_error(208, coalesce(p_queue, 'NULL'));
    END IF;
    PERFORM require_on_queue('RECEIVE', q);
    IF p_limit IS NULL OR p_limit < 0 THEN
        PERFORM raise_error(50106, coalesce(p_limit::text, 'NULL'), 'LIMIT',
                            'a number of rows of 0 or more');
    END IF;
    IF p_limit = 0 THEN
        RETURN;
    END IF;
    LOOP
        SELECT coalesce(array_agg(x.msg ORDER BY x.priority DESC, x.queuing_order), '{}')
          INTO v_rows
          FROM (SELECT ROW(1::smallint, m.priority, m.queuing_order, m.conversation_group_id,
                           m.conversation_handle, m.message_sequence_number, s.name,
                           m.service_id, c.name, m.service_contract_id, mt.name,
                           m.message_type_id,
                           CASE mt.validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E'
                                ELSE 'X' END,
                           m.message_body, m.message_id,
                           coalesce(a.attempts, 0))::received_message AS msg,
                       m.priority, m.queuing_order
                  FROM queue_messages m
                  JOIN dialog_groups g ON g.conversation_group_id = m.conversation_group_id
                  JOIN service_defs s ON s.service_id = m.service_id
                  JOIN contracts c ON c.service_contract_id = m.service_contract_id
                  JOIN message_types mt ON mt.message_type_id = m.message_type_id
                  LEFT JOIN message_attempts a ON a.message_id = m.message_id
                 WHERE m.queue_id = q.object_id AND m.status = 1
                   AND m.conversation_group_id <> ALL (v_locked)
                   AND (p_conversation_handle IS NULL
                        OR m.conversation_handle = p_conversation_handle)
                   AND (p_conversation_group_id IS NULL
                        OR m.conversation_group_id = p_conversation_group_id)
                   AND (p_message_types IS NULL OR mt.name = ANY (p_message_types))
                 ORDER BY m.priority DESC, m.queuing_order
                 LIMIT v_window) x;
        v_groups := ARRAY(SELECT DISTINCT r.conversation_group_id FROM unnest(v_rows) r);
        BEGIN
            v_free := ARRAY(SELECT g.conversation_group_id FROM dialog_groups g
                             WHERE g.conversation_group_id = ANY (v_groups)
                               FOR SHARE SKIP LOCKED);
            -- Rolls the subtransaction back: the share locks go, the variable keeps the ids.
            RAISE SQLSTATE 'SB901';
        EXCEPTION WHEN SQLSTATE 'SB901' THEN
            NULL;
        END;
        -- Done when no group was held, when the window reached the end of what is waiting, or
        -- when the free groups' messages in it fill the limit (they come first in order).
        EXIT WHEN cardinality(v_free) = cardinality(v_groups)
               OR cardinality(v_rows) < v_window
               OR (SELECT count(*) FROM unnest(v_rows) r
                    WHERE r.conversation_group_id = ANY (v_free)) >= p_limit;
        v_locked := v_locked || ARRAY(SELECT unnest(v_groups) EXCEPT SELECT unnest(v_free));
    END LOOP;
    FOREACH v_msg IN ARRAY v_rows LOOP
        CONTINUE WHEN v_msg.conversation_group_id <> ALL (v_free);
        RETURN NEXT v_msg;
        v_returned := v_returned + 1;
        EXIT WHEN v_returned = p_limit;
    END LOOP;
END
$$;

-- RECEIVE for an Airflow consumer: the messages go into airflow_inbox in the caller's
-- transaction, so they leave the queue only together with that commit. With message types
-- (and no conversation handle) the conversation of the first receivable message of those types
-- is received, in RECEIVE order. With p_hold the rows are marked with this session, so that
-- airflow_reclaim() hands them out again once the session is gone.
CREATE OR REPLACE FUNCTION airflow_claim(
    p_consumer text,
    p_queue text,
    p_top bigint DEFAULT NULL,
    p_conversation_handle uuid DEFAULT NULL,
    p_conversation_group_id uuid DEFAULT NULL,
    p_message_types text[] DEFAULT NULL,
    p_hold boolean DEFAULT false,
    p_dag_id text DEFAULT NULL,
    p_run_id text DEFAULT NULL)
RETURNS SETOF airflow_inbox LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_handle uuid := p_conversation_handle;
    v_group uuid := p_conversation_group_id;
    v_pid integer;
    v_started timestamptz;
BEGIN
    PERFORM check_name(p_consumer, 1000);
    IF p_message_types IS NOT NULL AND v_handle IS NULL THEN
        SELECT p.conversation_handle INTO v_handle
          FROM airflow_peek(p_queue, 1, NULL, v_group, p_message_types) p;
        IF v_handle IS NULL THEN
            RETURN;
        END IF;
        v_group := NULL;
    END IF;
    IF p_hold THEN
        v_pid := pg_backend_pid();
        SELECT a.backend_start INTO v_started FROM pg_stat_activity a WHERE a.pid = v_pid;
    END IF;
    RETURN QUERY
    WITH received AS (
        INSERT INTO airflow_inbox (
            consumer, dag_id, run_id, queue_name, holder_pid, holder_started, claimed_at,
            status, priority, queuing_order, conversation_group_id, conversation_handle,
            message_sequence_number, service_name, service_id, service_contract_name,
            service_contract_id, message_type_name, message_type_id, validation, message_body,
            message_id, attempts)
        SELECT p_consumer, p_dag_id, p_run_id, p_queue, v_pid, v_started, utc_now(),
               r.status, r.priority, r.queuing_order, r.conversation_group_id,
               r.conversation_handle, r.message_sequence_number, r.service_name, r.service_id,
               r.service_contract_name, r.service_contract_id, r.message_type_name,
               r.message_type_id, r.validation, r.message_body, r.message_id, r.attempts
          FROM receive(p_queue, p_top, v_handle, v_group) r
        RETURNING *)
    SELECT * FROM received ORDER BY inbox_id;
END
$$;

-- What a consumer holds: a retried task instance gets back exactly what its earlier try
-- received.
CREATE OR REPLACE FUNCTION airflow_claimed(p_consumer text)
RETURNS SETOF airflow_inbox LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT require_inbox_consumers(ARRAY[p_consumer]);
    SELECT * FROM airflow_inbox
     WHERE consumer = p_consumer AND state IN ('claimed', 'delivered')
     ORDER BY inbox_id;
$$;

-- One claimed row of a consumer, to hand over.
CREATE OR REPLACE FUNCTION airflow_fetch(p_consumer text, p_inbox_id bigint)
RETURNS SETOF airflow_inbox LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT require_inbox_consumers(ARRAY[p_consumer]);
    SELECT * FROM airflow_inbox
     WHERE consumer = p_consumer AND inbox_id = p_inbox_id AND state = 'claimed';
$$;

-- Whether a consumer has rows handed over and not yet consumed (delivered in the last p_within
-- seconds; NULL: at any time).
CREATE OR REPLACE FUNCTION airflow_awaiting_ack(p_consumer text, p_within double precision)
RETURNS boolean LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT require_inbox_consumers(ARRAY[p_consumer]);
    SELECT EXISTS (
        SELECT 1 FROM airflow_inbox
         WHERE consumer = p_consumer AND state = 'delivered'
           AND (p_within IS NULL
                OR delivered_at > utc_now() - make_interval(secs => p_within)));
$$;

-- Events handed out before a reconnect are still the manager's: this session takes them over
-- so that airflow_reclaim() does not hand them out twice.
CREATE OR REPLACE FUNCTION airflow_take_over(p_consumer text, p_inbox_ids bigint[])
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT require_inbox_consumers(ARRAY[p_consumer]);
    UPDATE airflow_inbox
       SET holder_pid = pg_backend_pid(),
           holder_started = (SELECT backend_start FROM pg_stat_activity
                              WHERE pid = pg_backend_pid())
     WHERE consumer = p_consumer AND inbox_id = ANY (p_inbox_ids);
$$;

-- Claimed rows of a consumer whose claiming session has gone (a triggerer that died before
-- Airflow stored the events): they now belong to this session and are handed out again.
CREATE OR REPLACE FUNCTION airflow_reclaim(p_consumer text)
RETURNS SETOF airflow_inbox LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_pid integer := pg_backend_pid();
    v_started timestamptz;
BEGIN
    PERFORM require_inbox_consumers(ARRAY[p_consumer]);
    SELECT a.backend_start INTO v_started FROM pg_stat_activity a WHERE a.pid = v_pid;
    RETURN QUERY
    WITH moved AS (
        UPDATE airflow_inbox i SET holder_pid = v_pid, holder_started = v_started
         WHERE i.consumer = p_consumer AND i.state = 'claimed'
           AND NOT EXISTS (
               SELECT 1 FROM pg_stat_activity a
                WHERE a.pid = i.holder_pid
                  -- backend_start is hidden for other roles' sessions.
                  AND (a.backend_start IS NULL OR a.backend_start = i.holder_started))
        RETURNING i.*)
    SELECT * FROM moved ORDER BY inbox_id;
END
$$;

-- Delivered rows of a watcher that no DAG run has consumed p_after seconds after they were
-- (last) handed out, that interval doubling with each time (up to an hour). Airflow stores an
-- asset event arriving while the scheduler creates the previous event's run without starting a
-- run for it, so a burst can end with messages whose events no run will ever see; a run that
-- failed for good leaves its messages behind too. The oldest such row is handed out again (one
-- new event starts a run, and Airflow gives that run every event stored since the previous
-- one), as 'claimed' by this session like a new message; consume() skips whatever an earlier
-- run took meanwhile. A row a consume() holds is skipped. Nothing is ever dropped: an Airflow
-- that is down for a while must not turn messages into dead letters.
CREATE OR REPLACE FUNCTION airflow_redeliver(p_consumer text, p_after double precision)
RETURNS SETOF airflow_inbox LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_pid integer := pg_backend_pid();
    v_started timestamptz;
BEGIN
    PERFORM require_inbox_consumers(ARRAY[p_consumer]);
    SELECT a.backend_start INTO v_started FROM pg_stat_activity a WHERE a.pid = v_pid;
    RETURN QUERY
    WITH stale AS (
        SELECT i.inbox_id FROM airflow_inbox i
         WHERE i.consumer = p_consumer AND i.state = 'delivered'
           AND i.delivered_at < utc_now() - make_interval(
                   secs => least(p_after * 2 ^ least(i.redeliveries, 20), 3600))
         ORDER BY i.inbox_id
         LIMIT 1
           FOR UPDATE SKIP LOCKED)
    UPDATE airflow_inbox i
       SET state = 'claimed', redeliveries = i.redeliveries + 1,
           holder_pid = v_pid, holder_started = v_started
      FROM stale
     WHERE i.inbox_id = stale.inbox_id
    RETURNING i.*;
END
$$;

-- Moves rows of a consumer on: 'delivered' (handed over, waiting for a DAG run to consume
-- them), 'rejected' (dead letter) or 'acked' (done: the rows are deleted). NULL ids: every row
-- of the consumer. A row a DAG run has consumed already stays consumed: a watcher's
-- acknowledgement can come after the run it started has processed the message. Returns how
-- many rows changed. An ack wakes watchers waiting for it.
CREATE OR REPLACE FUNCTION airflow_settle(p_consumer text, p_inbox_ids bigint[],
                                          p_state text DEFAULT 'acked')
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM require_inbox_consumers(ARRAY[p_consumer]);
    IF p_state = 'acked' THEN
        DELETE FROM airflow_inbox
         WHERE consumer = p_consumer AND (p_inbox_ids IS NULL OR inbox_id = ANY (p_inbox_ids));
        GET DIAGNOSTICS v_count = ROW_COUNT;
        IF v_count > 0 THEN
            PERFORM pg_notify(current_schema() || '_airflow_inbox', left(p_consumer, 7000));
        END IF;
    ELSIF p_state IN ('delivered', 'rejected', 'claimed') THEN
        UPDATE airflow_inbox
           SET state = p_state,
               delivered_at = CASE WHEN p_state = 'delivered' THEN utc_now() ELSE delivered_at END
         WHERE consumer = p_consumer AND (p_inbox_ids IS NULL OR inbox_id = ANY (p_inbox_ids))
           AND state <> 'consumed';
        GET DIAGNOSTICS v_count = ROW_COUNT;
    ELSE
        PERFORM raise_error(50106, coalesce(p_state, 'NULL'), 'STATE',
                            'claimed, delivered, rejected or acked');
    END IF;
    RETURN v_count;
END
$$;

-- What BrokerHook.consume() runs in the caller's transaction: the rows given by (consumer,
-- inbox id) that are still to be processed become 'consumed', so the caller's own effects
-- commit together with their removal; returns their ids. Rows consumed by an earlier
-- transaction are left out (a second asset event for the same message, a retried task). A row
-- that is not in the inbox at all raises 50120 and changes nothing: the caller would otherwise
-- report success for messages nobody processed. The rows are locked in id order, so two runs
-- consuming overlapping events wait for each other instead of deadlocking, and the second one
-- skips what the first committed.
CREATE OR REPLACE FUNCTION airflow_consume(p_consumers text[], p_inbox_ids bigint[])
RETURNS SETOF bigint LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_missing text;
    v_ids bigint[];
    v_consumers text[];
BEGIN
    PERFORM require_inbox_consumers(p_consumers);
    PERFORM 1
       FROM airflow_inbox i
       JOIN unnest(p_consumers, p_inbox_ids) w(consumer, inbox_id)
         ON i.consumer = w.consumer AND i.inbox_id = w.inbox_id
      ORDER BY i.inbox_id
        FOR UPDATE OF i;
    SELECT string_agg(format('%s (consumer %s)', w.inbox_id, w.consumer), ', '
                      ORDER BY w.inbox_id)
      INTO v_missing
      FROM unnest(p_consumers, p_inbox_ids) w(consumer, inbox_id)
     WHERE NOT EXISTS (SELECT 1 FROM airflow_inbox i
                        WHERE i.consumer = w.consumer AND i.inbox_id = w.inbox_id);
    IF v_missing IS NOT NULL THEN
        PERFORM raise_error(50120, v_missing);
    END IF;
    WITH consumed AS (
        UPDATE airflow_inbox i
           SET state = 'consumed', consumed_at = utc_now(), message_body = NULL
          FROM unnest(p_consumers, p_inbox_ids) w(consumer, inbox_id)
         WHERE i.consumer = w.consumer AND i.inbox_id = w.inbox_id
           AND i.state IN ('claimed', 'delivered')
        RETURNING i.inbox_id, i.consumer)
    SELECT coalesce(array_agg(inbox_id ORDER BY inbox_id), '{}'),
           coalesce(array_agg(DISTINCT consumer), '{}')
      INTO v_ids, v_consumers
      FROM consumed;
    -- Watchers with one_run_per_message wait for this before releasing the next message.
    PERFORM pg_notify(current_schema() || '_airflow_inbox', left(c, 7000))
       FROM unnest(v_consumers) c;
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

-- Consumed rows are kept for a week, longer than any retry or duplicate event of the run that
-- consumed them is expected to come; then the broker worker deletes them.
CREATE OR REPLACE FUNCTION purge_consumed_inbox(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM airflow_inbox
     WHERE inbox_id IN (SELECT inbox_id FROM airflow_inbox
                         WHERE state = 'consumed' AND consumed_at < utc_now() - interval '7 days'
                         ORDER BY consumed_at
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

CREATE OR REPLACE FUNCTION airflow_ack(p_consumer text, p_inbox_ids bigint[] DEFAULT NULL)
RETURNS integer LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT airflow_settle(p_consumer, p_inbox_ids, 'acked');
$$;

-- What the inbox holds, per consumer and state: what the maintenance DAG reports. Consumed
-- rows are done with and are left out.
CREATE OR REPLACE VIEW airflow_inbox_summary AS
SELECT consumer, queue_name, state, dag_id, run_id, count(*) AS messages,
       min(claimed_at) AS oldest_claimed_at
  FROM airflow_inbox
 WHERE state <> 'consumed'
 GROUP BY consumer, queue_name, state, dag_id, run_id;

-- Poison-message detection (spec 18): five consecutive rolled-back transactions that received
-- from a queue disable it and raise BROKER_QUEUE_DISABLED.
--
-- The receiving transaction cannot count its own rollback. Its client registers it through
-- register_receive() on a separate connection as soon as RECEIVE returns; resolve_receives()
-- then reads each registered transaction's fate from pg_xact_status(). It runs in transactions
-- of its own: right after a client rolls back, and in every pass of the broker worker (which
-- also catches readers that were killed, whose transactions PostgreSQL aborts).

CREATE OR REPLACE FUNCTION register_receive(p_queue_id integer, p_xid xid8, p_message_ids uuid[],
                                            p_backend_pid integer)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
BEGIN
    -- One registration of a queue at a time, so receive_id numbers them in the order they
    -- become visible and the resolver never meets an earlier one after a later one. (The
    -- side connection runs in autocommit: the lock lasts this statement.)
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.register'), p_queue_id);
    -- Only a reader of the queue records receives of it: a forged record could disable it.
    -- The check is part of the INSERT (its common case costs no statement of its own); when
    -- it fails, require_on_queue() raises.
    -- A transaction that received twice, or whose record was sent again after its connection
    -- was lost before the answer came, has more than one row: resolve_receives() counts it
    -- once.
    -- explain register_receive: p_queue_id integer, p_xid xid8, p_message_ids uuid[],
    --   p_backend_pid integer
    INSERT INTO receive_log (queue_id, xid, message_ids, backend_pid, received_at)
    SELECT q.object_id, p_xid, p_message_ids, p_backend_pid, utc_now()
      FROM queues q
     WHERE q.object_id = p_queue_id
       AND (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint, q.object_id,
                                   q.principal_id));
    IF NOT FOUND THEN
        PERFORM require_visible_queue('RECEIVE', p_queue_id, 15151, 'queue',
                                      coalesce(p_queue_id::text, 'NULL'));
    END IF;
END
$$;

-- Resolves the finished receiving transactions of one queue (or of all) in the order their
-- RECEIVEs returned, and stops at the first one still running, so "consecutive" means
-- consecutive in that order whenever and however often it runs. (In the order transactions
-- began, a transaction that took its xid early, with a group lock, and received late was
-- resolved before or after the rollbacks around it depending on whether a pass ran between
-- them: the same events disabled the queue or not.) Returns the number of queues it disabled.
-- A login other than the schema's owner resolves the queues it may RECEIVE from only: of any
-- other it learns nothing, as of a queue that does not exist.
CREATE OR REPLACE FUNCTION resolve_receives(p_queue_id integer DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q record;
    r record;
    v_status text;
    v_streak integer;
    v_streak_messages uuid[];
    v_disabled integer := 0;
    v_now timestamp := utc_now();
    v_owner boolean := is_broker_owner();
BEGIN
    FOR q IN
        SELECT object_id, principal_id FROM queues
         WHERE (p_queue_id IS NULL OR object_id = p_queue_id)
           AND EXISTS (SELECT 1 FROM receive_log l WHERE l.queue_id = queues.object_id)
         ORDER BY object_id
    LOOP
        CONTINUE WHEN NOT v_owner
                      AND NOT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id);
        -- One resolver per queue at a time; others skip it rather than wait.
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext(current_schema() || '.poison'),
                                                    q.object_id);
        SELECT consecutive_rollbacks INTO v_streak FROM queues WHERE object_id = q.object_id;
        v_streak_messages := '{}';
        -- Each transaction once, in the order of its first row, with the messages of all.
        FOR r IN
            SELECT l.xid, array_agg(DISTINCT l.receive_id) AS receive_ids,
                   coalesce(array_agg(DISTINCT m) FILTER (WHERE m IS NOT NULL), '{}')
                       AS message_ids
              FROM receive_log l
              LEFT JOIN LATERAL unnest(l.message_ids) m ON true
             WHERE l.queue_id = q.object_id
             GROUP BY l.xid
             ORDER BY min(l.receive_id)
        LOOP
            v_status := pg_xact_status(r.xid);
            EXIT WHEN v_status = 'in progress';
            IF v_status = 'committed' THEN
                v_streak := 0;
                v_streak_messages := '{}';
                DELETE FROM message_attempts WHERE message_id = ANY (r.message_ids);
            ELSIF v_status = 'aborted' THEN
                v_streak := v_streak + 1;
                v_streak_messages := v_streak_messages || r.message_ids;
                INSERT INTO message_attempts (message_id, queue_id, attempts, last_failed_at)
                SELECT m, q.object_id, 1, v_now FROM unnest(r.message_ids) m
                ON CONFLICT (message_id) DO UPDATE
                   SET attempts = message_attempts.attempts + 1,
                       last_failed_at = EXCLUDED.last_failed_at;
                IF poison_disable(q.object_id, v_streak, v_streak_messages) THEN
                    v_disabled := v_disabled + 1;
                    v_streak := 0;
                    v_streak_messages := '{}';
                END IF;
            END IF;
            -- (NULL: too old to know; it neither counts nor resets.)
            -- The rows this pass read, not one written since: the next pass has that one.
            DELETE FROM receive_log WHERE receive_id = ANY (r.receive_ids);
        END LOOP;
        UPDATE queues SET consecutive_rollbacks = v_streak WHERE object_id = q.object_id;
    END LOOP;
    RETURN v_disabled;
END
$$;

-- Disables the queue when the streak reached its threshold and poison detection is on.
CREATE OR REPLACE FUNCTION poison_disable(p_queue_id integer, p_streak integer,
                                          p_messages uuid[])
RETURNS boolean LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_now timestamp := utc_now();
BEGIN
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id FOR UPDATE;
    IF NOT q.is_poison_message_handling_enabled OR p_streak < q.poison_threshold
       OR NOT q.is_receive_enabled THEN
        RETURN false;
    END IF;
    UPDATE queues SET is_receive_enabled = false, is_enqueue_enabled = false,
                      disabled_reason = 'POISON', disabled_at = v_now
     WHERE object_id = p_queue_id;
    INSERT INTO queue_disable_events (queue_id, disabled_at, reason, message_ids)
    VALUES (p_queue_id, v_now,
            format('%s consecutive transactions that received from the queue rolled back',
                   p_streak),
            ARRAY(SELECT DISTINCT unnest(p_messages)));
    PERFORM wake_waiters(p_queue_id);
    PERFORM fire_event(p_queue_id, 'BROKER_QUEUE_DISABLED');
    RETURN true;
END
$$;

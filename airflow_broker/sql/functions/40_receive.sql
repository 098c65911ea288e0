-- RECEIVE and GET CONVERSATION GROUP (spec 8-10). A conversation group is locked by a row lock
-- on its dialog_groups row, FOR NO KEY UPDATE, held until the transaction ends. Without a
-- WHERE clause, groups locked by other transactions are skipped (SKIP LOCKED); with one, the
-- statement waits for the lock. WAITFOR is the Python API's loop around these functions.

-- The queue a RECEIVE or GET CONVERSATION GROUP reads, checked for existence and availability.
CREATE OR REPLACE FUNCTION receivable_queue(p_queue text) RETURNS queues
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
BEGIN
    PERFORM check_isolation();
    q := find_queue(p_queue);
    IF q.object_id IS NULL THEN
        PERFORM raise_error(208, coalesce(p_queue, 'NULL'));
    END IF;
    -- RECEIVE on the queue, checked here rather than through require_on_queue(): a nested
    -- call fewer on every RECEIVE.
    IF NOT role_has_permission(session_user, 'RECEIVE', 1::smallint, q.object_id,
                               q.principal_id) THEN
        PERFORM raise_error(229, 'RECEIVE', q.name, current_database(), q.schema_name);
    END IF;
    IF NOT q.is_receive_enabled THEN
        PERFORM raise_error(9617, q.name);
    END IF;
    RETURN q;
END
$$;

-- Locks the next group of the queue that has ready messages and is not locked by another
-- transaction; the oldest ready message of the highest priority decides. NULL when none.
-- Ready messages are read in order from queue_messages_ready, never through a bitmap and a
-- sort (see take_messages).
CREATE OR REPLACE FUNCTION lock_next_group(p_queue_id integer) RETURNS uuid
LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_bitmapscan = off SET enable_sort = off AS $$
DECLARE
    v_group uuid;
    v_locked uuid[] := '{}';
BEGIN
    -- Usually a group among the first few messages is free: one statement.
    -- explain receive_lock_group: p_queue_id integer
    SELECT g.conversation_group_id INTO v_group
      FROM (SELECT m.conversation_group_id, m.priority, m.queuing_order
              FROM queue_messages m
             WHERE m.queue_id = p_queue_id AND m.status = 1
             ORDER BY m.priority DESC, m.queuing_order
             LIMIT 16) m
      JOIN dialog_groups g ON g.conversation_group_id = m.conversation_group_id
     ORDER BY m.priority DESC, m.queuing_order
     LIMIT 1
       FOR NO KEY UPDATE OF g SKIP LOCKED;
    IF FOUND THEN
        RETURN v_group;
    END IF;
    -- Otherwise a group found locked is passed over by a filter on the next search, not by
    -- trying its lock again on each of its messages: behind 200,000 messages of a conversation
    -- another reader held, a RECEIVE took 200 ms that way and takes 30-60 ms this way. (It
    -- still reads past the held messages: ready messages are kept in arrival order.)
    LOOP
        SELECT m.conversation_group_id INTO v_group
          FROM queue_messages m
         WHERE m.queue_id = p_queue_id AND m.status = 1
           AND m.conversation_group_id <> ALL (v_locked)
         ORDER BY m.priority DESC, m.queuing_order
         LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        PERFORM 1 FROM dialog_groups WHERE conversation_group_id = v_group
           FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            RETURN v_group;
        END IF;
        v_locked := v_locked || v_group;
    END LOOP;
END
$$;

-- Takes up to p_limit ready messages of one locked group (and one conversation when given):
-- conversations one after another, each with DialogTimer first, then Error, then in sequence.
-- attempts is how often the message came back after a rolled-back RECEIVE.
-- Plans, whatever the statistics say:
-- * Generic: the custom plan of this query is not cheaper than the generic one, yet the
--   planner's estimates would have PostgreSQL plan it anew on every call.
-- * The messages come first to last from queue_messages_group: no bitmap scans, and no sorts
--   where an index gives the order (the result's own ORDER BY still sorts the rows taken). A
--   queue analyzed while empty (no pages left) had the cached plan read the whole group, or
--   the whole queue, and sort it on every call: 30-50 ms for TOP(100) behind 100,000
--   messages.
-- * The taken rows are named by an array of keys: a generic plan estimates LIMIT $n at a tenth
--   of the rows, and joined to the picked rows, a table of 200,000 messages in another queue
--   had every RECEIVE hash-join the whole primary key (32 ms for a RECEIVE TOP(100), 3.5 ms
--   after).
CREATE OR REPLACE FUNCTION take_messages(p_queue queues, p_group uuid, p_handle uuid,
                                         p_limit bigint)
RETURNS SETOF received_message LANGUAGE plpgsql SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan SET enable_bitmapscan = off SET enable_sort = off
AS $$
BEGIN
    IF p_queue.is_retention_enabled THEN
        RETURN QUERY
        WITH picked AS (
            SELECT m.queuing_order FROM queue_messages m
             WHERE m.conversation_group_id = p_group AND m.queue_id = p_queue.object_id
               AND (p_handle IS NULL OR m.conversation_handle = p_handle) AND m.status = 1
             ORDER BY m.conversation_handle, m.precedence, m.message_sequence_number
             LIMIT p_limit),
        taken AS (
            UPDATE queue_messages m SET status = 0
             WHERE m.queuing_order = ANY (ARRAY(SELECT queuing_order FROM picked))
            RETURNING m.*)
        SELECT 1::smallint, t.priority, t.queuing_order, t.conversation_group_id,
               t.conversation_handle, t.message_sequence_number, s.name, t.service_id,
               c.name, t.service_contract_id, mt.name, t.message_type_id,
               CASE mt.validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E' ELSE 'X' END,
               t.message_body, t.message_id, coalesce(a.attempts, 0)
          FROM taken t
          JOIN service_defs s ON s.service_id = t.service_id
          JOIN contracts c ON c.service_contract_id = t.service_contract_id
          JOIN message_types mt ON mt.message_type_id = t.message_type_id
          LEFT JOIN message_attempts a ON a.message_id = t.message_id
         ORDER BY t.conversation_handle, t.precedence, t.message_sequence_number;
    ELSE
        -- explain receive_take: p_group uuid, p_queue.object_id integer, p_handle uuid,
        --   p_limit bigint
        RETURN QUERY
        WITH picked AS (
            SELECT m.queuing_order FROM queue_messages m
             WHERE m.conversation_group_id = p_group AND m.queue_id = p_queue.object_id
               AND (p_handle IS NULL OR m.conversation_handle = p_handle) AND m.status = 1
             ORDER BY m.conversation_handle, m.precedence, m.message_sequence_number
             LIMIT p_limit),
        taken AS (
            DELETE FROM queue_messages m
             WHERE m.queuing_order = ANY (ARRAY(SELECT queuing_order FROM picked))
            RETURNING m.*)
        SELECT 1::smallint, t.priority, t.queuing_order, t.conversation_group_id,
               t.conversation_handle, t.message_sequence_number, s.name, t.service_id,
               c.name, t.service_contract_id, mt.name, t.message_type_id,
               CASE mt.validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E' ELSE 'X' END,
               t.message_body, t.message_id, coalesce(a.attempts, 0)
          FROM taken t
          JOIN service_defs s ON s.service_id = t.service_id
          JOIN contracts c ON c.service_contract_id = t.service_contract_id
          JOIN message_types mt ON mt.message_type_id = t.message_type_id
          LEFT JOIN message_attempts a ON a.message_id = t.message_id
         ORDER BY t.conversation_handle, t.precedence, t.message_sequence_number;
    END IF;
END
$$;

-- RECEIVE, each row with what the client's poison detection records on its side connection:
-- the queue's id, and whether its receiving transactions are counted. The queue RECEIVE has
-- just checked is the one named, so no second lookup (and no second permission check) is
-- needed for it.
--
-- The common RECEIVE is its first statement: no WHERE clause, TOP of 1 or more (or none), on
-- a queue its one name finds, that the caller may read, enabled, without retention, in READ
-- COMMITTED. It checks and counts the RECEIVE, locks the first free group among the queue's
-- first ready messages, as lock_next_group() does first, and takes its messages, as
-- take_messages() does. Nothing when any of that does not hold, or the group's messages were
-- taken meanwhile: then the general way below raises the errors and counts the RECEIVE itself
-- (the statement counts only a RECEIVE that took something).
-- The group is locked after the statement's snapshot was taken, so the DELETE checks again
-- that each message is still ready and in that group: a message taken by the group's previous
-- holder is gone, and one moved to another group (MOVE CONVERSATION) is not taken.
-- One statement rather than the general way's eight, each a round through the executor:
-- about 70 us less of the main backend's CPU a RECEIVE+commit; in this function rather than
-- one of its own, whose rows RETURN QUERY copied once more: 20 us less (docs/performance.md).
-- The planner settings are that statement's (the general way's statements are key lookups,
-- and the functions it calls set their own).
CREATE OR REPLACE FUNCTION receive_with_queue(
    p_queue text,
    p_top bigint DEFAULT NULL,
    p_conversation_handle uuid DEFAULT NULL,
    p_conversation_group_id uuid DEFAULT NULL)
RETURNS TABLE (message received_message, queue_object_id integer,
               queue_poison_handling boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_bitmapscan = off SET enable_sort = off AS $$
DECLARE
    q queues;
    v_limit bigint := coalesce(p_top, 9223372036854775807);
    v_group uuid;
    v_rows bigint;
BEGIN
    IF p_conversation_handle IS NULL AND p_conversation_group_id IS NULL AND v_limit > 0 THEN
        -- explain receive_ready: p_queue text, v_limit bigint
        RETURN QUERY
        WITH rq AS (
            SELECT rq.object_id, rq.is_poison_message_handling_enabled, rq.receive_counter
              FROM queues rq
             WHERE rq.name = p_queue AND rq.is_receive_enabled AND NOT rq.is_retention_enabled
               AND NOT EXISTS (SELECT 1 FROM queues q2
                                WHERE q2.name = p_queue AND q2.object_id <> rq.object_id)
               AND current_setting('transaction_isolation') IN ('read committed',
                                                                'read uncommitted')
               AND (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint, rq.object_id,
                                           rq.principal_id))
        ), locked AS (
            SELECT g.conversation_group_id
              FROM (SELECT m.conversation_group_id, m.priority, m.queuing_order
                      FROM queue_messages m
                     WHERE m.queue_id = (SELECT object_id FROM rq) AND m.status = 1
                     ORDER BY m.priority DESC, m.queuing_order
                     LIMIT 16) m
              JOIN dialog_groups g ON g.conversation_group_id = m.conversation_group_id
             ORDER BY m.priority DESC, m.queuing_order
             LIMIT 1
               FOR NO KEY UPDATE OF g SKIP LOCKED
        ), picked AS (
            SELECT m.queuing_order FROM queue_messages m
             WHERE m.conversation_group_id = (SELECT conversation_group_id FROM locked)
               AND m.queue_id = (SELECT object_id FROM rq) AND m.status = 1
             ORDER BY m.conversation_handle, m.precedence, m.message_sequence_number
             LIMIT v_limit
        ), taken AS (
            -- The check again, as one condition that no index can serve: on its own terms the
            -- planner read a group through the index of ready messages (50,000 entries for
            -- TOP(10) after an ANALYZE while the queue was empty) instead of the keys picked.
            DELETE FROM queue_messages m
             WHERE m.queuing_order = ANY (ARRAY(SELECT queuing_order FROM picked))
               AND (m.conversation_group_id = (SELECT conversation_group_id FROM locked)
                    AND m.status = 1) IS TRUE
            RETURNING m.*
        ), counted AS (
            SELECT nextval(rq.receive_counter) FROM rq WHERE EXISTS (SELECT 1 FROM taken)
        )
        SELECT ROW(1::smallint, t.priority, t.queuing_order, t.conversation_group_id,
                   t.conversation_handle, t.message_sequence_number, s.name, t.service_id,
                   c.name, t.service_contract_id, mt.name, t.message_type_id,
                   CASE mt.validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E' ELSE 'X' END,
                   t.message_body, t.message_id, coalesce(a.attempts, 0))::received_message,
               rq.object_id, rq.is_poison_message_handling_enabled
          FROM taken t
         CROSS JOIN rq
         CROSS JOIN counted
          JOIN service_defs s ON s.service_id = t.service_id
          JOIN contracts c ON c.service_contract_id = t.service_contract_id
          JOIN message_types mt ON mt.message_type_id = t.message_type_id
          LEFT JOIN message_attempts a ON a.message_id = t.message_id
         ORDER BY t.conversation_handle, t.precedence, t.message_sequence_number;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    q := receivable_queue(p_queue);
    IF v_limit < 0 THEN
        PERFORM raise_error(50106, p_top::text, 'TOP', 'a number of rows of 0 or more');
    END IF;
    IF p_conversation_handle IS NOT NULL AND p_conversation_group_id IS NOT NULL THEN
        PERFORM raise_error(102, 'AND');
    END IF;

    IF p_conversation_handle IS NOT NULL THEN
        SELECT ce.conversation_group_id INTO v_group
          FROM endpoints ce JOIN service_defs s ON s.service_id = ce.service_id
         WHERE ce.conversation_handle = p_conversation_handle
           AND s.service_queue_id = q.object_id;
        IF v_group IS NULL THEN
            PERFORM raise_error(8426, p_conversation_handle::text);
        END IF;
        PERFORM 1 FROM dialog_groups WHERE conversation_group_id = v_group
           FOR NO KEY UPDATE;
        PERFORM nextval(q.receive_counter);
        RETURN QUERY SELECT t, q.object_id, q.is_poison_message_handling_enabled
          FROM take_messages(q, v_group, p_conversation_handle, v_limit) t;
        RETURN;
    END IF;

    IF p_conversation_group_id IS NOT NULL THEN
        SELECT g.conversation_group_id INTO v_group
          FROM dialog_groups g JOIN service_defs s ON s.service_id = g.service_id
         WHERE g.conversation_group_id = p_conversation_group_id
           AND s.service_queue_id = q.object_id
           FOR NO KEY UPDATE OF g;
        IF v_group IS NULL THEN
            PERFORM raise_error(8436, p_conversation_group_id::text);
        END IF;
        PERFORM nextval(q.receive_counter);
        RETURN QUERY SELECT t, q.object_id, q.is_poison_message_handling_enabled
          FROM take_messages(q, v_group, NULL, v_limit) t;
        RETURN;
    END IF;

    -- The queue monitor learns from these two counters that RECEIVEs happen, and when they
    -- come back empty (sequences are not transactional, so no reader waits for another).
    PERFORM nextval(q.receive_counter);
    -- A group chosen from an older snapshot may have been emptied by the reader that held it
    -- just before; then the next group is tried.
    FOR attempt IN 1 .. 16 LOOP
        v_group := lock_next_group(q.object_id);
        EXIT WHEN v_group IS NULL;
        RETURN QUERY SELECT t, q.object_id, q.is_poison_message_handling_enabled
          FROM take_messages(q, v_group, NULL, v_limit) t;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows > 0 OR v_limit = 0 THEN
            RETURN;
        END IF;
    END LOOP;
    PERFORM nextval(q.empty_receive_counter);
END
$$;

-- Before receive_with_queue() held the common RECEIVE, a function of its own did.
DROP FUNCTION IF EXISTS receive_ready(text, bigint);

-- RECEIVE [TOP (p_top)] * FROM p_queue [WHERE conversation_handle = ... |
-- conversation_group_id = ...].
CREATE OR REPLACE FUNCTION receive(
    p_queue text,
    p_top bigint DEFAULT NULL,
    p_conversation_handle uuid DEFAULT NULL,
    p_conversation_group_id uuid DEFAULT NULL)
RETURNS SETOF received_message LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT (r.message).*
      FROM receive_with_queue(p_queue, p_top, p_conversation_handle, p_conversation_group_id) r
$$;

CREATE OR REPLACE FUNCTION get_conversation_group(p_queue text) RETURNS uuid
LANGUAGE plpgsql SET search_path FROM CURRENT
SET enable_seqscan = off AS $$
DECLARE
    q queues := receivable_queue(p_queue);
    v_group uuid;
BEGIN
    PERFORM nextval(q.receive_counter);
    v_group := lock_next_group(q.object_id);
    IF v_group IS NULL THEN
        PERFORM nextval(q.empty_receive_counter);
    END IF;
    RETURN v_group;
END
$$;

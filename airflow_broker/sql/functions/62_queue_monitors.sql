-- Queue monitors and activation (spec 20). The monitor's state machine lives here; starting a
-- reader process is the broker worker's part (internal activation), sending QUEUE_ACTIVATION
-- is this file's (event-based activation).

-- Seconds an event-based monitor waits in NOTIFIED for a RECEIVE before notifying again.
CREATE OR REPLACE FUNCTION notification_timeout() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT interval '60 seconds' $$;

-- The role an activated reader of the queue logs in as: its EXECUTE AS role; for SELF and
-- OWNER, the queue's owner; NULL (the broker worker's own login) for CALLER, for none, and for
-- SELF and OWNER of a queue the schema's owner owns, whose rights the worker's login has.
CREATE OR REPLACE FUNCTION reader_role(p_queue queues) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_queue.execute_as IS NULL OR upper(p_queue.execute_as) = 'CALLER'
                THEN NULL
                WHEN upper(p_queue.execute_as) IN ('SELF', 'OWNER')
                THEN pg_get_userbyid(p_queue.principal_id)::text
                ELSE p_queue.execute_as END
$$;

-- Queues that have a monitor: activation on with a procedure and readers allowed, or a
-- QUEUE_ACTIVATION event notification; and the queue enabled.
CREATE OR REPLACE VIEW monitored_queues AS
SELECT q.object_id AS queue_id, q.name, q.schema_name,
       (q.is_activation_enabled AND q.activation_procedure IS NOT NULL AND q.max_readers > 0)
           AS internal_activation,
       EXISTS (SELECT 1 FROM event_subscriptions n
                WHERE n.queue_id = q.object_id AND 'QUEUE_ACTIVATION' = ANY (n.event_types))
           AS event_activation,
       q.activation_procedure, q.max_readers, reader_role(q) AS execute_as
  FROM queues q
 WHERE q.is_receive_enabled
   AND q.is_enqueue_enabled
   -- Activation's preconditions as SQL Server's queue-monitor troubleshooting lists them: the
   -- queue receives and enqueues, activation is configured, and the broker is enabled.
   AND (SELECT i.is_broker_enabled FROM broker_identity i)
   AND ((q.is_activation_enabled AND q.activation_procedure IS NOT NULL AND q.max_readers > 0)
        OR EXISTS (SELECT 1 FROM event_subscriptions n
                    WHERE n.queue_id = q.object_id
                      AND 'QUEUE_ACTIVATION' = ANY (n.event_types)));

-- One evaluation of a queue's monitor. p_running is the number of activated readers running
-- now. Returns how many readers internal activation should start; for event-based activation
-- it sends the QUEUE_ACTIVATION notifications itself and returns 0.
CREATE OR REPLACE FUNCTION monitor_step(p_queue_id integer, p_running integer)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    mq monitored_queues;
    m queue_monitor_state;
    v_now timestamp := utc_now();
    v_receives bigint;
    v_empties bigint;
    v_received boolean;
    v_came_back_empty boolean;
    v_ready boolean;
    v_waiting boolean;
    v_cap integer;
    v_state text;
    v_launch integer := 0;
BEGIN
    SELECT * INTO mq FROM monitored_queues WHERE queue_id = p_queue_id;
    IF NOT FOUND THEN
        DELETE FROM queue_monitor_state WHERE queue_id = p_queue_id;
        RETURN 0;
    END IF;
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id;
    INSERT INTO queue_monitor_state (queue_id, state_since) VALUES (p_queue_id, v_now)
    ON CONFLICT (queue_id) DO NOTHING;
    SELECT * INTO m FROM queue_monitor_state WHERE queue_id = p_queue_id FOR UPDATE;

    v_receives := coalesce(pg_sequence_last_value(q.receive_counter), 0);
    v_empties := coalesce(pg_sequence_last_value(q.empty_receive_counter), 0);
    v_received := v_receives > m.receives_seen;
    v_came_back_empty := v_empties > m.empty_receives_seen;
    v_ready := EXISTS (SELECT 1 FROM queue_messages WHERE queue_id = p_queue_id AND status = 1);
    v_waiting := EXISTS (SELECT 1 FROM queue_waiters w
                          WHERE w.queue_id = p_queue_id
                            AND w.backend_pid IN (SELECT pid FROM pg_stat_activity));
    v_cap := CASE WHEN mq.internal_activation THEN q.max_readers ELSE 2147483647 END;
    IF v_came_back_empty THEN
        -- An empty RECEIVE resets the ramp-up timer (spec 20.3).
        m.last_empty_rowset_time := v_now;
        m.ramp_started_at := v_now;
    END IF;
    v_state := m.state;

    IF m.state = 'INACTIVE' THEN
        IF v_ready AND p_running < v_cap THEN
            v_launch := greatest(1, least(v_cap, q.activation_min_readers) - p_running);
            v_state := 'NOTIFIED';
        END IF;
    ELSIF m.state = 'NOTIFIED' THEN
        -- Only a RECEIVE moves the monitor on: a reader that never receives leaves it here
        -- and nothing is started again (the stub-procedure trap, spec 20.4).
        IF v_received AND NOT v_ready AND v_came_back_empty THEN
            v_state := 'INACTIVE';
        ELSIF v_received THEN
            v_state := 'RECEIVES_OCCURRING';
            m.ramp_started_at := v_now;
        ELSIF mq.event_activation AND NOT mq.internal_activation AND v_ready
              AND v_now - m.state_since >= notification_timeout() THEN
            v_launch := 1;
        END IF;
    ELSIF NOT v_ready THEN
        IF v_came_back_empty THEN
            v_state := 'INACTIVE';
        ELSIF p_running = 0 THEN
            IF mq.internal_activation THEN
                -- The queue is empty only when a RECEIVE says so: the procedure is started
                -- once more and finds it empty (spec T-AC-01).
                v_launch := 1;
                v_state := 'NOTIFIED';
            ELSE
                v_state := 'INACTIVE';
            END IF;
        END IF;
    ELSE
        IF mq.internal_activation AND p_running = 0 THEN
            -- Readers exited while messages remain: the monitor starts one again.
            v_launch := 1;
            v_state := 'NOTIFIED';
        ELSIF p_running < v_cap THEN
            IF v_waiting THEN
                -- Someone is already waiting in RECEIVE: no reader is missing.
                m.ramp_started_at := v_now;
            ELSIF v_now - coalesce(m.ramp_started_at, v_now) >= q.activation_ramp_interval THEN
                v_launch := 1;
            END IF;
        END IF;
        IF mq.internal_activation AND p_running + v_launch < least(v_cap, q.activation_min_readers)
        THEN
            v_launch := least(v_cap, q.activation_min_readers) - p_running;
        END IF;
    END IF;

    v_launch := least(v_launch, greatest(v_cap - p_running, 0));
    IF v_launch > 0 THEN
        m.last_activated_time := v_now;
        m.ramp_started_at := v_now;
    END IF;
    UPDATE queue_monitor_state
       SET state = v_state,
           state_since = CASE WHEN v_state <> m.state OR v_launch > 0 THEN v_now
                              ELSE m.state_since END,
           last_activated_time = m.last_activated_time,
           last_empty_rowset_time = m.last_empty_rowset_time,
           ramp_started_at = m.ramp_started_at,
           receives_seen = v_receives,
           empty_receives_seen = v_empties
     WHERE queue_id = p_queue_id;
    IF v_launch > 0 AND NOT mq.internal_activation THEN
        PERFORM fire_event(p_queue_id, 'QUEUE_ACTIVATION');
        RETURN 0;
    END IF;
    RETURN v_launch;
END
$$;

-- Activated readers: the worker records each start and each end it observes; a reader
-- process records its own end (with what it received) when it exits normally.
CREATE OR REPLACE FUNCTION activation_started(p_task_id uuid, p_queue_id integer, p_pid integer)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_now timestamp := utc_now();
BEGIN
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id;
    INSERT INTO activated_tasks (task_id, queue_id, pid, procedure, execute_as, started_at)
    VALUES (p_task_id, p_queue_id, p_pid, q.activation_procedure, q.execute_as, v_now);
    INSERT INTO activation_log (task_id, queue_id, queue_name, procedure, execute_as, pid,
                                started_at)
    VALUES (p_task_id, p_queue_id, q.name, q.activation_procedure, q.execute_as, p_pid, v_now);
END
$$;

CREATE OR REPLACE FUNCTION activation_ended(p_task_id uuid, p_outcome text,
                                            p_messages_received bigint, p_rollbacks bigint,
                                            p_exception text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- An activated reader reports its own end, as its EXECUTE AS role: a reader of the queue.
    PERFORM require_visible_queue('RECEIVE', l.queue_id, 15151, 'activation task',
                                  p_task_id::text)
       FROM activation_log l WHERE l.task_id = p_task_id;
    DELETE FROM activated_tasks WHERE task_id = p_task_id;
    -- The first report wins: the reader's own, when it had the chance to make one.
    UPDATE activation_log
       SET ended_at = utc_now(), outcome = p_outcome,
           messages_received = p_messages_received, rollbacks = p_rollbacks,
           exception = p_exception
     WHERE task_id = p_task_id AND ended_at IS NULL;
END
$$;

-- sys.dm_broker_queue_monitors, with the queue's name and the time in the current state.
CREATE OR REPLACE VIEW dm_broker_queue_monitors AS
SELECT (SELECT oid FROM pg_database WHERE datname = current_database()) AS database_id,
       q.object_id AS queue_id, q.name AS queue_name, q.schema_name,
       coalesce(m.state, 'INACTIVE') AS state, m.state_since,
       m.last_empty_rowset_time, m.last_activated_time,
       (SELECT count(*) FROM queue_waiters w
         WHERE w.queue_id = q.object_id
           AND w.backend_pid IN (SELECT pid FROM pg_stat_activity)) AS tasks_waiting,
       (SELECT count(*) FROM activated_tasks t WHERE t.queue_id = q.object_id)
           AS activated_readers,
       mq.internal_activation, mq.event_activation
  FROM monitored_queues mq
  JOIN queues q ON q.object_id = mq.queue_id
  LEFT JOIN queue_monitor_state m ON m.queue_id = q.object_id;

-- sys.dm_broker_activated_tasks.
CREATE OR REPLACE VIEW dm_broker_activated_tasks AS
SELECT t.pid AS spid,
       (SELECT oid FROM pg_database WHERE datname = current_database()) AS database_id,
       t.queue_id, q.name AS queue_name, t.procedure AS procedure_name, t.execute_as,
       t.task_id, t.started_at
  FROM activated_tasks t JOIN queues q ON q.object_id = t.queue_id;

-- Monitors stuck in NOTIFIED: a reader was started (or a notification sent) a minute ago or
-- more, messages are waiting, and nothing has received since. The fix: turn activation off
-- and on again (ALTER QUEUE ... ACTIVATION (STATUS = OFF), then ON), after fixing the reader.
CREATE OR REPLACE VIEW stuck_queue_monitors AS
SELECT m.queue_id, m.queue_name, m.schema_name, m.state_since,
       (SELECT utc_now()) - m.state_since AS stuck_for, m.last_activated_time
  FROM dm_broker_queue_monitors m
 WHERE m.state = 'NOTIFIED' AND m.state_since < (SELECT utc_now()) - interval '60 seconds'
   AND EXISTS (SELECT 1 FROM queue_messages x WHERE x.queue_id = m.queue_id AND x.status = 1);

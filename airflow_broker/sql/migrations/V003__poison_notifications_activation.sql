-- Poison-message detection, event notifications, queue monitors and activation.

-- Poison detection counts rolled-back receiving transactions, but PostgreSQL has no autonomous
-- transactions: a counter written by the receiving transaction disappears with its rollback.
-- So the receiver's client records (queue, transaction id, messages) on a connection of its
-- own as soon as RECEIVE returns, and the outcome is resolved later from pg_xact_status(): a
-- commit resets the queue's count, an abort (including a reader killed mid-transaction)
-- increments it, in transaction-id order.
CREATE TABLE receive_log (
    receive_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id    integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    xid         xid8 NOT NULL,
    message_ids uuid[] NOT NULL,
    backend_pid integer,
    received_at timestamp NOT NULL,
    UNIQUE (queue_id, xid)
);

ALTER TABLE queues ADD COLUMN consecutive_rollbacks integer NOT NULL DEFAULT 0;
ALTER TABLE queues ADD COLUMN poison_threshold integer NOT NULL DEFAULT 5
    CHECK (poison_threshold > 0);

-- How often each message has come back after a rolled-back RECEIVE.
CREATE TABLE message_attempts (
    message_id     uuid PRIMARY KEY,
    queue_id       integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    attempts       integer NOT NULL,
    last_failed_at timestamp NOT NULL
);

-- Why and when poison detection disabled a queue.
CREATE TABLE queue_disable_events (
    event_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id    integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    disabled_at timestamp NOT NULL,
    reason      text NOT NULL,
    message_ids uuid[] NOT NULL
);

CREATE TABLE event_subscriptions (
    object_id           serial PRIMARY KEY,
    name                text NOT NULL,
    queue_id            integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    event_types         text[] NOT NULL,
    service_name        text NOT NULL,
    broker_instance     text NOT NULL,
    -- The notification's own dialog, begun on the first event and kept open.
    conversation_handle uuid,
    created_at          timestamp NOT NULL,
    UNIQUE (queue_id, name)
);
SELECT setval(pg_get_serial_sequence('event_subscriptions', 'object_id'), 65535);
-- EventSequence of the BROKER_QUEUE_DISABLED document.
CREATE SEQUENCE event_sequence;

-- Queue monitors. RECEIVE must not write a shared row (readers would queue up behind each
-- other's locks), so it counts on two sequences per queue, which are not transactional; the
-- worker compares them between passes to see RECEIVEs happen and RECEIVEs come back empty.
ALTER TABLE queues ADD COLUMN receive_counter regclass;
ALTER TABLE queues ADD COLUMN empty_receive_counter regclass;
-- Beyond SQL Server: the ramp-up interval (SQL Server: 5 s, fixed) and a floor of readers.
ALTER TABLE queues ADD COLUMN activation_ramp_interval interval NOT NULL DEFAULT '5 seconds';
ALTER TABLE queues ADD COLUMN activation_min_readers integer NOT NULL DEFAULT 0
    CHECK (activation_min_readers >= 0);

DO $$
DECLARE
    q record;
BEGIN
    FOR q IN SELECT object_id FROM queues LOOP
        EXECUTE format('CREATE SEQUENCE %I', 'queue_' || q.object_id || '_receives');
        EXECUTE format('CREATE SEQUENCE %I', 'queue_' || q.object_id || '_empty_receives');
        UPDATE queues
           SET receive_counter = format('%I', 'queue_' || q.object_id || '_receives')::regclass,
               empty_receive_counter =
                   format('%I', 'queue_' || q.object_id || '_empty_receives')::regclass
         WHERE object_id = q.object_id;
    END LOOP;
END
$$;

CREATE TABLE queue_monitor_state (
    queue_id               integer PRIMARY KEY REFERENCES queues ON DELETE CASCADE,
    state                  text NOT NULL DEFAULT 'INACTIVE'
        CHECK (state IN ('INACTIVE', 'NOTIFIED', 'RECEIVES_OCCURRING')),
    state_since            timestamp NOT NULL,
    last_activated_time    timestamp,
    last_empty_rowset_time timestamp,
    ramp_started_at        timestamp,
    receives_seen          bigint NOT NULL DEFAULT 0,
    empty_receives_seen    bigint NOT NULL DEFAULT 0
);

-- Readers started by activation that are running now (sys.dm_broker_activated_tasks).
CREATE TABLE activated_tasks (
    task_id     uuid PRIMARY KEY,
    queue_id    integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    pid         integer,
    procedure   text NOT NULL,
    execute_as  text,
    started_at  timestamp NOT NULL
);

-- Every activated reader: start, end, outcome, messages, error (SQL Server only has ERRORLOG).
CREATE TABLE activation_log (
    task_id           uuid PRIMARY KEY,
    queue_id          integer NOT NULL,
    queue_name        text NOT NULL,
    procedure         text NOT NULL,
    execute_as        text,
    pid               integer,
    started_at        timestamp NOT NULL,
    ended_at          timestamp,
    outcome           text CHECK (outcome IN ('ended', 'aborted', 'killed')),
    messages_received bigint,
    rollbacks         bigint,
    exception         text
);
CREATE INDEX activation_log_queue ON activation_log (queue_id, started_at);

ALTER TYPE received_message ADD ATTRIBUTE attempts integer;

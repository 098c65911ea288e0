-- Quarantined messages and the summaries of reader runs.

-- Messages a reader could not process, moved aside so the queue keeps moving: inspectable with
-- SQL, replayable onto their conversation, or discardable. One table for every queue.
CREATE TABLE quarantine (
    quarantine_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id                integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    conversation_handle     uuid NOT NULL,
    conversation_group_id   uuid NOT NULL,
    service_name            text NOT NULL,
    service_contract_name   text NOT NULL,
    message_type_name       text NOT NULL,
    message_sequence_number bigint NOT NULL,
    message_id              uuid NOT NULL,
    message_body            bytea,
    error                   text NOT NULL,
    traceback               text,
    attempts                integer NOT NULL,
    -- quarantined: waits for a person; retrying: the timer-based retry will try it again;
    -- replayed / discarded: done with.
    status                  text NOT NULL DEFAULT 'quarantined'
        CHECK (status IN ('quarantined', 'retrying', 'replayed', 'discarded')),
    quarantined_at          timestamp NOT NULL,
    resolved_at             timestamp
);
CREATE INDEX quarantine_open ON quarantine (queue_id, status, quarantined_at);
CREATE INDEX quarantine_conversation ON quarantine (conversation_handle, message_sequence_number)
    WHERE status IN ('quarantined', 'retrying');

-- What each reader run did (one row per Spark job or activated run), for operators to report.
CREATE TABLE reader_runs (
    run_id     uuid PRIMARY KEY,
    queue_name text NOT NULL,
    started_at timestamp NOT NULL,
    ended_at   timestamp,
    summary    jsonb
);

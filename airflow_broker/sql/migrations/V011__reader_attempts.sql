-- What each attempt of each reader of a run did. A reader writes its counts in the same
-- transaction as the work they count, so the committed work of an attempt that was killed
-- (a Spark task retried, an executor lost) is still counted, and nothing rolled back is.
CREATE TABLE reader_attempts (
    run_id      uuid NOT NULL,
    reader      integer NOT NULL,
    attempt     integer NOT NULL,
    host        text,
    pid         integer,
    started_at  timestamp NOT NULL,
    updated_at  timestamp NOT NULL,
    ended_at    timestamp,
    -- running: still at work, or killed before it could say otherwise (reported as lost
    -- once the reader ran again); finished: drained the queue; failed: stopped by an error
    -- it reported.
    status      text NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'finished', 'failed')),
    stats       jsonb NOT NULL DEFAULT '{}',
    -- The first failures of the attempt (message, attempt, error, what the strategy did), for
    -- the task log; the quarantine table keeps every quarantined one.
    events      jsonb NOT NULL DEFAULT '[]',
    error       text,
    PRIMARY KEY (run_id, reader, attempt)
);

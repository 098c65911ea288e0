-- Reader runs (a Spark job of queue readers, or any other run of QueueReader) and the attempts
-- of their readers: what operators report, summed from the database so that it holds over
-- task retries and killed processes.

-- A run's records are its readers': every function here needs RECEIVE on the run's queue
-- (229), and a run that does not exist, or whose queue the login may not see, is not found
-- (15151). A queue dropped since leaves its runs to the schema's owner. The readers' own
-- call, once per batch, costs one permission lookup; the others only matter for a refusal.
CREATE OR REPLACE FUNCTION require_run(p_run_id uuid) RETURNS void
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_queue text;
    q queues;
BEGIN
    SELECT queue_name INTO v_queue FROM reader_runs WHERE run_id = p_run_id;
    IF FOUND THEN
        q := find_queue(v_queue);
    END IF;
    IF q.object_id IS NOT NULL
       AND role_has_permission(session_user, 'RECEIVE', 1::smallint, q.object_id,
                               q.principal_id) THEN
        RETURN;
    END IF;
    IF q.object_id IS NOT NULL AND may_see(1::smallint, q.object_id, q.principal_id) THEN
        PERFORM require_on_queue('RECEIVE', q);
    ELSIF NOT (v_queue IS NOT NULL AND is_broker_owner()) THEN
        PERFORM raise_error(15151, 'reader run', coalesce(p_run_id::text, 'NULL'));
    END IF;
END
$$;

-- A run starts: its plan (queue, readers, what the cluster can run at once) is kept with it.
CREATE OR REPLACE FUNCTION reader_run_begin(p_run_id uuid, p_queue text, p_plan jsonb)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_queue text;
BEGIN
    SELECT * INTO q FROM visible_queue(p_queue);
    IF q.object_id IS NULL THEN
        PERFORM raise_error(15151, 'queue', coalesce(p_queue, 'NULL'));
    END IF;
    PERFORM require_on_queue('RECEIVE', q);
    INSERT INTO reader_runs (run_id, queue_name, started_at, summary)
    VALUES (p_run_id, p_queue, utc_now(), p_plan)
    ON CONFLICT (run_id) DO UPDATE SET summary = reader_runs.summary || EXCLUDED.summary
     WHERE reader_runs.queue_name = EXCLUDED.queue_name
    RETURNING queue_name INTO v_queue;
    IF v_queue IS NULL THEN
        -- Named only to a login that may read that run.
        PERFORM require_run(p_run_id);
        SELECT queue_name INTO v_queue FROM reader_runs WHERE run_id = p_run_id;
        PERFORM raise_error(50126, p_run_id::text, v_queue);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION reader_attempt_begin(p_run_id uuid, p_reader integer,
                                                p_attempt integer, p_host text, p_pid integer)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT require_run(p_run_id);
    INSERT INTO reader_attempts (run_id, reader, attempt, host, pid, started_at, updated_at)
    VALUES (p_run_id, p_reader, p_attempt, p_host, p_pid, utc_now(), utc_now())
    ON CONFLICT (run_id, reader, attempt) DO UPDATE
       SET host = EXCLUDED.host, pid = EXCLUDED.pid, updated_at = EXCLUDED.updated_at;
$$;

-- Called inside the reader's own transaction, so the counts commit with the work they count.
CREATE OR REPLACE FUNCTION reader_attempt_progress(p_run_id uuid, p_reader integer,
                                                   p_attempt integer, p_stats jsonb,
                                                   p_events jsonb)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT require_run(p_run_id);
    UPDATE reader_attempts SET stats = p_stats, events = p_events, updated_at = utc_now()
     WHERE run_id = p_run_id AND reader = p_reader AND attempt = p_attempt;
$$;

-- What an attempt has committed so far: a reader whose connection broke during a COMMIT cannot
-- tell whether its last batch committed, and takes its counts from here.
CREATE OR REPLACE FUNCTION reader_attempt_stats(p_run_id uuid, p_reader integer,
                                                p_attempt integer)
RETURNS jsonb LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT require_run(p_run_id);
    SELECT jsonb_build_object('stats', stats, 'events', events) FROM reader_attempts
     WHERE run_id = p_run_id AND reader = p_reader AND attempt = p_attempt;
$$;

CREATE OR REPLACE FUNCTION reader_attempt_end(p_run_id uuid, p_reader integer,
                                              p_attempt integer, p_status text, p_error text)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT require_run(p_run_id);
    UPDATE reader_attempts SET status = p_status, error = p_error, ended_at = utc_now(),
                               updated_at = utc_now()
     WHERE run_id = p_run_id AND reader = p_reader AND attempt = p_attempt;
$$;

-- The run as its readers' rows tell it: every count summed over all attempts; attempts beyond
-- the first of each reader are retries; a reader whose last attempt did not finish failed; how
-- many attempts were at work at once (an attempt killed without a word counts until its last
-- commit).
CREATE OR REPLACE FUNCTION reader_run_summary(p_run_id uuid)
RETURNS jsonb LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT require_run(p_run_id);
    WITH a AS (
        SELECT *, coalesce(ended_at, updated_at) AS until,
               row_number() OVER (PARTITION BY reader ORDER BY started_at DESC, attempt DESC)
                   AS latest,
               row_number() OVER (PARTITION BY reader ORDER BY started_at, attempt) AS try_number
          FROM reader_attempts WHERE run_id = p_run_id
    ), sums AS (
        SELECT reader, key, sum(value::bigint) AS total
          FROM a, jsonb_each_text(a.stats) GROUP BY reader, key
    ), totals AS (
        SELECT coalesce(jsonb_object_agg(key, total), '{}') AS counts
          FROM (SELECT key, sum(total) AS total FROM sums GROUP BY key) s
    ), per_reader AS (
        SELECT r.reader, jsonb_build_object('reader', r.reader, 'attempts', r.attempts)
                   || coalesce((SELECT jsonb_object_agg(key, total) FROM sums
                                 WHERE sums.reader = r.reader), '{}') AS doc
          FROM (SELECT reader, count(*) AS attempts FROM a GROUP BY reader) r
    )
    SELECT coalesce((SELECT summary FROM reader_runs WHERE run_id = p_run_id), '{}')
        || (SELECT counts FROM totals)
        || jsonb_build_object(
            'run_id', p_run_id,
            'readers', (SELECT count(DISTINCT reader) FROM a),
            'attempts', (SELECT count(*) FROM a),
            'task_retries', (SELECT count(*) - count(DISTINCT reader) FROM a),
            'failed_readers', (SELECT coalesce(jsonb_agg(reader ORDER BY reader), '[]')
                                 FROM a WHERE latest = 1 AND status <> 'finished'),
            'max_concurrent', (SELECT coalesce(max((SELECT count(*) FROM a o
                                                     WHERE o.started_at <= s.started_at
                                                       AND (o.until > s.started_at
                                                            OR (o.reader, o.attempt)
                                                               = (s.reader, s.attempt)))), 0)
                                 FROM a s),
            'per_reader', (SELECT coalesce(jsonb_agg(doc ORDER BY reader), '[]')
                             FROM per_reader),
            'per_attempt', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                'reader', reader, 'try', try_number, 'attempt', attempt, 'host', host,
                                'pid', pid,
                                -- Killed without a word (its executor lost), and run again.
                                'status', CASE WHEN status = 'running' AND latest > 1
                                               THEN 'lost' ELSE status END,
                                'error', error,
                                'seconds', round(extract(epoch FROM until - started_at), 3))
                                || stats ORDER BY reader, started_at), '[]') FROM a),
            'events', (SELECT coalesce(jsonb_agg(e ORDER BY a.reader, a.started_at), '[]')
                         FROM a, jsonb_array_elements(a.events) e));
$$;

-- The run has ended: its summary is kept with it.
CREATE OR REPLACE FUNCTION reader_run_finish(p_run_id uuid)
RETURNS jsonb LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT require_run(p_run_id);
    UPDATE reader_runs SET ended_at = utc_now(), summary = reader_run_summary(p_run_id)
     WHERE run_id = p_run_id
    RETURNING summary;
$$;

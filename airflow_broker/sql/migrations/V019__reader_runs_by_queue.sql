-- The queue page of the UI lists a queue's newest reader runs: one Spark job adds a row, and
-- years of them would otherwise be read whole on every visit.
CREATE INDEX reader_runs_queue ON reader_runs (queue_name, started_at);

-- A message a DAG run has processed through BrokerHook.consume() stays in the Airflow inbox as
-- 'consumed' (without its body) until the broker worker purges it, rather than being deleted at
-- once. consume() can then tell a message an earlier try already processed (skip it) from one
-- that is not in the inbox at all (fail loudly): a missing row no longer reads as "consumed".
ALTER TABLE airflow_inbox DROP CONSTRAINT airflow_inbox_state_check;
ALTER TABLE airflow_inbox ADD CONSTRAINT airflow_inbox_state_check
    CHECK (state IN ('claimed', 'delivered', 'rejected', 'consumed'));
ALTER TABLE airflow_inbox ADD COLUMN consumed_at timestamp;
CREATE INDEX airflow_inbox_consumed ON airflow_inbox (consumed_at) WHERE state = 'consumed';

-- A watcher hands a delivered message out again when no DAG run has consumed it for a while:
-- Airflow may store an asset event without ever starting a run for it (an event stored while
-- the scheduler creates the previous run is attached to no run and queues none), and a run
-- may fail for good. The count spaces the next time out.
ALTER TABLE airflow_inbox ADD COLUMN redeliveries integer NOT NULL DEFAULT 0;

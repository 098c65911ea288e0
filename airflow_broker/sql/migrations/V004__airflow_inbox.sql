-- The Airflow inbox: messages received on behalf of an Airflow consumer (a sensor's task
-- instance, an asset watcher) and kept until that consumer has used them.
--
-- RECEIVE and the INSERT into this table commit in one transaction, so a message is always
-- either still on its queue or here: a task killed right after its RECEIVE, or a triggerer that
-- dies before Airflow has stored the asset event, loses nothing. The consumer removes its rows
-- when it is done with them (airflow_ack).
CREATE TABLE airflow_inbox (
    inbox_id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- 'task:<dag_id>/<run_id>/<task_id>/<map_index>' for a sensor, 'watcher:<name>' for an
    -- asset watcher: a retry of the same task instance finds its own rows again.
    consumer                text NOT NULL,
    dag_id                  text,
    run_id                  text,
    queue_name              text NOT NULL,
    -- claimed: received for the consumer, not yet handed over;
    -- delivered: handed over (Airflow stored the asset event), waiting for the DAG run's ack;
    -- rejected: refused by the consumer, kept as a dead letter.
    state                   text NOT NULL DEFAULT 'claimed'
        CHECK (state IN ('claimed', 'delivered', 'rejected')),
    -- The session of a long-lived claimer (a watcher's producer): rows whose session is gone
    -- are handed out again; backend_start guards against a reused pid.
    holder_pid              integer,
    holder_started          timestamptz,
    claimed_at              timestamp NOT NULL,
    delivered_at            timestamp,
    -- The RECEIVE row, column for column (the received_message type).
    status                  smallint NOT NULL,
    priority                smallint NOT NULL,
    queuing_order           bigint NOT NULL,
    conversation_group_id   uuid NOT NULL,
    conversation_handle     uuid NOT NULL,
    message_sequence_number bigint NOT NULL,
    service_name            text NOT NULL,
    service_id              integer NOT NULL,
    service_contract_name   text NOT NULL,
    service_contract_id     integer NOT NULL,
    message_type_name       text NOT NULL,
    message_type_id         integer NOT NULL,
    validation              text NOT NULL,
    message_body            bytea,
    message_id              uuid NOT NULL,
    attempts                integer NOT NULL DEFAULT 0,
    UNIQUE (consumer, message_id)
);
CREATE INDEX airflow_inbox_consumer ON airflow_inbox (consumer, state, inbox_id);
CREATE INDEX airflow_inbox_run ON airflow_inbox (dag_id, run_id);

-- Conversation lifecycle: audit of errors that SQL Server would drop silently, a log of
-- END CONVERSATION WITH CLEANUP, and what delivery from the transmission queue needs.

-- An Error that reaches an endpoint which has already ended (the fire-and-forget pattern), or
-- that END CONVERSATION purges before anybody received it, is discarded as in SQL Server, and
-- recorded here so it is never silently lost.
CREATE TABLE error_audit (
    audit_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recorded_at         timestamp NOT NULL,
    conversation_handle uuid NOT NULL,
    conversation_id     uuid NOT NULL,
    is_initiator        boolean NOT NULL,
    service_name        text NOT NULL,
    far_service         text NOT NULL,
    code                integer,
    description         text,
    reason              text NOT NULL
);
CREATE INDEX error_audit_time ON error_audit (recorded_at);

-- Every END CONVERSATION WITH CLEANUP: who, when, the state, and what was thrown away.
CREATE TABLE cleanup_log (
    cleanup_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cleaned_at          timestamp NOT NULL,
    cleaned_by          text NOT NULL,
    conversation_handle uuid NOT NULL,
    conversation_id     uuid NOT NULL,
    is_initiator        boolean NOT NULL,
    state               char(2) NOT NULL,
    service_name        text NOT NULL,
    far_service         text NOT NULL,
    queued_messages     integer NOT NULL,
    pending_messages    integer NOT NULL
);

-- The next attempt of a message held in the transmission queue, for the broker worker.
ALTER TABLE transmissions ADD COLUMN next_attempt_at timestamp;
ALTER TABLE transmissions ADD COLUMN attempts integer NOT NULL DEFAULT 0;
CREATE INDEX transmissions_due ON transmissions (next_attempt_at);

-- The worker finds due timers, expired lifetimes and reclaimable endpoints by these.
CREATE INDEX endpoints_timer ON endpoints (dialog_timer) WHERE dialog_timer > '1900-01-01';
CREATE INDEX endpoints_lifetime ON endpoints (lifetime) WHERE state IN ('SO', 'CO', 'DI');
CREATE INDEX endpoints_closed ON endpoints (security_timestamp, lifetime) WHERE state = 'CD';
CREATE INDEX endpoints_far_handle ON endpoints (far_handle);

-- The transaction that delivered message 0: when the initiator ends in a later transaction it
-- has seen message 0 acknowledged, and its EndDialog initialises the target's security
-- timestamp (spec 15.1); ending in the same transaction is the fire-and-forget pattern.
ALTER TABLE endpoints ADD COLUMN message0_xid xid8;

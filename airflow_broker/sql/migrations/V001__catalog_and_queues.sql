-- The broker's tables. The migration runner sets search_path to the broker schema, so every
-- name here is unqualified and the schema name stays configurable.

-- One clock for every time-based rule, so tests can move time (spec 27.8).
CREATE TABLE clock (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    offset_by   interval NOT NULL DEFAULT interval '0'
);
INSERT INTO clock DEFAULT VALUES;

-- Error texts, keyed by SQL Server error number; raise_error() formats them.
CREATE TABLE error_messages (
    error_number integer PRIMARY KEY,
    text         text NOT NULL
);

CREATE TABLE xml_schema_collections (
    xml_collection_id serial PRIMARY KEY,
    name              text NOT NULL UNIQUE,
    -- The XSD documents of the collection; the body must be valid against one of them.
    schemas           text[] NOT NULL,
    created_at        timestamp NOT NULL
);

CREATE TABLE message_types (
    message_type_id   serial PRIMARY KEY,
    name              text NOT NULL UNIQUE,
    validation_kind   text NOT NULL
        CHECK (validation_kind IN ('NONE', 'EMPTY', 'WELL_FORMED_XML', 'VALID_XML')),
    xml_collection_id integer REFERENCES xml_schema_collections,
    is_system         boolean NOT NULL DEFAULT false,
    created_at        timestamp NOT NULL,
    CHECK ((validation_kind = 'VALID_XML') = (xml_collection_id IS NOT NULL))
);

CREATE TABLE contracts (
    service_contract_id serial PRIMARY KEY,
    name                text NOT NULL UNIQUE,
    is_system           boolean NOT NULL DEFAULT false,
    created_at          timestamp NOT NULL
);

CREATE TABLE contract_message_usages (
    service_contract_id  integer NOT NULL REFERENCES contracts ON DELETE CASCADE,
    message_type_id      integer NOT NULL REFERENCES message_types,
    is_sent_by_initiator boolean NOT NULL,
    is_sent_by_target    boolean NOT NULL,
    PRIMARY KEY (service_contract_id, message_type_id)
);
CREATE INDEX contract_message_usages_type ON contract_message_usages (message_type_id);

CREATE TABLE queues (
    object_id                          serial PRIMARY KEY,
    schema_name                        text NOT NULL,
    name                               text NOT NULL,
    is_receive_enabled                 boolean NOT NULL DEFAULT true,
    is_enqueue_enabled                 boolean NOT NULL DEFAULT true,
    is_retention_enabled               boolean NOT NULL DEFAULT false,
    is_poison_message_handling_enabled boolean NOT NULL DEFAULT true,
    is_activation_enabled              boolean NOT NULL DEFAULT false,
    activation_procedure               text,
    max_readers                        integer NOT NULL DEFAULT 0 CHECK (max_readers BETWEEN 0 AND 32767),
    -- NULL: none; 'SELF', 'OWNER' or a role name.
    execute_as                         text,
    disabled_reason                    text CHECK (disabled_reason IN ('ADMIN', 'POISON')),
    disabled_at                        timestamp,
    created_at                         timestamp NOT NULL,
    UNIQUE (schema_name, name)
);

CREATE TABLE service_defs (
    service_id       serial PRIMARY KEY,
    name             text NOT NULL UNIQUE,
    service_queue_id integer NOT NULL REFERENCES queues,
    is_system        boolean NOT NULL DEFAULT false,
    created_at       timestamp NOT NULL
);
CREATE INDEX service_defs_queue ON service_defs (service_queue_id);

CREATE TABLE service_def_contracts (
    service_id          integer NOT NULL REFERENCES service_defs ON DELETE CASCADE,
    service_contract_id integer NOT NULL REFERENCES contracts,
    PRIMARY KEY (service_id, service_contract_id)
);
CREATE INDEX service_def_contracts_contract ON service_def_contracts (service_contract_id);

-- A conversation group is the unit of locking: readers lock its row FOR NO KEY UPDATE, which
-- does not conflict with the KEY SHARE that inserts referencing it would take.
CREATE TABLE dialog_groups (
    conversation_group_id uuid PRIMARY KEY,
    service_id            integer NOT NULL REFERENCES service_defs,
    is_system             boolean NOT NULL DEFAULT false
);
CREATE INDEX dialog_groups_service ON dialog_groups (service_id);

CREATE TABLE endpoints (
    conversation_handle   uuid PRIMARY KEY,
    conversation_id       uuid NOT NULL,
    is_initiator          boolean NOT NULL,
    service_contract_id   integer NOT NULL REFERENCES contracts,
    conversation_group_id uuid NOT NULL REFERENCES dialog_groups,
    service_id            integer NOT NULL REFERENCES service_defs,
    -- The peer's handle once the peer endpoint exists in this broker (local delivery).
    far_handle            uuid,
    far_service           text NOT NULL,
    far_broker_instance   text,
    lifetime              timestamp NOT NULL,
    state                 char(2) NOT NULL
        CHECK (state IN ('SO', 'SI', 'CO', 'DI', 'DO', 'ER', 'CD')),
    security_timestamp    timestamp NOT NULL DEFAULT '1900-01-01',
    dialog_timer          timestamp NOT NULL DEFAULT '1900-01-01',
    send_sequence         bigint NOT NULL DEFAULT 0,
    receive_sequence      bigint NOT NULL DEFAULT 0,
    end_dialog_sequence   bigint NOT NULL DEFAULT -1,
    system_sequence       bigint NOT NULL DEFAULT 0,
    last_send_tran_id     bigint,
    priority              smallint NOT NULL DEFAULT 5,
    is_encrypted          boolean NOT NULL DEFAULT true,
    is_system             boolean NOT NULL DEFAULT false,
    created_at            timestamp NOT NULL,
    UNIQUE (conversation_id, is_initiator)
);
CREATE INDEX endpoints_group ON endpoints (conversation_group_id);
CREATE INDEX endpoints_service ON endpoints (service_id);
CREATE INDEX endpoints_contract ON endpoints (service_contract_id);

-- Every queue's messages live in one table, so SEND and RECEIVE are static SQL with cached
-- plans; each queue gets a read-only peek view over its own rows.
CREATE TABLE queue_messages (
    queuing_order           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id                integer NOT NULL,
    -- 1 ready, 0 retained after RECEIVE, 2 not yet complete, 3 retained copy of a sent message.
    status                  smallint NOT NULL DEFAULT 1 CHECK (status IN (0, 1, 2, 3)),
    priority                smallint NOT NULL DEFAULT 5,
    conversation_group_id   uuid NOT NULL,
    conversation_handle     uuid NOT NULL,
    message_sequence_number bigint NOT NULL,
    -- RECEIVE order inside a conversation: DialogTimer (0), then Error (1), then the rest (2).
    precedence              smallint NOT NULL DEFAULT 2,
    service_id              integer NOT NULL,
    service_contract_id     integer NOT NULL,
    message_type_id         integer NOT NULL,
    message_body            bytea,
    message_id              uuid NOT NULL,
    enqueued_at             timestamp NOT NULL
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_insert_scale_factor = 0.01);

-- RECEIVE without WHERE: the oldest ready message of the highest priority picks the group.
CREATE INDEX queue_messages_ready ON queue_messages (queue_id, priority DESC, queuing_order)
    WHERE status = 1;
-- RECEIVE inside one group: conversations one after another, each in receive order.
CREATE INDEX queue_messages_group ON queue_messages
    (conversation_group_id, conversation_handle, precedence, message_sequence_number)
    WHERE status = 1;
-- END CONVERSATION and retention clean-up find every row of one conversation.
CREATE INDEX queue_messages_conversation ON queue_messages (conversation_handle);

-- Messages that could not be put on their destination queue yet.
CREATE TABLE transmissions (
    transmission_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_handle     uuid NOT NULL,
    to_service_name         text NOT NULL,
    to_broker_instance      text,
    from_service_name       text NOT NULL,
    service_contract_name   text NOT NULL,
    enqueue_time            timestamp NOT NULL,
    message_sequence_number bigint NOT NULL,
    message_type_id         integer NOT NULL,
    message_body            bytea,
    is_conversation_error   boolean NOT NULL DEFAULT false,
    is_end_of_dialog        boolean NOT NULL DEFAULT false,
    priority                smallint NOT NULL DEFAULT 5,
    transmission_status     text NOT NULL DEFAULT '',
    message_id              uuid NOT NULL
);
CREATE INDEX transmissions_conversation ON transmissions
    (conversation_handle, message_sequence_number);

-- Sessions that wait in WAITFOR(RECEIVE): SEND wakes them with NOTIFY only when a waiter exists,
-- because NOTIFY serialises committing transactions on a database-wide lock.
CREATE TABLE queue_waiters (
    waiter_id   uuid PRIMARY KEY,
    queue_id    integer NOT NULL REFERENCES queues ON DELETE CASCADE,
    backend_pid integer NOT NULL,
    since       timestamp NOT NULL
);
CREATE INDEX queue_waiters_queue ON queue_waiters (queue_id);

-- The catalog every database starts with (spec 2.3 and 2.4); user objects get ids from 65536 on,
-- as in SQL Server.
INSERT INTO message_types (message_type_id, name, validation_kind, is_system, created_at)
VALUES
    (1, 'http://schemas.microsoft.com/SQL/ServiceBroker/Error', 'WELL_FORMED_XML', true, '1900-01-01'),
    (2, 'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog', 'EMPTY', true, '1900-01-01'),
    (3, 'http://schemas.microsoft.com/SQL/Notifications/QueryNotification', 'WELL_FORMED_XML', true, '1900-01-01'),
    (4, 'http://schemas.microsoft.com/SQL/Notifications/EventNotification', 'WELL_FORMED_XML', true, '1900-01-01'),
    (5, 'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer', 'EMPTY', true, '1900-01-01'),
    (6, 'http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/MissingRoute', 'WELL_FORMED_XML', true, '1900-01-01'),
    (7, 'http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/FailedRoute', 'WELL_FORMED_XML', true, '1900-01-01'),
    (8, 'http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/MissingRemoteServiceBinding', 'WELL_FORMED_XML', true, '1900-01-01'),
    (9, 'http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/FailedRemoteServiceBinding', 'WELL_FORMED_XML', true, '1900-01-01'),
    (10, 'http://schemas.microsoft.com/SQL/ServiceBroker/ServiceEcho/Echo', 'NONE', true, '1900-01-01'),
    (11, 'http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic/Query', 'WELL_FORMED_XML', true, '1900-01-01'),
    (12, 'http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic/Status', 'WELL_FORMED_XML', true, '1900-01-01'),
    (13, 'http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic/Description', 'NONE', true, '1900-01-01'),
    (14, 'DEFAULT', 'NONE', true, '1900-01-01');
SELECT setval(pg_get_serial_sequence('message_types', 'message_type_id'), 65535);

INSERT INTO contracts (service_contract_id, name, is_system, created_at)
VALUES
    (1, 'http://schemas.microsoft.com/SQL/Notifications/PostEventNotification', true, '1900-01-01'),
    (2, 'http://schemas.microsoft.com/SQL/Notifications/PostQueryNotification', true, '1900-01-01'),
    (3, 'http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice', true, '1900-01-01'),
    (4, 'http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic', true, '1900-01-01'),
    (5, 'http://schemas.microsoft.com/SQL/ServiceBroker/ServiceEcho', true, '1900-01-01'),
    (6, 'DEFAULT', true, '1900-01-01');
SELECT setval(pg_get_serial_sequence('contracts', 'service_contract_id'), 65535);

INSERT INTO contract_message_usages
    (service_contract_id, message_type_id, is_sent_by_initiator, is_sent_by_target)
VALUES
    (1, 4, true, false),
    (2, 3, true, false),
    (3, 6, true, false), (3, 7, true, false), (3, 8, true, false), (3, 9, true, false),
    (4, 11, true, false), (4, 12, false, true), (4, 13, false, true),
    (5, 10, true, true),
    (6, 14, true, true);

SELECT setval(pg_get_serial_sequence('queues', 'object_id'), 65535);
SELECT setval(pg_get_serial_sequence('service_defs', 'service_id'), 65535);
SELECT setval(pg_get_serial_sequence('xml_schema_collections', 'xml_collection_id'), 65535);

-- One row of a RECEIVE result: the queue's columns (spec 5.4).
CREATE TYPE received_message AS (
    status                  smallint,
    priority                smallint,
    queuing_order           bigint,
    conversation_group_id   uuid,
    conversation_handle     uuid,
    message_sequence_number bigint,
    service_name            text,
    service_id              integer,
    service_contract_name   text,
    service_contract_id     integer,
    message_type_name       text,
    message_type_id         integer,
    validation              text,
    message_body            bytea,
    message_id              uuid
);

-- Shared helpers of every statement: the clock, errors, name checks, system message bodies and
-- WAITFOR wake-ups. Files in this folder are re-applied by install() whenever they change; each
-- function pins search_path to the broker schema it was installed into.
--
-- The statements' entry points (SEND, BEGIN DIALOG, RECEIVE, END CONVERSATION, ...) also set
-- enable_seqscan = off for everything they run (thin wrappers leave it to the function they
-- call). Their lookups are all by key, and a session that
-- first plans them while the tables have statistics of a page or two (a new broker, or one
-- analyzed while empty) would cache sequential scans, PostgreSQL's own foreign-key checks
-- included, until the next ANALYZE: a dialog's BEGIN + SEND measured 1.65 ms of server time
-- over the first 1,000 dialogs and 4.5 ms over the third thousand, against a flat 1.0-1.35 ms
-- with the setting.

-- The one clock every time-based rule reads (UTC, as SQL Server's catalog views). Tests and the
-- CLI move it by changing clock.offset_by.
-- PL/pgSQL rather than SQL: PostgreSQL 16 plans a non-inlined SQL function on every call,
-- and this one is called several times by every statement.
CREATE OR REPLACE FUNCTION utc_now() RETURNS timestamp
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN (clock_timestamp() AT TIME ZONE 'UTC') + (SELECT offset_by FROM clock);
END
$$;

-- The message ids of a batch: one random UUID per batch, its last 48 bits counted on per message
-- (the 74 random bits before them keep batches apart; the version and variant bits stay those of
-- a random UUID). A PostgreSQL built without OpenSSL, as the embedded one is, reads
-- /dev/urandom for every gen_random_uuid(): 4 µs a call, a fifth of a 100-message send_many's
-- server time, where this takes 0.5 µs. SQL without SET clauses, so that it is inlined.
CREATE OR REPLACE FUNCTION nth_message_id(p_batch uuid, p_n bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(overlay(uuid_send(p_batch)
                          PLACING substr(int8send(
                              (('x' || right(p_batch::text, 12))::bit(48)::bigint + p_n)
                              & 281474976710655), 3)
                          FROM 11 FOR 6), 'hex')::uuid
$$;

CREATE OR REPLACE FUNCTION advance_clock(p_by interval) RETURNS timestamp
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    UPDATE clock SET offset_by = offset_by + p_by;
    SELECT utc_now();
$$;

INSERT INTO error_messages (error_number, text) VALUES
    (102, 'Incorrect syntax near ''%s''.'),
    (103, 'The identifier that starts with ''%s'' is too long. Maximum length is %s.'),
    (208, 'Invalid object name ''%s''.'),
    (1038, 'An object or column name is missing or empty.'),
    (2714, 'There is already an object named ''%s'' in the database.'),
    (3729, 'Cannot DROP %s ''%s'' because it is being referenced by %s ''%s''.'),
    (8403, 'The message type ''%s'' is specified more than once.'),
    (8404, 'The service contract ''%s'' is specified more than once.'),
    (8406, 'The dialog lifetime can not be NULL.'),
    (8411, 'The dialog lifetime value of %s is outside the allowable range of 1 to 2147483647. Specify a valid dialog lifetime value.'),
    (8412, 'The syntax of the service name ''%s'' is invalid.'),
    (8413, 'The syntax of the broker instance ''%s'' is invalid. The specified broker instance is too long, the maximum size is 128 bytes.'),
    (8414, 'The conversation group ID ''%s'' is not valid in this context.'),
    (8417, 'The service contract name is NULL. Specify a service contract name.'),
    (8410, 'The conversation timer cannot be set beyond the conversation''s lifetime.'),
    (8418, 'The conversation handle is missing. Specify a conversation handle.'),
    (8419, 'The error code and error description are missing. Specify both a failure code and a description.'),
    (8420, 'The conversation group ID is missing. Specify a conversation group ID.'),
    (8422, 'The error code is missing. Specify a failure code.'),
    (8424, 'The error description is missing. Specify a description of the error.'),
    (8421, 'The service name is missing. Specify a service name.'),
    (8423, 'The service "%s" is not found.'),
    (8425, 'The service contract "%s" is not found.'),
    (8426, 'The conversation handle "%s" is not found.'),
    (8427, 'The conversation endpoint is not in a valid state for END CONVERSATION. The current endpoint state is ''%s''.'),
    (8428, 'The message type "%s" is not found.'),
    (8429, 'The conversation endpoint is not in a valid state for SEND. The current endpoint state is ''%s''.'),
    (8431, 'The message type ''%s'' is not part of the service contract.'),
    (8432, 'The message cannot be sent because the message type ''%s'' is marked SENT BY TARGET in the contract, however this service is an Initiator.'),
    (8433, 'The message body may not be NULL.  A zero-length UNICODE or binary string is allowed.'),
    (8434, 'The message cannot be sent because the message type ''%s'' is marked SENT BY INITIATOR in the contract, however this service is a Target.'),
    (8436, 'The conversation group "%s" is not found.'),
    (8438, 'The conversation endpoint is not in a valid state for MOVE CONVERSATION. The current endpoint state is ''%s''.'),
    (8439, 'The destination conversation group ''%s'' is invalid.'),
    (8458, 'The conversation endpoint is not in a valid state for BEGIN CONVERSATION TIMER. The current endpoint state is ''%s''.'),
    (8492, 'The service contract ''%s'' must have at least one message SENT BY INITIATOR or ANY.'),
    (8493, 'The alter of service ''%s'' must change the queue or at least one contract.'),
    (9610, 'The service ''%s'' in the FROM SERVICE clause must match the service ''%s'' referenced by %s = ''%s''.'),
    (9617, 'The service queue "%s" is currently disabled.'),
    (9618, 'The message cannot be sent because the service queue ''%s'' associated with the dialog is currently disabled and retention is on.'),
    (9717, 'Cannot enable activation on queue ''%s'': a QUEUE_ACTIVATION event notification exists on it. Internal activation and event-based activation exclude each other.'),
    (9718, 'Cannot create a QUEUE_ACTIVATION event notification on queue ''%s'': it has internal activation configured.'),
    (9659, 'The %s of route ''%s'' cannot be empty.'),
    (9660, 'The %s of route ''%s'' must be less than %s characters long.'),
    (9661, 'The SERVICE_NAME and BROKER_INSTANCE of route ''%s'' must be specified when using mirroring.'),
    (9662, 'Cannot specify BROKER_INSTANCE without SERVICE_NAME in route ''%s''.'),
    (9743, 'The %s of route ''%s'' must be an address (a PostgreSQL URI or airflow://conn_id) when using mirroring.'),
    (9744, 'The %s of route ''%s'' is not a valid address: ''%s''. Use ''LOCAL'', ''TRANSPORT'', a PostgreSQL URI (postgresql://host:port/database, with broker_schema=name in its query when the far broker''s schema is not "broker") or an Airflow connection (airflow://conn_id).'),
    (9745, 'The ADDRESS of route ''%s'' cannot be ''TRANSPORT'' when SERVICE_NAME is specified.'),
    (9746, 'The LIFETIME of route ''%s'' must be in the range %s to %s.'),
    (9747, 'The ADDRESS and MIRROR_ADDRESS of route ''%s'' cannot be the same.'),
    (15151, 'Cannot find the %s ''%s'', because it does not exist or you do not have permission.'),
    (15247, 'User does not have permission to perform this action: ''%s'' is a system %s.'),
    (50101, 'The queue ''%s'' cannot be the target of an INSERT, UPDATE, DELETE or TRUNCATE statement; change it with SEND, RECEIVE and END CONVERSATION.'),
    (50102, 'The conversation handle "%s" appears more than once in the SEND statement.'),
    (50103, 'The message type ''%s'' validates against XML schema collection ''%s''; schema validation runs in the airflow_broker Python API, so send this message type through it.'),
    (50104, 'Service Broker statements need the READ COMMITTED isolation level; this transaction runs at %s.'),
    (50105, 'The queue name ''%s'' is ambiguous; qualify it as schema.queue.'),
    (50106, 'Incorrect value %s for %s; expected %s.'),
    (50107, 'The XML schema is not valid: %s'),
    (50109, 'The error code %s is not valid: END CONVERSATION WITH ERROR needs a code greater than 0 (negative codes belong to the broker).'),
    (50110, 'The event type ''%s'' is not valid for an event notification ON QUEUE; use QUEUE_ACTIVATION or BROKER_QUEUE_DISABLED.'),
    (50111, 'The quarantined message %s cannot be replayed or discarded: it is already %s.'),
    (50112, 'The quarantined message %s cannot be replayed: its conversation %s can no longer receive (endpoint state %s).'),
    (50125, 'The conversation handle ''%s'' given to BEGIN DIALOG is already in use; give a new random one, or none.'),
    (50126, 'The reader run %s already exists for queue ''%s''; give a new run id.'),
    (50127, 'The %s permission cannot be granted, denied or revoked: routes and XML schema collections are the schema owner''s alone (a route''s address may hold a password). Make the login a member of the owner role instead.'),
    (50123, 'The broker spec is not valid: %s'),
    (50124, 'The role ''%s'' cannot record its receiving transactions for poison-message detection (it needs EXECUTE on register_receive, which the broker grants to PUBLIC): a RECEIVE it rolled back would not count. Grant it again, or turn POISON_MESSAGE_HANDLING off for the queue.'),
    (50122, 'The message body of %s bytes is larger than the maximum message size of %s bytes.'),
    (50121, 'The queue name ''%s'' contains a period, which separates a schema from a queue name; choose a name without one.'),
    (50120, 'These messages are not in the Airflow inbox: %s. They were acknowledged (BrokerHook.ack), purged, or come from another broker; nothing was consumed.'),
    (50108, 'The message type ''%s'' requires well-formed XML and this body cannot be parsed by this PostgreSQL server (built without XML support, or a UTF-16 body); send this message type through the airflow_broker Python API, which checks the body itself.')
ON CONFLICT (error_number) DO UPDATE SET text = EXCLUDED.text;

-- Raises SQLSTATE SB000 with the SQL Server error number at the front of the message text
-- ("Msg 8426: ..."), which the Python API turns into BrokerError.number.
CREATE OR REPLACE FUNCTION raise_error(p_number integer, VARIADIC p_args text[] DEFAULT '{}')
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_text text;
BEGIN
    SELECT text INTO v_text FROM error_messages WHERE error_number = p_number;
    IF v_text IS NULL THEN
        v_text := 'Service Broker error.';
    END IF;
    -- Missing arguments print as empty strings rather than failing inside the error path.
    v_text := format(v_text, VARIADIC (p_args || array_fill(''::text, ARRAY[8])));
    RAISE EXCEPTION USING ERRCODE = 'SB000', MESSAGE = format('Msg %s: %s', p_number, v_text);
END
$$;

-- The largest message body SEND accepts: 64 MiB. A RECEIVE returns bodies as text through
-- PostgreSQL's 1 GB limit for one value (hex: two characters a byte), and a backend needs 7 to 12
-- times a body's size while it moves through SEND and RECEIVE: a body of about 520 MB made every
-- RECEIVE on its queue fail. airflow_broker.messages.MAX_MESSAGE_SIZE is the same number.
CREATE OR REPLACE FUNCTION max_message_size() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 67108864::bigint $$;

-- Names of broker objects: present, at most 128 characters, never interpreted as SQL.
CREATE OR REPLACE FUNCTION check_name(p_name text, p_max integer DEFAULT 128)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF p_name IS NULL OR p_name = '' THEN
        PERFORM raise_error(1038);
    END IF;
    IF length(p_name) > p_max THEN
        PERFORM raise_error(103, left(p_name, 40), p_max::text);
    END IF;
    RETURN p_name;
END
$$;

-- SQL Server stores broker-generated XML bodies as UTF-16LE with a byte-order mark; PostgreSQL
-- has no UTF-16 conversion, so the code units are written out here.
CREATE OR REPLACE FUNCTION utf16le(p_text text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path FROM CURRENT AS $$
DECLARE
    v_out bytea := '\xfffe';
    v_cp integer;
    v_unit integer;
    v_units integer[];
    v_char text;
BEGIN
    FOREACH v_char IN ARRAY regexp_split_to_array(p_text, '') LOOP
        v_cp := ascii(v_char);
        IF v_cp < 65536 THEN
            v_units := ARRAY[v_cp];
        ELSE
            v_units := ARRAY[55296 + ((v_cp - 65536) >> 10), 56320 + ((v_cp - 65536) & 1023)];
        END IF;
        FOREACH v_unit IN ARRAY v_units LOOP
            v_out := v_out || set_byte(set_byte('\x0000'::bytea, 0, v_unit & 255), 1, v_unit >> 8);
        END LOOP;
    END LOOP;
    RETURN v_out;
END
$$;

-- The body of an Error message (spec 2.5).
CREATE OR REPLACE FUNCTION error_body(p_code integer, p_description text) RETURNS bytea
LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT utf16le(
        '<?xml version="1.0"?><Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error">'
        || '<Code>' || p_code::text || '</Code><Description>'
        || replace(replace(replace(coalesce(p_description, ''), '&', '&amp;'), '<', '&lt;'), '>', '&gt;')
        || '</Description></Error>')
$$;

-- Wakes WAITFOR(RECEIVE) sessions of a queue. The NOTIFY is sent at commit, so a waiter never
-- wakes for a message it cannot see yet.
CREATE OR REPLACE FUNCTION wake_waiters(p_queue_id integer) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queue_waiters WHERE queue_id = p_queue_id) THEN
        PERFORM pg_notify(current_schema() || '_queue_' || p_queue_id::text, '');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION check_isolation() RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_level text := current_setting('transaction_isolation');
BEGIN
    IF v_level NOT IN ('read committed', 'read uncommitted') THEN
        PERFORM raise_error(50104, upper(v_level));
    END IF;
END
$$;

-- Puts a message the broker makes for an endpoint itself (an Error, a DialogTimer) on the
-- endpoint's own queue; these have no sequence number of their own (-1).
CREATE OR REPLACE FUNCTION enqueue_local(p_handle uuid, p_type_id integer, p_body bytea,
                                         p_precedence smallint)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_queue integer;
BEGIN
    INSERT INTO queue_messages (queue_id, conversation_group_id, conversation_handle,
                                message_sequence_number, precedence, service_id,
                                service_contract_id, message_type_id, message_body, message_id,
                                enqueued_at)
    SELECT s.service_queue_id, ce.conversation_group_id, p_handle, -1, p_precedence,
           ce.service_id, ce.service_contract_id, p_type_id, p_body, gen_random_uuid(),
           utc_now()
      FROM endpoints ce JOIN service_defs s USING (service_id)
     WHERE ce.conversation_handle = p_handle
    RETURNING queue_id INTO v_queue;
    PERFORM wake_waiters(v_queue);
END
$$;

-- Puts a broker-generated Error on the local queue of an endpoint and moves it to ERROR, as when
-- the target rejects a message (spec 2.6, 17.2).
CREATE OR REPLACE FUNCTION deliver_error(p_handle uuid, p_code integer, p_description text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM enqueue_local(p_handle, 1, error_body(p_code, p_description), 1::smallint);
    UPDATE endpoints
       SET state = 'ER', system_sequence = system_sequence + 1
     WHERE conversation_handle = p_handle;
END
$$;

-- WAITFOR's registration of a waiter on a queue (airflow_broker.waitfor and the Airflow
-- triggers): only a role that may RECEIVE from the queue waits on it. Rows of waiters whose
-- session is gone are cleared first: they would only cause needless NOTIFYs.
CREATE OR REPLACE FUNCTION wait_register(p_waiter_id uuid, p_queue_id integer,
                                         p_clear_stale boolean)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM require_visible_queue('RECEIVE', p_queue_id, 15151, 'queue',
                                  coalesce(p_queue_id::text, 'NULL'));
    IF p_clear_stale THEN
        DELETE FROM queue_waiters
         WHERE queue_id = p_queue_id AND backend_pid NOT IN (SELECT pid FROM pg_stat_activity);
    END IF;
    INSERT INTO queue_waiters (waiter_id, queue_id, backend_pid, since)
    VALUES (p_waiter_id, p_queue_id, pg_backend_pid(), utc_now()) ON CONFLICT DO NOTHING;
END
$$;

-- A session removes its own waiters only. PL/pgSQL with a generic plan: as a SQL function its
-- DELETE was planned anew at the end of every WAITFOR that waited (100 us).
CREATE OR REPLACE FUNCTION wait_remove(p_waiter_ids uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    DELETE FROM queue_waiters
     WHERE waiter_id = ANY(p_waiter_ids) AND backend_pid = pg_backend_pid();
END
$$;

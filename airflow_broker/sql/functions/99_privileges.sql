-- Who may call what, and the settings every function runs with (no JIT). Applied after every
-- other file of this folder (install() applies it again whenever one of them changes, since
-- CREATE OR REPLACE resets a function's security and settings).
--
-- Every function runs with the rights of the broker schema's owner: application roles hold
-- no right on the tables, so the functions' own permission checks (08_permissions.sql) are
-- the only way in. The statements an application runs are executable by everyone and check
-- the caller's broker permissions; everything else (delivery between brokers, the worker's
-- passes, activation, administration without a permission of its own) is for the schema's
-- owner and its members alone.

DO $$
DECLARE
    f regprocedure;
    v_public boolean;
BEGIN
    FOR f, v_public IN
        SELECT p.oid::regprocedure, p.proname = ANY (ARRAY[
                   -- The statements, which check SEND, RECEIVE and REFERENCES themselves.
                   'begin_dialog', 'send', 'send_if_open', 'send_many', 'receive',
                   'receive_with_queue', 'get_conversation_group', 'end_conversation',
                   'end_conversation_with_error',
                   'begin_conversation_timer', 'move_conversation', 'get_transmission_status',
                   -- What the catalog views open to PUBLIC call (a view's functions run with
                   -- the rights of the login that selects from it).
                   'target_security_timestamp',
                   'queue_reference', 'message_type_validation', 'broker_instance',
                   'utc_now', 'max_message_size',
                   -- A reader's own records: poison detection, WAITFOR, quarantine, runs.
                   'register_receive', 'resolve_receives', 'wait_register', 'wait_remove',
                   'quarantine_message', 'parked_conversations', 'parked_messages',
                   'settle_parked', 'reader_run_begin', 'reader_run_summary',
                   'reader_run_finish', 'reader_attempt_begin', 'reader_attempt_progress',
                   'reader_attempt_stats', 'reader_attempt_end', 'activation_ended',
                   -- The Airflow provider's inbox, for readers of the consumers' queues.
                   'airflow_queue_state', 'airflow_peek', 'airflow_claim', 'airflow_claimed',
                   'airflow_fetch', 'airflow_awaiting_ack', 'airflow_take_over',
                   'airflow_reclaim', 'airflow_redeliver', 'airflow_settle', 'airflow_consume',
                   'airflow_ack', 'queue_of_event',
                   -- The pages in Airflow's UI, as far as the caller may see and act.
                   'console_queues', 'console_queue_rights', 'console_queue_messages',
                   'console_quarantine', 'console_quarantine_groups',
                   'console_replay', 'console_conversations', 'console_conversation_counts',
                   'console_reader_runs', 'console_activations',
                   'console_transmissions', 'console_retry_transmissions', 'console_inbox',
                   'console_discard', 'console_conversation_endpoints',
                   'console_conversation_messages',
                   -- DDL and permissions, which check CREATE, ALTER and CONTROL.
                   'create_queue', 'alter_queue', 'tune_queue', 'drop_queue', 'create_service',
                   'alter_service', 'drop_service', 'create_contract', 'drop_contract',
                   'create_message_type', 'alter_message_type', 'drop_message_type',
                   'grant_permission', 'deny_permission', 'revoke_permission',
                   'create_event_notification', 'drop_event_notification',
                   'alter_authorization',
                   -- The owner's alone, refused with a broker error to anyone else.
                   'create_route', 'alter_route', 'drop_route',
                   'create_xml_schema_collection', 'drop_xml_schema_collection',
                   'alter_broker', 'end_conversation_with_cleanup',
                   -- Definitions for BrokerSetupOperator, as far as the caller may see them.
                   'message_type_definition', 'contract_definition', 'queue_definition',
                   'service_definition', 'event_notification_definition',
                   'xml_schema_collection_definition', 'route_definition', 'queue_state',
                   -- What the caller may do and see, also for the catalog views' filters.
                   'has_permission', 'is_broker_owner', 'may_see'])
          FROM pg_proc p
         WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
    LOOP
        -- Never JIT-compiled: each of the broker's statements runs in a millisecond, and the
        -- planner settings that keep their plans on the indexes (SET enable_seqscan = off and
        -- the like) put their estimated costs past jit_above_cost. On a server with JIT, as
        -- most packaged ones are, every SEND compiled its statements anew: 265 ms instead of
        -- 1 ms.
        -- Except the functions PostgreSQL plans in place inside the statements that call them,
        -- which SECURITY DEFINER or a SET would prevent: role_may() runs with the rights and
        -- search_path of the broker function whose statement calls it, and only the schema's
        -- owner may call it; max_message_size() is a constant.
        -- (An older install made them SECURITY DEFINER too: that is undone here, since their
        -- files need not change with this one.)
        IF (SELECT proname FROM pg_proc WHERE oid = f) NOT IN ('role_may', 'max_message_size')
        THEN
            EXECUTE format('ALTER ROUTINE %s SECURITY DEFINER SET jit = off', f);
        ELSE
            EXECUTE format('ALTER ROUTINE %s SECURITY INVOKER RESET ALL', f);
        END IF;
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f);
        IF v_public THEN
            EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO PUBLIC', f);
        END IF;
    END LOOP;
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM PUBLIC', current_schema());
    -- Catalog views that show each login only what it may see (90_catalog_views.sql).
    EXECUTE format('GRANT SELECT ON %1$I.service_queues, %1$I.services, '
                   '%1$I.conversation_endpoints, %1$I.transmission_queue TO PUBLIC',
                   current_schema());
END
$$;


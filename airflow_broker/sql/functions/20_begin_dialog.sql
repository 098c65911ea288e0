-- BEGIN DIALOG CONVERSATION (spec 6). Creates only the initiator endpoint (state SO); the target
-- endpoint is created when the first message reaches the target.
--
-- p_conversation_handle: the handle to give the new endpoint, a random UUID made by the caller
-- (NULL: one made here). A pipelined client makes its own, so that BEGIN DIALOG need not wait
-- for an answer and travels with the SEND and the COMMIT after it.

-- The signature before p_conversation_handle: with both, a call that leaves out the defaults
-- would be ambiguous.
DROP FUNCTION IF EXISTS begin_dialog(text, text, text, uuid, uuid, integer, boolean, text);

CREATE OR REPLACE FUNCTION begin_dialog(
    p_from_service text,
    p_to_service text,
    p_contract text DEFAULT 'DEFAULT',
    p_related_conversation uuid DEFAULT NULL,
    p_related_conversation_group uuid DEFAULT NULL,
    p_lifetime integer DEFAULT 2147483647,
    p_encryption boolean DEFAULT true,
    p_to_broker_instance text DEFAULT NULL,
    p_conversation_handle uuid DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql SET search_path FROM CURRENT
-- Generic plans, as send(): the one-statement BEGIN DIALOG's lookups are by name and key, and
-- a custom plan weighed cheaper on some calls would be planned again on each of them.
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_service_id integer;
    v_queue_name text;
    v_queue_schema text;
    v_may_receive boolean;
    v_contract_id integer;
    v_may_reference boolean;
    v_group uuid;
    v_begun uuid;
    v_group_service integer;
    v_handle uuid := coalesce(p_conversation_handle, gen_random_uuid());
    v_now timestamp := utc_now();
    v_instance text := lower(p_to_broker_instance);
BEGIN
    IF p_from_service IS NULL OR p_to_service IS NULL THEN
        PERFORM raise_error(8421);
    END IF;
    IF length(p_to_service) > 256 THEN
        PERFORM raise_error(8412, left(p_to_service, 40));
    END IF;
    IF length(p_to_broker_instance) > 128 THEN
        PERFORM raise_error(8413, left(p_to_broker_instance, 40));
    END IF;
    IF v_instance = 'current database' THEN
        v_instance := (SELECT service_broker_guid::text FROM broker_identity);
    END IF;
    IF p_contract IS NULL THEN
        PERFORM raise_error(8417);
    END IF;
    IF p_lifetime IS NULL THEN
        PERFORM raise_error(8406);
    END IF;
    IF p_lifetime < 1 THEN
        PERFORM raise_error(8411, p_lifetime::text);
    END IF;
    IF p_related_conversation IS NOT NULL AND p_related_conversation_group IS NOT NULL THEN
        PERFORM raise_error(8414, p_related_conversation_group::text);
    END IF;

    IF p_related_conversation IS NULL AND p_related_conversation_group IS NULL THEN
        -- The common BEGIN DIALOG in one statement: both names found, the caller allowed
        -- RECEIVE on the FROM service's queue and REFERENCES on the contract (spec 6), the
        -- group and the endpoint created. When either is missing or refused it finds nothing,
        -- writes nothing, and the way below raises the error.
        -- explain begin_ready: p_from_service text, p_contract text, v_handle uuid,
        --   p_to_service text, v_instance text, v_now timestamp, p_lifetime integer,
        --   p_encryption boolean
        WITH found AS (
            SELECT s.service_id, c.service_contract_id, gen_random_uuid() AS group_id
              FROM service_defs s
              JOIN queues q ON q.object_id = s.service_queue_id
              JOIN contracts c ON c.name = p_contract
             WHERE s.name = p_from_service
               AND (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint, q.object_id,
                                           q.principal_id))
               AND (SELECT * FROM role_may(session_user, 'REFERENCES', 16::smallint,
                                           c.service_contract_id, c.principal_id))
        ), grouped AS (
            INSERT INTO dialog_groups (conversation_group_id, service_id)
            SELECT group_id, service_id FROM found
        ), begun AS (
            INSERT INTO endpoints (
                conversation_handle, conversation_id, is_initiator, service_contract_id,
                conversation_group_id, service_id, far_service, to_broker_instance, lifetime,
                state, is_encrypted, created_at)
            SELECT v_handle, gen_random_uuid(), true, service_contract_id, group_id, service_id,
                   p_to_service, v_instance, v_now + make_interval(secs => p_lifetime), 'SO',
                   p_encryption, v_now
              FROM found
            ON CONFLICT (conversation_handle) DO NOTHING
            RETURNING conversation_handle
        )
        SELECT f.service_id, b.conversation_handle INTO v_service_id, v_begun
          FROM found f LEFT JOIN begun b ON true;
        IF v_service_id IS NOT NULL THEN
            -- Only a handle the caller gave can be taken; the error undoes the group.
            IF v_begun IS NULL THEN
                PERFORM raise_error(50125, v_handle::text);
            END IF;
            RETURN v_handle;
        END IF;
    END IF;

    -- RECEIVE on the FROM service's queue and REFERENCES on the contract (spec 6), each read
    -- with its object.
    SELECT s.service_id, q.name, q.schema_name,
           (SELECT * FROM role_may(session_user, 'RECEIVE', 1::smallint, q.object_id,
                                   q.principal_id))
      INTO v_service_id, v_queue_name, v_queue_schema, v_may_receive
      FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
     WHERE s.name = p_from_service;
    IF v_service_id IS NULL THEN
        PERFORM raise_error(8423, p_from_service);
    END IF;
    SELECT service_contract_id,
           (SELECT * FROM role_may(session_user, 'REFERENCES', 16::smallint,
                                   service_contract_id, principal_id))
      INTO v_contract_id, v_may_reference
      FROM contracts WHERE name = p_contract;
    IF v_contract_id IS NULL THEN
        PERFORM raise_error(8425, p_contract);
    END IF;
    IF NOT v_may_receive AND NOT broker_is_acting() THEN
        -- A FROM service the login may not see (nor its queue) is not found: a 229 would name
        -- its queue.
        IF NOT EXISTS (SELECT 1 FROM service_defs s JOIN queues q
                                  ON q.object_id = s.service_queue_id
                        WHERE s.service_id = v_service_id
                          AND (may_see(17::smallint, s.service_id, s.principal_id)
                               OR may_see(1::smallint, q.object_id, q.principal_id))) THEN
            PERFORM raise_error(8423, p_from_service);
        END IF;
        PERFORM raise_error(229, 'RECEIVE', v_queue_name, current_database(), v_queue_schema);
    END IF;
    IF NOT v_may_reference AND NOT broker_is_acting() THEN
        PERFORM raise_error(229, 'REFERENCES', p_contract, current_database(),
                            current_schema());
    END IF;

    IF p_related_conversation IS NOT NULL THEN
        SELECT g.conversation_group_id, g.service_id INTO v_group, v_group_service
          FROM endpoints e
          JOIN dialog_groups g USING (conversation_group_id)
         WHERE e.conversation_handle = p_related_conversation
           FOR NO KEY UPDATE OF g;
        IF v_group IS NULL THEN
            PERFORM raise_error(8426, p_related_conversation::text);
        END IF;
    ELSIF p_related_conversation_group IS NOT NULL THEN
        INSERT INTO dialog_groups (conversation_group_id, service_id)
        VALUES (p_related_conversation_group, v_service_id)
        ON CONFLICT (conversation_group_id) DO NOTHING;
        SELECT conversation_group_id, service_id INTO v_group, v_group_service
          FROM dialog_groups
         WHERE conversation_group_id = p_related_conversation_group
           FOR NO KEY UPDATE;
    ELSE
        v_group := gen_random_uuid();
        v_group_service := v_service_id;
        INSERT INTO dialog_groups (conversation_group_id, service_id)
        VALUES (v_group, v_service_id);
    END IF;
    IF v_group_service <> v_service_id THEN
        -- A conversation and its group are seen by the readers of their service's queue only:
        -- to anyone else another service's handle or group does not exist, and its service is
        -- not named. (Asked only here: a condition with a query is planned on every call.)
        IF NOT is_broker_owner()
           AND NOT (SELECT has_permission('RECEIVE', 1::smallint, q.object_id, q.principal_id)
                      FROM service_defs s JOIN queues q ON q.object_id = s.service_queue_id
                     WHERE s.service_id = v_group_service) THEN
            IF p_related_conversation IS NOT NULL THEN
                PERFORM raise_error(8426, p_related_conversation::text);
            END IF;
            PERFORM raise_error(8436, p_related_conversation_group::text);
        END IF;
        PERFORM raise_error(9610, p_from_service,
                            (SELECT name FROM service_defs WHERE service_id = v_group_service),
                            CASE WHEN p_related_conversation IS NOT NULL
                                 THEN 'RELATED_CONVERSATION' ELSE 'RELATED_CONVERSATION_GROUP' END,
                            coalesce(p_related_conversation, p_related_conversation_group)::text);
    END IF;

    INSERT INTO endpoints (
        conversation_handle, conversation_id, is_initiator, service_contract_id,
        conversation_group_id, service_id, far_service, to_broker_instance, lifetime, state,
        is_encrypted, created_at)
    VALUES (
        v_handle, gen_random_uuid(), true, v_contract_id, v_group, v_service_id, p_to_service,
        v_instance, v_now + make_interval(secs => p_lifetime), 'SO', p_encryption, v_now)
    ON CONFLICT (conversation_handle) DO NOTHING;
    -- Only a handle the caller gave can be taken; the error undoes the group made above.
    IF NOT FOUND THEN
        PERFORM raise_error(50125, v_handle::text);
    END IF;
    RETURN v_handle;
END
$$;

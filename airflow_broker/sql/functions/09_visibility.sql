-- Metadata visibility for the functions every login may call: SQL Server shows a login the
-- objects it owns or holds a permission on, and answers for any other as for one that does
-- not exist. An answer that named the queue behind an id, or a message type's schema
-- collection, would tell a stranger what the catalog views keep from it.

-- Raises when the login lacks p_permission on queue p_queue_id: 229, naming the queue, when
-- the login may see the queue (it owns it or holds some other permission on it); otherwise
-- the error p_not_found with p_args, the answer for what the caller named (15151 for a queue
-- id, 8426 for a conversation handle) when there is no such thing. As require_on_queue(), it
-- lets the broker's own actions through.
CREATE OR REPLACE FUNCTION require_visible_queue(p_permission text, p_queue_id integer,
                                                 p_not_found integer,
                                                 VARIADIC p_args text[])
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
BEGIN
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id;
    IF role_has_permission(session_user, p_permission, 1::smallint, q.object_id,
                           q.principal_id) THEN
        RETURN;
    END IF;
    IF q.object_id IS NOT NULL AND may_see(1::smallint, q.object_id, q.principal_id) THEN
        PERFORM require_on_queue(p_permission, q);
    ELSIF NOT broker_is_acting() THEN
        PERFORM raise_error(p_not_found, VARIADIC p_args);
    END IF;
END
$$;

-- Whether the login may see a message type: a system type, one it may see (owns, or holds a
-- permission on), or one it could send: a type of a contract it may see (a sender's
-- REFERENCES) or of a service whose queue it may RECEIVE from (a target's replies).
CREATE OR REPLACE FUNCTION may_see_message_type(p_type message_types) RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT p_type.is_system OR is_broker_owner()
        OR may_see(15::smallint, p_type.message_type_id, p_type.principal_id)
        OR EXISTS (
            SELECT 1
              FROM contract_message_usages u
              JOIN contracts k USING (service_contract_id)
             WHERE u.message_type_id = p_type.message_type_id
               AND (may_see(16::smallint, k.service_contract_id, k.principal_id)
                    OR EXISTS (
                        SELECT 1
                          FROM service_def_contracts sc
                          JOIN service_defs s USING (service_id)
                          JOIN queues q ON q.object_id = s.service_queue_id
                         WHERE sc.service_contract_id = k.service_contract_id
                           AND has_permission('RECEIVE', 1::smallint, q.object_id,
                                              q.principal_id))))
$$;

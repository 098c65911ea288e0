-- Metadata visibility for the functions every login may call: SQL Server shows a login the
-- objects it owns or holds a permission on, and answers for any other as for one that does
-- not exist. An answer that named the queue behind an id, or a message type's schema
-- collection, would tell a stranger what the catalog views keep from it.

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

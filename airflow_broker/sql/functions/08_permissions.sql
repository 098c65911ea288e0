-- Service Broker's permission model (GRANT, DENY and REVOKE on broker objects, owners,
-- CONTROL) enforced inside the broker's functions, so psql, Spark, Airflow and any client get
-- the same answer.
--
-- Every broker function runs with the rights of the broker schema's owner (SECURITY DEFINER,
-- set by 99_privileges.sql), and application roles hold no right on the tables. Inside such a
-- function current_user is the owner, and a SET ROLE of the caller is invisible: the
-- principal a check sees is the login, session_user. Permissions granted to any role the
-- login is a member of apply to it, as a database role's do in SQL Server; a DENY on any of
-- them wins over every GRANT, except for the owners.

INSERT INTO error_messages (error_number, text) VALUES
    (229, 'The %s permission was denied on the object ''%s'', database ''%s'', schema ''%s''.'),
    (262, '%s permission denied in database ''%s''.'),
    (4613, 'Grantor does not have GRANT permission.'),
    (4624, 'Cannot grant, deny, or revoke permissions to sa, dbo, entity owner, information_schema, sys, or yourself.'),
    (5011, 'User does not have permission to alter database ''%s'', the database does not exist, or the database is not in a state that allows access checks.'),
    (15517, 'Cannot execute as the database principal because the principal "%s" does not exist, this type of principal cannot be impersonated, or you do not have permission.'),
    (15151, 'Cannot find the %s ''%s'', because it does not exist or you do not have permission.')
ON CONFLICT (error_number) DO UPDATE SET text = EXCLUDED.text;

-- Whether the session's login is the broker schema's owner, a member of it, or a superuser:
-- SQL Server's db_owner, for whom no permission is checked.
CREATE OR REPLACE FUNCTION is_broker_owner() RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN pg_has_role(session_user,
                       (SELECT nspowner FROM pg_namespace WHERE nspname = current_schema()),
                       'MEMBER');
END
$$;

-- Whether role p_role (NULL: the schema's owner) holds p_permission on an object of class
-- p_class, directly, through a role it is a member of or public, through CONTROL on the object
-- or on the database (VIEW DEFINITION also through VIEW DEFINITION on the database, as in SQL
-- Server, where it covers every object of the database), or by owning it (p_owner; NULL: the schema's owner). The grants are read
-- only when the role owns neither the schema nor the object.
-- A set-returning SQL function without SECURITY DEFINER or SET (99_privileges.sql leaves it
-- so), so that a statement calling it as (SELECT * FROM role_may(...)) has PostgreSQL plan it
-- in place: as a call of its own, a check cost about 15 us (40-60 us in RECEIVE's statement),
-- in place about 1.
CREATE OR REPLACE FUNCTION role_may(p_role name, p_permission text, p_class smallint,
                                    p_major_id integer, p_owner oid DEFAULT NULL)
RETURNS SETOF boolean LANGUAGE sql STABLE AS $$
    SELECT p_role IS NULL
        OR pg_has_role(p_role, (SELECT nspowner FROM pg_namespace
                                 WHERE nspname = current_schema()), 'MEMBER')
        OR (p_owner IS NOT NULL AND pg_has_role(p_role, p_owner, 'MEMBER'))
        OR (SELECT coalesce(bool_or(p.state <> 'D') AND NOT bool_or(p.state = 'D'), false)
              FROM permissions p
             WHERE ((p.class = p_class AND p.major_id = p_major_id
                     AND p.permission IN (p_permission, 'CONTROL'))
                    OR (p.class = 0 AND p.major_id = 0
                        AND p.permission IN ('CONTROL',
                                             CASE WHEN p_class = 0
                                                    OR p_permission = 'VIEW DEFINITION'
                                                  THEN p_permission END)))
               AND (p.grantee = 0 OR pg_has_role(p_role, p.grantee, 'MEMBER')))
$$;

-- role_may() for PL/pgSQL's conditions.
CREATE OR REPLACE FUNCTION role_has_permission(p_role name, p_permission text, p_class smallint,
                                               p_major_id integer, p_owner oid DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN (SELECT * FROM role_may(p_role, p_permission, p_class, p_major_id, p_owner));
END
$$;

-- The same for the session's login.
CREATE OR REPLACE FUNCTION has_permission(p_permission text, p_class smallint,
                                          p_major_id integer, p_owner oid DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN role_has_permission(session_user, p_permission, p_class, p_major_id, p_owner);
END
$$;

-- Whether p_role (NULL: the schema's owner) may send to service p_service_id. A generic plan:
-- with p_role known, the custom one looks cheaper, and was planned on every message 0.
CREATE OR REPLACE FUNCTION may_send_to(p_role name, p_service_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN p_role IS NULL
        OR role_has_permission(p_role, 'SEND', 17::smallint, p_service_id,
                               (SELECT principal_id FROM service_defs
                                 WHERE service_id = p_service_id));
END
$$;

-- Whether the login may see an object in the catalog views: SQL Server shows a user the
-- securables it owns or holds any permission on (a DENY alone does not count).
CREATE OR REPLACE FUNCTION may_see(p_class smallint, p_major_id integer, p_owner oid)
RETURNS boolean LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    RETURN role_has_permission(session_user, 'VIEW DEFINITION', p_class, p_major_id, p_owner)
        OR EXISTS (SELECT 1 FROM permissions p
                    WHERE p.class = p_class AND p.major_id = p_major_id AND p.state <> 'D'
                      AND (p.grantee = 0 OR pg_has_role(session_user, p.grantee, 'MEMBER')));
END
$$;

-- Whether the broker itself acts in this transaction (V015: fire_event's notifications).
-- The _if_assigned form: asking must not give a read-only transaction an xid.
CREATE OR REPLACE FUNCTION broker_is_acting() RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT EXISTS (SELECT 1 FROM broker_actions
                    WHERE backend_pid = pg_backend_pid()
                      AND xact = pg_current_xact_id_if_assigned())
$$;

-- Raises 229 when the login lacks p_permission on a queue (or on the queue of a service).
CREATE OR REPLACE FUNCTION require_on_queue(p_permission text, p_queue queues)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT role_has_permission(session_user, p_permission, 1::smallint, p_queue.object_id,
                               p_queue.principal_id) AND NOT broker_is_acting() THEN
        PERFORM raise_error(229, p_permission, p_queue.name, current_database(),
                            p_queue.schema_name);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION require_on_queue(p_permission text, p_queue_id integer)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
BEGIN
    SELECT * INTO q FROM queues WHERE object_id = p_queue_id;
    PERFORM require_on_queue(p_permission, q);
END
$$;

-- Raises 15151 when the login may not change (ALTER) or drop (CONTROL) an object: to it, an
-- object it may not change might as well not exist.
CREATE OR REPLACE FUNCTION require_on_object(p_permission text, p_class smallint,
                                             p_major_id integer, p_owner oid, p_kind text,
                                             p_name text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT has_permission(p_permission, p_class, p_major_id, p_owner) THEN
        PERFORM raise_error(15151, p_kind, p_name);
    END IF;
END
$$;

-- Raises 229 when the login may not reference an object (a contract in BEGIN DIALOG and
-- CREATE SERVICE, a message type in CREATE CONTRACT, a queue in CREATE SERVICE).
CREATE OR REPLACE FUNCTION require_references(p_class smallint, p_major_id integer,
                                              p_owner oid, p_name text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT has_permission('REFERENCES', p_class, p_major_id, p_owner)
       AND NOT broker_is_acting() THEN
        PERFORM raise_error(229, 'REFERENCES', p_name, current_database(), current_schema());
    END IF;
END
$$;

-- Whether the session's login may act as role p_role: SQL Server's IMPERSONATE on a user, or
-- membership of a role. In PostgreSQL that is being able to SET ROLE to it (a superuser may
-- act as anyone). The broker's own rights do not count: a member of the schema's owner acts
-- for the broker, not as every role on the server.
CREATE OR REPLACE FUNCTION may_act_as(p_role oid) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF p_role IS NULL OR p_role = 0 THEN
        RETURN false;
    END IF;
    -- PostgreSQL 16 tells membership (MEMBER) from the right to SET ROLE (SET); before 16,
    -- a member may always SET ROLE.
    IF current_setting('server_version_num')::integer >= 160000 THEN
        RETURN pg_has_role(session_user, p_role, 'SET');
    END IF;
    RETURN pg_has_role(session_user, p_role, 'MEMBER');
END
$$;

-- EXECUTE AS a role runs activated readers as that role: naming one needs the right to act
-- as it (SQL Server: IMPERSONATE on the user), or an activated procedure would escalate.
-- Owners of the schema are no exception, since the role may hold rights beyond the broker.
-- SELF and OWNER name the queue's owner, which check_reader_identity() checks once the
-- queue's row says who that is.
CREATE OR REPLACE FUNCTION check_execute_as(p_execute_as text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF p_execute_as IS NULL OR upper(p_execute_as) IN ('SELF', 'OWNER', 'CALLER') THEN
        RETURN;
    END IF;
    IF NOT coalesce(may_act_as(to_regrole(quote_ident(p_execute_as))), false) THEN
        PERFORM raise_error(15517, p_execute_as);
    END IF;
END
$$;

-- The role an activated reader of queue q runs as (reader_role(): its EXECUTE AS role, or the
-- queue's owner for SELF and OWNER) must be one the login that sets the procedure or the
-- identity may act as: otherwise CREATE or ALTER QUEUE followed by ALTER AUTHORIZATION, or
-- ALTER QUEUE on a queue someone else owns, would run the login's code with another role's
-- rights. No role (the worker's own login) runs only the procedures on the worker's list.
CREATE OR REPLACE FUNCTION check_reader_identity(q queues)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_role text := reader_role(q);
BEGIN
    IF v_role IS NOT NULL AND NOT coalesce(may_act_as(to_regrole(quote_ident(v_role))), false)
    THEN
        PERFORM raise_error(15517, q.execute_as);
    END IF;
END
$$;

-- Raises 262 when the login may not create objects of a kind ('CREATE QUEUE', ...).
CREATE OR REPLACE FUNCTION require_create(p_permission text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT has_permission(p_permission, 0::smallint, 0) THEN
        PERFORM raise_error(262, p_permission, current_database());
    END IF;
END
$$;

-- Raises 262 when the login is not a member of the schema's owner: for what only the owner
-- may create (routes, XML schema collections), which no GRANT can give.
CREATE OR REPLACE FUNCTION require_broker_owner(p_permission text)
RETURNS void LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT is_broker_owner() THEN
        PERFORM raise_error(262, p_permission, current_database());
    END IF;
END
$$;

-- A securable as GRANT names it: 'SERVICE::name', 'CONTRACT::name', 'MESSAGE TYPE::name',
-- 'QUEUE::name' (or 'OBJECT::name', or a bare queue name) and 'DATABASE'. Returns its class,
-- id, owner and the permissions it has; 15151 when there is no such object.
CREATE OR REPLACE FUNCTION securable(p_securable text,
    OUT class smallint, OUT major_id integer, OUT owner oid, OUT kind text, OUT name text,
    OUT permissions text[])
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_kind text := upper(CASE WHEN position('::' IN coalesce(p_securable, '')) > 0
                              THEN split_part(p_securable, '::', 1) END);
    v_name text := CASE WHEN position('::' IN coalesce(p_securable, '')) > 0
                        THEN substr(p_securable, position('::' IN p_securable) + 2)
                        ELSE p_securable END;
    q queues;
BEGIN
    name := v_name;
    IF upper(p_securable) = 'DATABASE' THEN
        class := 0; major_id := 0; kind := 'database'; name := current_database();
        permissions := ARRAY['CONTROL', 'CREATE QUEUE', 'CREATE SERVICE', 'CREATE CONTRACT',
                             'CREATE MESSAGE TYPE', 'VIEW DEFINITION'];
    ELSIF v_kind = 'SERVICE' THEN
        class := 17; kind := 'service';
        SELECT s.service_id, s.principal_id INTO major_id, owner
          FROM service_defs s WHERE s.name = v_name;
        permissions := ARRAY['SEND', 'CONTROL', 'ALTER', 'TAKE OWNERSHIP', 'VIEW DEFINITION'];
    ELSIF v_kind = 'CONTRACT' THEN
        class := 16; kind := 'contract';
        SELECT c.service_contract_id, c.principal_id INTO major_id, owner
          FROM contracts c WHERE c.name = v_name;
        permissions := ARRAY['REFERENCES', 'CONTROL', 'ALTER', 'TAKE OWNERSHIP',
                             'VIEW DEFINITION'];
    ELSIF v_kind = 'MESSAGE TYPE' THEN
        class := 15; kind := 'message type';
        SELECT t.message_type_id, t.principal_id INTO major_id, owner
          FROM message_types t WHERE t.name = v_name;
        permissions := ARRAY['REFERENCES', 'CONTROL', 'ALTER', 'TAKE OWNERSHIP',
                             'VIEW DEFINITION'];
    ELSIF v_kind IS NULL OR v_kind IN ('QUEUE', 'OBJECT') THEN
        class := 1; kind := 'queue';
        q := find_queue(v_name);
        major_id := q.object_id; owner := q.principal_id;
        permissions := ARRAY['RECEIVE', 'CONTROL', 'ALTER', 'REFERENCES', 'TAKE OWNERSHIP',
                             'VIEW DEFINITION'];
    ELSE
        PERFORM raise_error(102, coalesce(v_kind, p_securable));
    END IF;
    IF major_id IS NULL THEN
        PERFORM raise_error(15151, kind, coalesce(v_name, 'NULL'));
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION principal_oid(p_principal text) RETURNS oid
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    v_oid oid;
BEGIN
    IF lower(p_principal) = 'public' THEN
        RETURN 0;
    END IF;
    SELECT oid INTO v_oid FROM pg_roles WHERE rolname = p_principal;
    IF v_oid IS NULL THEN
        PERFORM raise_error(15151, 'user', coalesce(p_principal, 'NULL'));
    END IF;
    RETURN v_oid;
END
$$;

-- GRANT / DENY / REVOKE p_permission ON p_securable TO p_principal. The owner of the object,
-- a holder of CONTROL on it and a holder of the permission WITH GRANT OPTION may grant it
-- (a DENY needs CONTROL); anyone else gets 4613 and nothing changes. An object the login may
-- not see answers 15151 as a missing one does, so refusals tell nothing of what exists. No
-- permission is granted, denied or revoked to a superuser, the schema's owner, the object's
-- owner or the grantor itself (4624): such rows could never take effect.
CREATE OR REPLACE FUNCTION change_permission(p_action text, p_permission text,
                                             p_securable text, p_principal text,
                                             p_with_grant_option boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s record := securable(p_securable);
    v_permission text := upper(btrim(p_permission));
    v_schema_owner oid := (SELECT nspowner FROM pg_namespace WHERE nspname = current_schema());
    v_grantee oid;
    v_may boolean;
BEGIN
    IF s.class <> 0 AND NOT (is_broker_owner() OR may_see(s.class, s.major_id, s.owner)) THEN
        PERFORM raise_error(15151, s.kind, s.name);
    END IF;
    IF s.class = 0 AND v_permission IN ('CREATE ROUTE', 'CREATE XML SCHEMA COLLECTION') THEN
        PERFORM raise_error(50127, v_permission);
    END IF;
    IF v_permission IS NULL OR NOT v_permission = ANY (s.permissions) THEN
        PERFORM raise_error(102, coalesce(p_permission, 'NULL'));
    END IF;
    v_grantee := principal_oid(p_principal);
    v_may := has_permission('CONTROL', s.class, s.major_id, s.owner);
    IF NOT v_may AND p_action = 'GRANT' THEN
        v_may := EXISTS (
            SELECT 1 FROM permissions p
             WHERE p.class = s.class AND p.major_id = s.major_id
               AND p.permission = v_permission AND p.state = 'W'
               AND (p.grantee = 0 OR pg_has_role(session_user, p.grantee, 'MEMBER')));
    END IF;
    IF NOT v_may THEN
        PERFORM raise_error(4613);
    END IF;
    IF v_grantee <> 0
       AND (v_grantee IN (v_schema_owner, coalesce(s.owner, v_schema_owner))
            OR v_grantee = (SELECT oid FROM pg_roles WHERE rolname = session_user)
            OR (SELECT rolsuper FROM pg_roles WHERE oid = v_grantee)) THEN
        PERFORM raise_error(4624);
    END IF;
    IF p_action = 'REVOKE' THEN
        DELETE FROM permissions
         WHERE class = s.class AND major_id = s.major_id AND grantee = v_grantee
           AND permission = v_permission;
    ELSE
        INSERT INTO permissions (class, major_id, grantee, permission, state, grantor)
        VALUES (s.class, s.major_id, v_grantee, v_permission,
                CASE WHEN p_action = 'DENY' THEN 'D'
                     WHEN coalesce(p_with_grant_option, false) THEN 'W' ELSE 'G' END,
                (SELECT oid FROM pg_roles WHERE rolname = session_user))
        ON CONFLICT (class, major_id, grantee, permission)
        DO UPDATE SET state = EXCLUDED.state, grantor = EXCLUDED.grantor;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION grant_permission(p_permission text, p_securable text,
                                            p_principal text,
                                            p_with_grant_option boolean DEFAULT false)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT change_permission('GRANT', p_permission, p_securable, p_principal,
                             p_with_grant_option)
$$;

CREATE OR REPLACE FUNCTION deny_permission(p_permission text, p_securable text,
                                           p_principal text)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT change_permission('DENY', p_permission, p_securable, p_principal)
$$;

CREATE OR REPLACE FUNCTION revoke_permission(p_permission text, p_securable text,
                                             p_principal text)
RETURNS void LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT change_permission('REVOKE', p_permission, p_securable, p_principal)
$$;

-- ALTER AUTHORIZATION ON <securable> TO <principal>; 'SCHEMA OWNER' gives the object back to
-- the broker schema's owner. As SQL Server's: TAKE OWNERSHIP on the object (which CONTROL
-- implies), and, when the new owner is not the login itself, IMPERSONATE on it if it is a
-- user or membership of it if it is a role; here both are the right to act as the role
-- (may_act_as). Without that, giving a queue whose reader runs as its OWNER to a stronger
-- role would run the giver's procedure with that role's rights. As in SQL Server, the
-- object's permissions are dropped when it changes hands; a queue's reader identity is
-- checked again for the new owner.
CREATE OR REPLACE FUNCTION alter_authorization(p_securable text, p_principal text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s record := securable(p_securable);
    v_schema_owner oid := (SELECT nspowner FROM pg_namespace WHERE nspname = current_schema());
    v_owner oid;
    q queues;
BEGIN
    IF s.class = 0 THEN
        PERFORM raise_error(102, p_securable);
    END IF;
    -- CONTROL implies TAKE OWNERSHIP (role_may counts it for every permission).
    IF NOT has_permission('TAKE OWNERSHIP', s.class, s.major_id, s.owner) THEN
        PERFORM raise_error(15151, s.kind, s.name);
    END IF;
    IF upper(coalesce(p_principal, '')) <> 'SCHEMA OWNER' THEN
        v_owner := (SELECT oid FROM pg_roles WHERE rolname = p_principal);
        IF v_owner = v_schema_owner THEN
            v_owner := NULL;
        END IF;
    END IF;
    IF (v_owner IS NULL AND upper(coalesce(p_principal, '')) <> 'SCHEMA OWNER'
        AND (SELECT oid FROM pg_roles WHERE rolname = p_principal) IS NULL)
       OR NOT may_act_as(coalesce(v_owner, v_schema_owner)) THEN
        PERFORM raise_error(15151, 'user', coalesce(p_principal, 'NULL'));
    END IF;
    IF v_owner IS NOT DISTINCT FROM s.owner THEN
        RETURN;
    END IF;
    CASE s.class
        WHEN 1 THEN UPDATE queues SET principal_id = v_owner WHERE object_id = s.major_id
                    RETURNING * INTO q;
                    PERFORM check_reader_identity(q);
        WHEN 15 THEN UPDATE message_types SET principal_id = v_owner
                      WHERE message_type_id = s.major_id;
        WHEN 16 THEN UPDATE contracts SET principal_id = v_owner
                      WHERE service_contract_id = s.major_id;
        WHEN 17 THEN UPDATE service_defs SET principal_id = v_owner
                      WHERE service_id = s.major_id;
    END CASE;
    DELETE FROM permissions WHERE class = s.class AND major_id = s.major_id;
END
$$;

-- The owner a CREATE statement records: the login that creates the object, or NULL for the
-- schema's owner. (AUTHORIZATION is ALTER AUTHORIZATION right after, in the same
-- transaction.)
CREATE OR REPLACE FUNCTION creation_owner() RETURNS oid
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF is_broker_owner() THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT oid FROM pg_roles WHERE rolname = session_user);
END
$$;

-- sys.database_permissions, for the broker's objects.
CREATE OR REPLACE VIEW database_permissions AS
SELECT p.class,
       CASE p.class WHEN 0 THEN 'DATABASE' WHEN 1 THEN 'OBJECT_OR_COLUMN'
                    WHEN 15 THEN 'MESSAGE_TYPE' WHEN 16 THEN 'SERVICE_CONTRACT'
                    WHEN 17 THEN 'SERVICE' WHEN 19 THEN 'ROUTE' END AS class_desc,
       p.major_id,
       CASE p.class WHEN 0 THEN current_database()::text
                    WHEN 1 THEN (SELECT name FROM queues WHERE object_id = p.major_id)
                    WHEN 15 THEN (SELECT name FROM message_types
                                   WHERE message_type_id = p.major_id)
                    WHEN 16 THEN (SELECT name FROM contracts
                                   WHERE service_contract_id = p.major_id)
                    WHEN 17 THEN (SELECT name FROM service_defs WHERE service_id = p.major_id)
       END AS object_name,
       0 AS minor_id,
       p.grantee AS grantee_principal_id,
       CASE p.grantee WHEN 0 THEN 'public' ELSE pg_get_userbyid(p.grantee)::text END
           AS grantee_name,
       p.grantor AS grantor_principal_id,
       p.permission AS permission_name,
       p.state,
       CASE p.state WHEN 'G' THEN 'GRANT' WHEN 'W' THEN 'GRANT_WITH_GRANT_OPTION'
                    ELSE 'DENY' END AS state_desc
  FROM permissions p;

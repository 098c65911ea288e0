-- CREATE / ALTER / DROP ROUTE, the broker's identity (ALTER DATABASE ... SET ENABLE_BROKER and
-- friends) and the route matching of spec 21.2.

-- The schema this broker is installed in (views cannot capture it themselves).
CREATE OR REPLACE FUNCTION broker_schema() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT current_schema()::text
$$;

-- An address a route may hold: 'LOCAL', 'TRANSPORT', a PostgreSQL URI (its query may name the
-- far broker's schema with broker_schema=...) or an Airflow connection id ('airflow://conn').
CREATE OR REPLACE FUNCTION check_route_address(p_route text, p_clause text, p_address text)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF p_address IS NULL OR btrim(p_address) = '' THEN
        PERFORM raise_error(9659, p_clause, p_route);
    END IF;
    IF length(p_address) > 256 THEN
        PERFORM raise_error(9660, p_clause, p_route, '256');
    END IF;
    IF upper(p_address) IN ('LOCAL', 'TRANSPORT') THEN
        RETURN upper(p_address);
    END IF;
    -- URI characters only: no quotes, backslashes, semicolons or white space.
    IF p_address !~* '^(postgresql|postgres)://[A-Za-z0-9._~:/?#@!$&()*+,=%\[\]-]*$'
       AND p_address !~* '^airflow://[A-Za-z0-9_.-]+$' THEN
        PERFORM raise_error(9744, p_clause, p_route, left(p_address, 80));
    END IF;
    RETURN p_address;
END
$$;

-- The rules of CREATE and ALTER ROUTE on a route's final settings.
CREATE OR REPLACE FUNCTION check_route(r route_defs) RETURNS route_defs
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    r.address := check_route_address(r.name, 'ADDRESS', r.address);
    IF r.mirror_address IS NOT NULL THEN
        r.mirror_address := check_route_address(r.name, 'MIRROR_ADDRESS', r.mirror_address);
        IF r.remote_service_name IS NULL OR r.broker_instance IS NULL THEN
            PERFORM raise_error(9661, r.name);
        END IF;
        IF r.address IN ('LOCAL', 'TRANSPORT') OR r.mirror_address IN ('LOCAL', 'TRANSPORT') THEN
            PERFORM raise_error(9743, 'MIRROR_ADDRESS', r.name);
        END IF;
        IF r.mirror_address = r.address THEN
            PERFORM raise_error(9747, r.name);
        END IF;
    END IF;
    IF r.broker_instance IS NOT NULL AND r.remote_service_name IS NULL THEN
        PERFORM raise_error(9662, r.name);
    END IF;
    IF r.address = 'TRANSPORT' AND r.remote_service_name IS NOT NULL THEN
        PERFORM raise_error(9745, r.name);
    END IF;
    IF r.remote_service_name IS NOT NULL THEN
        PERFORM check_name(r.remote_service_name, 256);
    END IF;
    IF length(r.broker_instance) > 128 THEN
        PERFORM raise_error(8413, left(r.broker_instance, 40));
    END IF;
    RETURN r;
END
$$;

CREATE OR REPLACE FUNCTION route_lifetime(p_route text, p_seconds integer) RETURNS timestamp
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF p_seconds IS NULL THEN
        RETURN NULL;
    END IF;
    IF p_seconds NOT BETWEEN 1 AND 2147483647 THEN
        PERFORM raise_error(9746, p_route, '1', '2147483647');
    END IF;
    RETURN utc_now() + make_interval(secs => p_seconds);
END
$$;

CREATE OR REPLACE FUNCTION create_route(p_name text, p_address text,
                                        p_service_name text DEFAULT NULL,
                                        p_broker_instance text DEFAULT NULL,
                                        p_lifetime integer DEFAULT NULL,
                                        p_mirror_address text DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r route_defs;
BEGIN
    -- Routes are the schema owner's alone (docs/security.md): an address may carry
    -- credentials, and a route decides where every matching conversation's messages go.
    PERFORM require_broker_owner('CREATE ROUTE');
    PERFORM check_name(p_name);
    IF EXISTS (SELECT 1 FROM route_defs WHERE name = p_name) THEN
        PERFORM raise_error(2714, p_name);
    END IF;
    r.name := p_name;
    r.address := p_address;
    r.remote_service_name := p_service_name;
    r.broker_instance := lower(p_broker_instance);
    r.mirror_address := p_mirror_address;
    r := check_route(r);
    INSERT INTO route_defs (name, remote_service_name, broker_instance, lifetime, address,
                            mirror_address, created_at)
    VALUES (r.name, r.remote_service_name, r.broker_instance,
            route_lifetime(p_name, p_lifetime), r.address, r.mirror_address, utc_now())
    RETURNING route_id INTO r.route_id;
    -- Messages that waited for a route are tried again now.
    UPDATE transmissions SET next_attempt_at = utc_now() WHERE transmission_status <> '';
    RETURN r.route_id;
END
$$;

-- Settings left NULL keep their value; an empty string removes SERVICE_NAME, BROKER_INSTANCE or
-- MIRROR_ADDRESS. A new LIFETIME counts from now, which also revives an expired route.
CREATE OR REPLACE FUNCTION alter_route(p_name text, p_address text DEFAULT NULL,
                                       p_service_name text DEFAULT NULL,
                                       p_broker_instance text DEFAULT NULL,
                                       p_lifetime integer DEFAULT NULL,
                                       p_mirror_address text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r route_defs;
BEGIN
    SELECT * INTO r FROM route_defs WHERE name = p_name AND is_broker_owner() FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'route', coalesce(p_name, 'NULL'));
    END IF;
    r.address := coalesce(p_address, r.address);
    r.remote_service_name := CASE WHEN p_service_name IS NULL THEN r.remote_service_name
                                  ELSE nullif(p_service_name, '') END;
    r.broker_instance := CASE WHEN p_broker_instance IS NULL THEN r.broker_instance
                              ELSE lower(nullif(p_broker_instance, '')) END;
    r.mirror_address := CASE WHEN p_mirror_address IS NULL THEN r.mirror_address
                             ELSE nullif(p_mirror_address, '') END;
    IF p_lifetime IS NOT NULL THEN
        r.lifetime := route_lifetime(p_name, p_lifetime);
    END IF;
    r := check_route(r);
    UPDATE route_defs
       SET remote_service_name = r.remote_service_name, broker_instance = r.broker_instance,
           lifetime = r.lifetime, address = r.address, mirror_address = r.mirror_address
     WHERE route_id = r.route_id;
    UPDATE transmissions SET next_attempt_at = utc_now() WHERE transmission_status <> '';
END
$$;

CREATE OR REPLACE FUNCTION drop_route(p_name text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM route_defs WHERE name = p_name AND is_broker_owner();
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'route', coalesce(p_name, 'NULL'));
    END IF;
END
$$;

-- Where a message for p_service (of the conversation pinned to, or addressed to,
-- p_broker_instance) goes: 'LOCAL', an address, or NULL when no route matches (the message
-- waits; spec 21.2). Service names match byte for byte. A generic plan: the check for a
-- local service was planned anew on every call.
CREATE OR REPLACE FUNCTION route_address(p_service text, p_broker_instance text)
RETURNS text LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now timestamp := utc_now();
    v_self text := (SELECT service_broker_guid::text FROM broker_identity);
    v_instance text := lower(p_broker_instance);
    v_candidates text[];
    v_address text;
BEGIN
    IF v_instance = v_self THEN
        -- Addressed to this very broker ('CURRENT DATABASE' or its own guid).
        RETURN 'LOCAL';
    END IF;
    -- The steps of spec 21.2 in one statement: the candidates of the first step that has any.
    WITH matching AS (
        SELECT r.address, r.route_id,
               CASE WHEN r.remote_service_name IS NULL THEN 4
                    WHEN r.broker_instance = v_instance THEN 1
                    WHEN r.broker_instance IS NULL THEN 2
                    WHEN v_instance IS NULL THEN 3 END AS step
          FROM route_defs r
         WHERE (r.remote_service_name = p_service
                OR (r.remote_service_name IS NULL AND r.broker_instance IS NULL))
           AND (r.lifetime IS NULL OR r.lifetime > v_now)
           -- A route to this broker cannot reach a conversation pinned to another one.
           AND NOT (r.address = 'LOCAL' AND v_instance IS NOT NULL)
    )
    SELECT array_agg(m.address ORDER BY m.route_id) INTO v_candidates
      FROM matching m
     WHERE m.step = (SELECT min(step) FROM matching);
    IF v_candidates IS NULL THEN
        RETURN NULL;
    END IF;
    -- LOCAL when the service is here, then explicit addresses, then TRANSPORT (whose address
    -- is the service name itself), then a LOCAL route to a service that does not exist here.
    IF 'LOCAL' = ANY (v_candidates)
       AND EXISTS (SELECT 1 FROM service_defs WHERE name = p_service) THEN
        RETURN 'LOCAL';
    END IF;
    SELECT a INTO v_address FROM unnest(v_candidates) a
     WHERE a NOT IN ('LOCAL', 'TRANSPORT') LIMIT 1;
    IF v_address IS NOT NULL THEN
        RETURN v_address;
    END IF;
    IF 'TRANSPORT' = ANY (v_candidates)
       AND p_service ~* '^((postgresql|postgres)://[A-Za-z0-9._~:/?#@!$&()*+,=%\[\]-]*|airflow://[A-Za-z0-9_.-]+)$' THEN
        RETURN p_service;
    END IF;
    IF 'LOCAL' = ANY (v_candidates) THEN
        RETURN 'LOCAL';
    END IF;
    RETURN NULL;
END
$$;

-- SEND asks route_address() itself (deliver, 30_send.sql), which like every broker function
-- runs with the owner's rights: senders need no right to read route_defs, whose addresses may
-- carry passwords. The SQL wrapper that did this was planned again on every first message.
DROP FUNCTION IF EXISTS route_kind(text, text);

-- The text of transmission_status when no route matches (9750).
CREATE OR REPLACE FUNCTION no_route_status(p_service text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('No route matches the destination service name ''%s''. Create a route for '
                  'it (routes are matched byte for byte), or check the route''s lifetime.',
                  p_service)
$$;

-- This broker's instance (sys.databases.service_broker_guid), which BEGIN DIALOG can name.
CREATE OR REPLACE FUNCTION broker_instance() RETURNS uuid
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT service_broker_guid FROM broker_identity
$$;

-- ALTER DATABASE ... SET ENABLE_BROKER | DISABLE_BROKER | NEW_BROKER |
-- ERROR_BROKER_CONVERSATIONS (spec 21.1); returns the broker instance afterwards.
CREATE OR REPLACE FUNCTION alter_broker(p_option text) RETURNS uuid
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_option text := upper(btrim(p_option));
    v_guid uuid;
BEGIN
    IF NOT is_broker_owner() THEN
        PERFORM raise_error(5011, current_database());
    END IF;
    IF v_option IS NULL OR v_option NOT IN ('ENABLE_BROKER', 'DISABLE_BROKER', 'NEW_BROKER',
                                            'ERROR_BROKER_CONVERSATIONS') THEN
        PERFORM raise_error(50106, quote_literal(coalesce(left(p_option, 40), 'NULL')),
                            'the broker option',
                            'ENABLE_BROKER, DISABLE_BROKER, NEW_BROKER or ERROR_BROKER_CONVERSATIONS');
    END IF;
    IF v_option IN ('NEW_BROKER', 'ERROR_BROKER_CONVERSATIONS') THEN
        PERFORM error_all_conversations();
    END IF;
    UPDATE broker_identity
       SET is_broker_enabled = v_option <> 'DISABLE_BROKER',
           service_broker_guid = CASE WHEN v_option = 'NEW_BROKER' THEN gen_random_uuid()
                                      ELSE service_broker_guid END,
           changed_at = utc_now()
    RETURNING service_broker_guid INTO v_guid;
    IF v_option <> 'DISABLE_BROKER' THEN
        -- What waited while delivery was off goes now.
        UPDATE transmissions SET next_attempt_at = utc_now();
        PERFORM pg_notify(current_schema() || '_transmit', '');
    END IF;
    RETURN v_guid;
END
$$;

-- Every conversation of this broker fails as after a restore: Error -9719 on each endpoint
-- here, -9720 told to each remote peer; what still waited to be sent is dropped.
CREATE OR REPLACE FUNCTION error_all_conversations() RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    e record;
    v_count integer := 0;
BEGIN
    FOR e IN
        SELECT ce.*, s.name AS service_name FROM endpoints ce JOIN service_defs s USING (service_id)
         WHERE ce.state NOT IN ('CD', 'ER')
         ORDER BY ce.conversation_handle
           FOR NO KEY UPDATE OF ce
    LOOP
        DELETE FROM transmissions WHERE conversation_handle = e.conversation_handle;
        IF e.is_remote THEN
            -- An unsequenced broker Error for the peer (sequence -1).
            PERFORM hold_for_transmission(
                e.conversation_handle, e.far_service, e.service_name, e.service_contract_id,
                -1, 1, error_body(-9720, 'The database for the remote conversation endpoint '
                                         'is attached or restored.'),
                e.priority, '');
        END IF;
        IF e.state = 'DO' AND e.is_remote THEN
            -- Ended here already: it closes once the peer has the notice.
            NULL;
        ELSIF e.state = 'DO' THEN
            PERFORM close_endpoint(e.conversation_handle);
        ELSE
            PERFORM deliver_error(e.conversation_handle, -9719,
                                  'The database for this conversation endpoint is attached or '
                                  'restored.');
        END IF;
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

-- CREATE / ALTER / DROP SERVICE (spec 4).

CREATE OR REPLACE FUNCTION resolve_contracts(p_contracts text[]) RETURNS integer[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_ids integer[] := '{}';
    v_name text;
    v_id integer;
    v_owner oid;
BEGIN
    SELECT t INTO v_name FROM unnest(p_contracts) t GROUP BY t HAVING count(*) > 1 LIMIT 1;
    IF v_name IS NOT NULL THEN
        PERFORM raise_error(8404, v_name);
    END IF;
    FOREACH v_name IN ARRAY coalesce(p_contracts, '{}') LOOP
        SELECT service_contract_id, principal_id INTO v_id, v_owner
          FROM contracts WHERE name = v_name;
        IF v_id IS NULL THEN
            PERFORM raise_error(8425, coalesce(v_name, 'NULL'));
        END IF;
        PERFORM require_references(16::smallint, v_id, v_owner, v_name);
        v_ids := v_ids || v_id;
    END LOOP;
    RETURN v_ids;
END
$$;

CREATE OR REPLACE FUNCTION create_service(p_name text, p_queue text,
                                          p_contracts text[] DEFAULT '{}')
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    q queues;
    v_contract_ids integer[];
    v_id integer;
BEGIN
    PERFORM require_create('CREATE SERVICE');
    PERFORM check_name(p_name, 256);
    q := existing_queue(p_queue);
    PERFORM require_references(1::smallint, q.object_id, q.principal_id, q.name);
    v_contract_ids := resolve_contracts(p_contracts);
    IF EXISTS (SELECT 1 FROM service_defs WHERE name = p_name) THEN
        PERFORM raise_error(2714, p_name);
    END IF;
    INSERT INTO service_defs (name, service_queue_id, created_at, principal_id)
    VALUES (p_name, q.object_id, utc_now(), creation_owner())
    RETURNING service_id INTO v_id;
    INSERT INTO service_def_contracts (service_id, service_contract_id)
    SELECT v_id, unnest(v_contract_ids);
    RETURN v_id;
END
$$;

-- ON QUEUE moves the service's queued messages to the new queue; existing conversations on a
-- dropped contract go on (spec 4, remarks text).
CREATE OR REPLACE FUNCTION alter_service(p_name text, p_queue text DEFAULT NULL,
                                         p_add_contracts text[] DEFAULT '{}',
                                         p_drop_contracts text[] DEFAULT '{}')
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s service_defs;
    q queues;
    v_add integer[];
    v_drop integer[];
    v_name text;
BEGIN
    SELECT * INTO s FROM service_defs WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'service', p_name);
    END IF;
    PERFORM require_on_object('ALTER', 17::smallint, s.service_id, s.principal_id, 'service',
                              p_name);
    IF s.is_system THEN
        PERFORM raise_error(15247, p_name, 'service');
    END IF;
    IF p_queue IS NULL AND coalesce(cardinality(p_add_contracts), 0) = 0
       AND coalesce(cardinality(p_drop_contracts), 0) = 0 THEN
        PERFORM raise_error(8493, p_name);
    END IF;
    SELECT t INTO v_name
      FROM unnest(coalesce(p_add_contracts, '{}') || coalesce(p_drop_contracts, '{}')) t
     GROUP BY t HAVING count(*) > 1 LIMIT 1;
    IF v_name IS NOT NULL THEN
        PERFORM raise_error(8404, v_name);
    END IF;
    v_add := resolve_contracts(p_add_contracts);
    v_drop := resolve_contracts(p_drop_contracts);
    SELECT c.name INTO v_name FROM contracts c
     WHERE c.service_contract_id = ANY (v_add)
       AND EXISTS (SELECT 1 FROM service_def_contracts u
                    WHERE u.service_id = s.service_id
                      AND u.service_contract_id = c.service_contract_id)
     LIMIT 1;
    IF v_name IS NOT NULL THEN
        PERFORM raise_error(8404, v_name);
    END IF;
    SELECT c.name INTO v_name FROM contracts c
     WHERE c.service_contract_id = ANY (v_drop)
       AND NOT EXISTS (SELECT 1 FROM service_def_contracts u
                        WHERE u.service_id = s.service_id
                          AND u.service_contract_id = c.service_contract_id)
     LIMIT 1;
    IF v_name IS NOT NULL THEN
        PERFORM raise_error(15151, 'contract of service ' || p_name, v_name);
    END IF;
    IF p_queue IS NOT NULL THEN
        q := existing_queue(p_queue);
        PERFORM require_references(1::smallint, q.object_id, q.principal_id, q.name);
        UPDATE service_defs SET service_queue_id = q.object_id WHERE service_id = s.service_id;
        UPDATE queue_messages SET queue_id = q.object_id
         WHERE service_id = s.service_id AND queue_id <> q.object_id;
        PERFORM wake_waiters(q.object_id);
    END IF;
    INSERT INTO service_def_contracts (service_id, service_contract_id)
    SELECT s.service_id, unnest(v_add);
    DELETE FROM service_def_contracts
     WHERE service_id = s.service_id AND service_contract_id = ANY (v_drop);
END
$$;

CREATE OR REPLACE FUNCTION drop_service(p_name text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s service_defs;
BEGIN
    SELECT * INTO s FROM service_defs WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'service', p_name);
    END IF;
    PERFORM require_on_object('CONTROL', 17::smallint, s.service_id, s.principal_id, 'service',
                              p_name);
    IF s.is_system THEN
        PERFORM raise_error(15247, p_name, 'service');
    END IF;
    IF EXISTS (SELECT 1 FROM endpoints WHERE service_id = s.service_id) THEN
        PERFORM raise_error(3729, 'SERVICE', p_name, 'open conversations of', p_name);
    END IF;
    DELETE FROM queue_messages WHERE service_id = s.service_id;
    DELETE FROM dialog_groups WHERE service_id = s.service_id;
    DELETE FROM service_defs WHERE service_id = s.service_id;
END
$$;

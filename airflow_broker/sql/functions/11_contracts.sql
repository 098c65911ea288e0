-- CREATE / DROP CONTRACT (spec 3). Contracts cannot be altered, as in SQL Server.

CREATE OR REPLACE FUNCTION create_contract(p_name text, p_message_types text[], p_sent_by text[])
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id integer;
    v_type text;
    v_dir text;
    v_type_id integer;
    v_initiator_can_send boolean := false;
    v_type_owner oid;
BEGIN
    PERFORM require_create('CREATE CONTRACT');
    PERFORM check_name(p_name);
    IF p_message_types IS NULL OR p_sent_by IS NULL OR cardinality(p_message_types) = 0
       OR cardinality(p_message_types) <> cardinality(p_sent_by) THEN
        PERFORM raise_error(50106, coalesce(cardinality(p_message_types), 0)::text,
                            'the message types of a contract',
                            'one SENT BY { INITIATOR | TARGET | ANY } for each message type');
    END IF;
    IF EXISTS (SELECT 1 FROM contracts WHERE name = p_name) THEN
        PERFORM raise_error(2714, p_name);
    END IF;
    SELECT t INTO v_type FROM unnest(p_message_types) t GROUP BY t HAVING count(*) > 1 LIMIT 1;
    IF v_type IS NOT NULL THEN
        PERFORM raise_error(8403, v_type);
    END IF;
    FOR i IN 1 .. cardinality(p_sent_by) LOOP
        v_dir := upper(coalesce(p_sent_by[i], ''));
        IF v_dir NOT IN ('INITIATOR', 'TARGET', 'ANY') THEN
            PERFORM raise_error(102, coalesce(p_sent_by[i], 'NULL'));
        END IF;
        v_initiator_can_send := v_initiator_can_send OR v_dir IN ('INITIATOR', 'ANY');
    END LOOP;
    IF NOT v_initiator_can_send THEN
        PERFORM raise_error(8492, p_name);
    END IF;

    INSERT INTO contracts (name, created_at, principal_id)
    VALUES (p_name, utc_now(), creation_owner())
    RETURNING service_contract_id INTO v_id;
    FOR i IN 1 .. cardinality(p_message_types) LOOP
        v_type := p_message_types[i];
        SELECT message_type_id, principal_id INTO v_type_id, v_type_owner
          FROM message_types WHERE name = v_type;
        IF v_type_id IS NULL THEN
            PERFORM raise_error(8428, coalesce(v_type, 'NULL'));
        END IF;
        PERFORM require_references(15::smallint, v_type_id, v_type_owner, v_type);
        v_dir := upper(p_sent_by[i]);
        INSERT INTO contract_message_usages
            (service_contract_id, message_type_id, is_sent_by_initiator, is_sent_by_target)
        VALUES (v_id, v_type_id, v_dir IN ('INITIATOR', 'ANY'), v_dir IN ('TARGET', 'ANY'));
    END LOOP;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION drop_contract(p_name text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c contracts;
    v_service text;
BEGIN
    SELECT * INTO c FROM contracts WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'contract', p_name);
    END IF;
    PERFORM require_on_object('CONTROL', 16::smallint, c.service_contract_id, c.principal_id,
                              'contract', p_name);
    IF c.is_system THEN
        PERFORM raise_error(15247, p_name, 'contract');
    END IF;
    SELECT s.name INTO v_service
      FROM service_def_contracts u JOIN service_defs s USING (service_id)
     WHERE u.service_contract_id = c.service_contract_id
     ORDER BY s.name LIMIT 1;
    IF v_service IS NOT NULL THEN
        PERFORM raise_error(3729, 'CONTRACT', p_name, 'service', v_service);
    END IF;
    IF EXISTS (SELECT 1 FROM endpoints
                WHERE service_contract_id = c.service_contract_id) THEN
        PERFORM raise_error(3729, 'CONTRACT', p_name, 'open conversations on', p_name);
    END IF;
    DELETE FROM contracts WHERE service_contract_id = c.service_contract_id;
END
$$;

-- CREATE / ALTER / DROP MESSAGE TYPE and XML SCHEMA COLLECTION (spec 2).

CREATE OR REPLACE FUNCTION create_xml_schema_collection(p_name text, p_schemas text[])
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id integer;
BEGIN
    -- XML schema collections are the schema owner's alone (docs/security.md).
    PERFORM require_broker_owner('CREATE XML SCHEMA COLLECTION');
    PERFORM check_name(p_name);
    IF p_schemas IS NULL OR cardinality(p_schemas) = 0 THEN
        PERFORM raise_error(50106, 'NULL', 'the schemas of an XML schema collection',
                            'at least one XSD document');
    END IF;
    IF EXISTS (SELECT 1 FROM xml_schema_collections WHERE name = p_name) THEN
        PERFORM raise_error(2714, p_name);
    END IF;
    INSERT INTO xml_schema_collections (name, schemas, created_at)
    VALUES (p_name, p_schemas, utc_now())
    RETURNING xml_collection_id INTO v_id;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION drop_xml_schema_collection(p_name text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id integer;
    v_user text;
BEGIN
    SELECT xml_collection_id INTO v_id FROM xml_schema_collections
     WHERE name = p_name AND is_broker_owner();
    IF v_id IS NULL THEN
        PERFORM raise_error(15151, 'XML schema collection', p_name);
    END IF;
    SELECT name INTO v_user FROM message_types WHERE xml_collection_id = v_id LIMIT 1;
    IF v_user IS NOT NULL THEN
        PERFORM raise_error(3729, 'XML SCHEMA COLLECTION', p_name, 'message type', v_user);
    END IF;
    DELETE FROM xml_schema_collections WHERE xml_collection_id = v_id;
END
$$;

-- Resolves VALIDATION = ... to (kind, collection id); raises on anything else.
CREATE OR REPLACE FUNCTION resolve_validation(p_validation text, p_collection text,
                                              OUT kind text, OUT collection_id integer)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    kind := upper(coalesce(p_validation, 'NONE'));
    IF kind NOT IN ('NONE', 'EMPTY', 'WELL_FORMED_XML', 'VALID_XML') THEN
        PERFORM raise_error(102, p_validation);
    END IF;
    IF kind = 'VALID_XML' THEN
        IF p_collection IS NULL THEN
            PERFORM raise_error(50106, 'NULL', 'VALID_XML WITH SCHEMA COLLECTION',
                                'the name of an XML schema collection');
        END IF;
        -- SQL Server asks REFERENCES on the collection; collections are the schema owner's
        -- alone here, so to anyone else one is as missing as a collection that does not exist.
        SELECT xml_collection_id INTO collection_id
          FROM xml_schema_collections WHERE name = p_collection AND is_broker_owner();
        IF collection_id IS NULL THEN
            PERFORM raise_error(15151, 'XML schema collection', p_collection);
        END IF;
    ELSIF p_collection IS NOT NULL THEN
        PERFORM raise_error(102, 'SCHEMA COLLECTION');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION create_message_type(p_name text, p_validation text DEFAULT 'NONE',
                                               p_schema_collection text DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_id integer;
    v_kind text;
    v_collection integer;
BEGIN
    PERFORM require_create('CREATE MESSAGE TYPE');
    PERFORM check_name(p_name);
    SELECT kind, collection_id INTO v_kind, v_collection
      FROM resolve_validation(p_validation, p_schema_collection);
    IF EXISTS (SELECT 1 FROM message_types WHERE name = p_name) THEN
        PERFORM raise_error(2714, p_name);
    END IF;
    INSERT INTO message_types (name, validation_kind, xml_collection_id, created_at,
                               principal_id)
    VALUES (p_name, v_kind, v_collection, utc_now(), creation_owner())
    RETURNING message_type_id INTO v_id;
    RETURN v_id;
END
$$;

-- Changes only the validation; messages already queued are not validated again.
CREATE OR REPLACE FUNCTION alter_message_type(p_name text, p_validation text,
                                              p_schema_collection text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    mt message_types;
    v_kind text;
    v_collection integer;
BEGIN
    SELECT * INTO mt FROM message_types WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'message type', p_name);
    END IF;
    PERFORM require_on_object('ALTER', 15::smallint, mt.message_type_id, mt.principal_id,
                              'message type', p_name);
    IF mt.is_system THEN
        PERFORM raise_error(15247, p_name, 'message type');
    END IF;
    SELECT kind, collection_id INTO v_kind, v_collection
      FROM resolve_validation(p_validation, p_schema_collection);
    UPDATE message_types SET validation_kind = v_kind, xml_collection_id = v_collection
     WHERE message_type_id = mt.message_type_id;
END
$$;

CREATE OR REPLACE FUNCTION drop_message_type(p_name text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    mt message_types;
    v_contract text;
BEGIN
    SELECT * INTO mt FROM message_types WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM raise_error(15151, 'message type', p_name);
    END IF;
    PERFORM require_on_object('CONTROL', 15::smallint, mt.message_type_id, mt.principal_id,
                              'message type', p_name);
    IF mt.is_system THEN
        PERFORM raise_error(15247, p_name, 'message type');
    END IF;
    SELECT c.name INTO v_contract
      FROM contract_message_usages u JOIN contracts c USING (service_contract_id)
     WHERE u.message_type_id = mt.message_type_id
     ORDER BY c.name LIMIT 1;
    IF v_contract IS NOT NULL THEN
        PERFORM raise_error(3729, 'MESSAGE TYPE', p_name, 'contract', v_contract);
    END IF;
    DELETE FROM message_types WHERE message_type_id = mt.message_type_id;
END
$$;

-- What SEND in Python needs to validate a body of a message type: its validation and, for
-- VALID_XML, the XSD documents of its collection. Only for a type the login may see or could
-- send (may_see_message_type); any other is answered as one that does not exist: no row.
CREATE OR REPLACE FUNCTION message_type_validation(p_name text)
RETURNS TABLE (validation_kind text, xml_collection_id integer, schemas text[])
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT t.validation_kind, t.xml_collection_id, c.schemas
      FROM message_types t
      LEFT JOIN xml_schema_collections c USING (xml_collection_id)
     WHERE t.name = p_name AND may_see_message_type(t)
$$;

-- XML bodies that wait for the broker worker's validation: their verdict came from a sender
-- the broker does not trust (anyone but the schema's owner) and this PostgreSQL cannot check
-- it (VALID_XML, UTF-16, or a server without XML support). SEND holds them in the
-- transmission queue (awaiting_validation); the worker validates each with lxml, as the target
-- would, and releases it or refuses it with the Error the target would send.

CREATE OR REPLACE FUNCTION validation_pending_status(p_message_type text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('Waiting for the broker worker to validate the body of this ''%s'' '
                  'message: its sender is not trusted to have validated it.', p_message_type)
$$;

-- The worker's verdict on a held message: NULL releases it (delivery takes it from here),
-- an error refuses it as the target would: Error -9615 to the sender, which ends its side,
-- and nothing from this message on is delivered.
CREATE OR REPLACE FUNCTION settle_validation(p_transmission_id bigint, p_error text)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    t record;
BEGIN
    SELECT h.conversation_handle, h.message_sequence_number, m.name AS type_name INTO t
      FROM transmissions h JOIN message_types m USING (message_type_id)
     WHERE h.transmission_id = p_transmission_id AND h.awaiting_validation;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_error IS NULL THEN
        UPDATE transmissions
           SET awaiting_validation = false, transmission_status = '', next_attempt_at = utc_now()
         WHERE transmission_id = p_transmission_id;
        UPDATE transmissions SET transmission_status = '', next_attempt_at = utc_now()
         WHERE conversation_handle = t.conversation_handle
           AND message_sequence_number > t.message_sequence_number
           AND NOT awaiting_validation;
        PERFORM pg_notify(current_schema() || '_transmit', '');
        RETURN;
    END IF;
    DELETE FROM transmissions
     WHERE conversation_handle = t.conversation_handle
       AND message_sequence_number >= t.message_sequence_number;
    PERFORM deliver_error(t.conversation_handle, -9615,
        format('A message of type ''%s'' failed XML validation on the target service. %s',
               t.type_name, p_error));
END
$$;

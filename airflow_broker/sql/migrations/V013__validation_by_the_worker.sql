-- XML bodies whose verdict came from a sender the broker does not trust wait in the
-- transmission queue until the broker worker has validated them (32_validation.sql).
ALTER TABLE transmissions ADD COLUMN awaiting_validation boolean NOT NULL DEFAULT false;
CREATE INDEX transmissions_awaiting_validation ON transmissions (transmission_id)
    WHERE awaiting_validation;

-- body_rejection() tells SEND about such bodies in a new OUT column: a new result type.
DROP FUNCTION IF EXISTS body_rejection(message_types, bytea, text, text);
-- Arguments V012's functions had and never used.
DROP FUNCTION IF EXISTS change_permission(text, text, text, text, boolean, boolean);
DROP FUNCTION IF EXISTS creation_owner(text);

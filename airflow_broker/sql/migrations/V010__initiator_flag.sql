-- When an initiator first sent a message after message 0 was acknowledged: every such
-- transmission carries the flag that starts the target's 30 minutes of replay protection
-- (spec 15.1, 21.4). It is kept on the initiator's own row, which its SEND writes anyway: SEND
-- never writes the peer's row (a target busy in a long transaction would block the initiator),
-- so the target's security_timestamp is derived from it until the target sets its own.
ALTER TABLE endpoints ADD COLUMN flag_sent_at timestamp;

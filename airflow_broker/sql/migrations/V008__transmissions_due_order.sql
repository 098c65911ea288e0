-- The transport walks what is due in (next_attempt_at, transmission_id) order and resumes after
-- the last conversation it took, so that a step reads about as many rows as it sends. With only
-- next_attempt_at indexed it grouped every due row by conversation on each step: 80 ms per step
-- behind 200,000 messages of one conversation, for 1,000 of them sent.
CREATE INDEX transmissions_due_order ON transmissions (next_attempt_at, transmission_id);
DROP INDEX transmissions_due;

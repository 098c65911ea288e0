-- A receiving transaction's records are plain rows: a second RECEIVE of the same transaction,
-- or a record sent again after its connection was lost, adds a row of its own instead of
-- merging its ids into the first, since the merge's speculative insertion was a tenth of a
-- record's cost to the server. The resolver counts each transaction once, in the order of
-- its first row, with the messages of all its rows; it reads a queue's rows through this
-- index.
ALTER TABLE receive_log DROP CONSTRAINT receive_log_queue_id_xid_key;
CREATE INDEX receive_log_by_transaction ON receive_log (queue_id, xid);

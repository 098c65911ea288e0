-- Messages that arrived from another broker ahead of their turn (status 2). Releasing them, and
-- recognising a repeated early arrival, looks them up by conversation and sequence number;
-- without this index every arrival read all of its conversation's rows.
CREATE INDEX queue_messages_held ON queue_messages (conversation_handle, message_sequence_number)
    WHERE status = 2;

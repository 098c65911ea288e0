-- The floors: the least any design that keeps Service Broker's dialog state writes for a
-- step, in as few statements as PostgreSQL allows, on the broker's own tables and without any
-- of its checks (permissions, states, contracts, validation, routes, the transmission queue,
-- poison detection, wake-ups); and, in the blocks ending in _checked, the same steps with
-- everything the broker keeps for them (below, before send_checked). Scenarios f, c and h and bench.dialog_cost run them beside the
-- broker's statements: what they reach against the bare INSERT and pgmq is the most any SEND,
-- RECEIVE or dialog could reach on the machine. Blocks headed "-- name --", as in
-- airflow_broker/sql/queries.
--
-- A block whose name starts with _ is a part of statements, written once because several
-- statements hold it (an unchecked floor and its checked variant, or checks every statement of
-- a kind makes): a statement names it as {_name}, or {_name(argument, ...)} with the arguments
-- put in for {0}, {1}, ...; bench.ops.floors() puts it in place, its lines after the first
-- indented as the line that names it, so the statements sent are as if written out.

-- _message_columns --
-- The columns a message is stored with, in the order the broker's INSERTs name them.
(queue_id, priority, conversation_group_id,
                                   conversation_handle, message_sequence_number, precedence,
                                   service_id, service_contract_id, message_type_id,
                                   message_body, message_id, enqueued_at)

-- _allowed --
-- The caller may act on object {1} of class {0} ({2}, or CONTROL): a member of the schema's
-- owner, or of a grantee of a permission not denied. Arguments: class, object, permission.
(pg_has_role(session_user, (SELECT nspowner FROM pg_namespace
                                 WHERE nspname = 'broker'), 'MEMBER')
     OR EXISTS (SELECT 1 FROM broker.permissions p
                 WHERE p.class = {0} AND p.major_id = {1}
                   AND p.permission IN ({2}, 'CONTROL') AND p.state <> 'D'
                   AND pg_has_role(session_user, p.grantee, 'MEMBER')))

-- _may_begin --
-- BEGIN DIALOG's rights: RECEIVE on the queue of the initiating service i, REFERENCES on the
-- contract c.
{_allowed(1, i.service_queue_id, 'RECEIVE')}
AND {_allowed(16, c.service_contract_id, 'REFERENCES')}

-- _new_dialog --
-- A new dialog's ids and what BEGIN DIALOG finds by name (the columns of dialog_begin's
-- new).
SELECT i.service_id AS initiator_id, t.service_id AS target_id,
       t.service_queue_id AS target_queue, c.service_contract_id, mt.message_type_id,
       gen_random_uuid() AS initiator_handle, gen_random_uuid() AS target_handle,
       gen_random_uuid() AS initiator_group, gen_random_uuid() AS target_group,
       gen_random_uuid() AS conversation_id,
       now() AT TIME ZONE 'UTC' AS now

-- _dialog_begin_sides --
-- What a dialog begun with its request delivered writes besides the message: both
-- conversation groups and both endpoints CONVERSING, as CTEs after new.
groups AS (
    INSERT INTO broker.dialog_groups (conversation_group_id, service_id)
    SELECT initiator_group, initiator_id FROM new
    UNION ALL SELECT target_group, target_id FROM new
), sides AS (
    INSERT INTO broker.endpoints {_endpoint_columns}
    SELECT initiator_handle, conversation_id, true, service_contract_id, initiator_group,
           initiator_id, target_handle, %(target)s, now + interval '2147483647 seconds', 'CO',
           now, 1
      FROM new
    UNION ALL
    SELECT target_handle, conversation_id, false, service_contract_id, target_group,
           target_id, initiator_handle, %(initiator)s, now + interval '2147483647 seconds',
           'CO', now, 0
      FROM new
)

-- _message0 --
-- Message 0 of a dialog begun, on the target's queue.
INSERT INTO broker.queue_messages {_message_columns}
SELECT target_queue, 5, target_group, target_handle, 0, 2, target_id, service_contract_id,
       message_type_id, %(body)s, gen_random_uuid(), now
  FROM new

-- _wake --
-- WAITFOR's wake-up, as the broker's wake_waiters(): a NOTIFY on the channel of each queue
-- of CTE {0} (its queue_id column) that a reader waits on, and none for a queue no reader waits
-- on.
SELECT pg_notify('broker_queue_' || w.queue_id, '')
  FROM (SELECT DISTINCT queue_id FROM {0}) w
 WHERE EXISTS (SELECT 1 FROM broker.queue_waiters qw WHERE qw.queue_id = w.queue_id)

-- _endpoint_columns --
-- The columns an endpoint with its far handle is created with.
(conversation_handle, conversation_id, is_initiator,
                              service_contract_id, conversation_group_id, service_id,
                              far_handle, far_service, lifetime, state, created_at,
                              send_sequence)

-- _initiator_may_send --
-- The contract {0} is one target service t accepts, and it lets the initiator send message
-- type mt.
EXISTS (SELECT 1 FROM broker.service_def_contracts u
             WHERE u.service_id = t.service_id
               AND u.service_contract_id = {0})
AND EXISTS (SELECT 1 FROM broker.contract_message_usages u
             WHERE u.service_contract_id = {0}
               AND u.message_type_id = mt.message_type_id AND u.is_sent_by_initiator)

-- _receive_taking --
-- RECEIVE's choice, as CTEs: the first conversation group among the first ready messages
-- (the window) of queue {0} that no other transaction holds, locked, and its first n messages
-- in conversation order, as CTE {1}.
taken_group AS (
    SELECT g.conversation_group_id
      FROM (SELECT m.conversation_group_id, m.priority, m.queuing_order
              FROM broker.queue_messages m
             WHERE m.queue_id = {0}
               AND m.status = 1
             ORDER BY m.priority DESC, m.queuing_order
             LIMIT %(window)s) m
      JOIN broker.dialog_groups g ON g.conversation_group_id = m.conversation_group_id
     ORDER BY m.priority DESC, m.queuing_order
     LIMIT 1
       FOR NO KEY UPDATE OF g SKIP LOCKED
), {1} AS (
    SELECT m.queuing_order
      FROM broker.queue_messages m
     WHERE m.conversation_group_id = (SELECT conversation_group_id FROM taken_group)
       AND m.status = 1
     ORDER BY m.conversation_handle, m.precedence, m.message_sequence_number
     LIMIT %(top)s
)

-- _side_may_send --
-- The message type mt is one the contract of endpoint ce lets its side send.
EXISTS (SELECT 1 FROM broker.contract_message_usages u
         WHERE u.service_contract_id = ce.service_contract_id
           AND u.message_type_id = mt.message_type_id
           AND CASE WHEN ce.is_initiator THEN u.is_sent_by_initiator
                    ELSE u.is_sent_by_target END)

-- _reply_checks --
-- What the target's reply is checked for (ce its endpoint, os its service, mt the message
-- type): the endpoint CONVERSING with nothing in the transmission queue, the message type
-- one without validation (a body another type must be validated) that the contract lets this
-- side send, the body within the largest message size, and the caller allowed to RECEIVE on
-- its queue.
WHERE ce.conversation_handle = %(handle)s AND ce.state = 'CO'
  AND NOT EXISTS (SELECT 1 FROM broker.transmissions t
                   WHERE t.conversation_handle = ce.conversation_handle)
  AND os.service_id = ce.service_id
  AND mt.name = %(message_type)s AND mt.validation_kind = 'NONE'
  AND octet_length(%(body)s::bytea) <= 2147483647
  AND {_side_may_send}
  AND {_allowed(1, os.service_queue_id, 'RECEIVE')}

-- _peer_ended --
-- The initiator's endpoint marked as ended by its peer (DISCONNECTED_INBOUND), its queue
-- enabled, as CTE peer; its RETURNING list goes on where this is named.
peer AS (
    UPDATE broker.endpoints p SET state = 'DI'
      FROM own, broker.service_defs ps, broker.queues pq
     WHERE p.conversation_handle = own.far_handle AND p.state IN ('SI', 'CO')
       AND ps.service_id = p.service_id AND pq.object_id = ps.service_queue_id
       AND pq.is_enqueue_enabled
    RETURNING p.conversation_handle, p.conversation_group_id, p.service_id, own.sequence,

-- send --
-- SEND of one message on an open local conversation: the sender's endpoint locked and its
-- sequence number advanced, the peer's queue found, the message stored with the indexes
-- RECEIVE reads it by.
WITH sender AS (
    UPDATE broker.endpoints SET send_sequence = send_sequence + 1
     WHERE conversation_handle = %(handle)s
    RETURNING far_handle, send_sequence - 1 AS sequence, service_contract_id, priority
)
INSERT INTO broker.queue_messages {_message_columns}
SELECT s.service_queue_id, sender.priority, peer.conversation_group_id,
       peer.conversation_handle, sender.sequence, 2, peer.service_id,
       sender.service_contract_id, t.message_type_id, %(body)s, gen_random_uuid(),
       now() AT TIME ZONE 'UTC'
  FROM sender
  JOIN broker.endpoints peer ON peer.conversation_handle = sender.far_handle
  JOIN broker.service_defs s ON s.service_id = peer.service_id
  JOIN broker.message_types t ON t.name = %(message_type)s

-- dialog_begin --
-- BEGIN DIALOG and SEND of the request, delivered at once: both endpoints with their own
-- conversation groups, and message 0 on the target's queue.
WITH new AS (
    {_new_dialog}
      FROM broker.service_defs i, broker.service_defs t, broker.contracts c,
           broker.message_types mt
     WHERE i.name = %(initiator)s AND t.name = %(target)s AND c.name = %(contract)s
       AND mt.name = %(message_type)s
), {_dialog_begin_sides}
{_message0}

-- receive --
-- RECEIVE TOP(n): the first conversation group among the queue's first ready messages (the
-- window) that no other transaction holds, locked, and its first n messages in conversation
-- order taken (n NULL: all of them). Run without sequential scans, as the broker's RECEIVE.
WITH {_receive_taking((SELECT object_id FROM broker.queues WHERE name = %(queue)s), taken)}
DELETE FROM broker.queue_messages m
 USING taken
 WHERE m.queuing_order = taken.queuing_order
RETURNING m.conversation_handle, m.message_type_id, m.message_body, m.message_id,
          pg_current_xact_id()::text

-- receive_record --
-- Poison detection's record of a receiving transaction: the least it writes, one row, on a
-- connection of its own in autocommit, so that the record outlives the transaction's rollback
-- and its process's death (what the broker's register_receive() writes, without its check of
-- the reader's permission and its lock). Prepared on the side connection and sent with its
-- values in text, as the broker's: queue id, xid, message ids, backend pid.
INSERT INTO broker.receive_log (queue_id, xid, message_ids, backend_pid, received_at)
VALUES ($1::integer, $2::xid8, $3::uuid[], $4::integer, now() AT TIME ZONE 'UTC')

-- dialog_reply_and_end --
-- The target's SEND of the reply and its END CONVERSATION: its endpoint numbered and closed,
-- the initiator's marked as ended by its peer, the reply and the EndDialog on the initiator's
-- queue.
WITH own AS (
    UPDATE broker.endpoints
       SET send_sequence = send_sequence + 2, end_dialog_sequence = send_sequence + 1,
           state = 'CD'
     WHERE conversation_handle = %(handle)s
    RETURNING far_handle, send_sequence - 2 AS sequence, service_contract_id, priority
), peer AS (
    UPDATE broker.endpoints p SET state = 'DI'
      FROM own
     WHERE p.conversation_handle = own.far_handle
    RETURNING p.conversation_handle, p.conversation_group_id, p.service_id, own.sequence,
              own.service_contract_id, own.priority
)
INSERT INTO broker.queue_messages {_message_columns}
SELECT s.service_queue_id, peer.priority, peer.conversation_group_id, peer.conversation_handle,
       peer.sequence + x.n, 2, peer.service_id, peer.service_contract_id, x.type_id, x.body,
       gen_random_uuid(), now() AT TIME ZONE 'UTC'
  FROM peer
  JOIN broker.service_defs s ON s.service_id = peer.service_id
 CROSS JOIN (VALUES (0, (SELECT message_type_id FROM broker.message_types
                          WHERE name = %(message_type)s), %(body)s::bytea),
                    (1, 2, NULL::bytea)) AS x(n, type_id, body)

-- dialog_end --
-- The initiator's END CONVERSATION after the target's EndDialog: its endpoint and its
-- conversation group removed.
WITH gone AS (
    DELETE FROM broker.endpoints WHERE conversation_handle = %(handle)s
    RETURNING conversation_group_id
)
DELETE FROM broker.dialog_groups g
 USING gone
 WHERE g.conversation_group_id = gone.conversation_group_id

-- send_batch --
-- send_many of a batch of messages on an open local conversation: as "send", with the messages
-- stored by one INSERT.
WITH sender AS (
    UPDATE broker.endpoints SET send_sequence = send_sequence + %(count)s
     WHERE conversation_handle = %(handle)s
    RETURNING far_handle, send_sequence - %(count)s AS first, service_contract_id, priority
)
INSERT INTO broker.queue_messages {_message_columns}
SELECT s.service_queue_id, sender.priority, peer.conversation_group_id,
       peer.conversation_handle, sender.first + b.ord - 1, 2, peer.service_id,
       sender.service_contract_id, t.message_type_id, b.body, gen_random_uuid(),
       now() AT TIME ZONE 'UTC'
  FROM sender
  JOIN broker.endpoints peer ON peer.conversation_handle = sender.far_handle
  JOIN broker.service_defs s ON s.service_id = peer.service_id
  JOIN broker.message_types t ON t.name = %(message_type)s
 CROSS JOIN unnest(%(bodies)s::bytea[]) WITH ORDINALITY AS b(body, ord)

-- send_batch_remote --
-- send_many of a batch of messages on a conversation with a service of another broker: the
-- sender's endpoint numbered and the messages stored in the transmission queue, due at once.
-- A SEND cannot write into another database in its own transaction; what it sends there must
-- be kept here until the far broker has it.
WITH sender AS (
    UPDATE broker.endpoints SET send_sequence = send_sequence + %(count)s
     WHERE conversation_handle = %(handle)s
    RETURNING conversation_handle, service_id, far_service, service_contract_id, priority,
              send_sequence - %(count)s AS first
)
INSERT INTO broker.transmissions (conversation_handle, to_service_name, from_service_name,
                                  service_contract_name, enqueue_time,
                                  message_sequence_number, message_type_id, message_body,
                                  priority, message_id, next_attempt_at)
SELECT sender.conversation_handle, sender.far_service, s.name, c.name,
       now() AT TIME ZONE 'UTC', sender.first + b.ord - 1, t.message_type_id, b.body,
       sender.priority, gen_random_uuid(), now() AT TIME ZONE 'UTC'
  FROM sender
  JOIN broker.service_defs s ON s.service_id = sender.service_id
  JOIN broker.contracts c ON c.service_contract_id = sender.service_contract_id
  JOIN broker.message_types t ON t.name = %(message_type)s
 CROSS JOIN unnest(%(bodies)s::bytea[]) WITH ORDINALITY AS b(body, ord)

-- transmit_take --
-- The transport's read in the sending broker: a batch of the messages due, in the order they
-- became due, with what the far broker finds their endpoint by.
SELECT t.transmission_id, ce.conversation_id, ce.is_initiator, t.message_sequence_number,
       mt.name, t.message_body
  FROM broker.transmissions t
  JOIN broker.endpoints ce ON ce.conversation_handle = t.conversation_handle
  JOIN broker.message_types mt ON mt.message_type_id = t.message_type_id
 WHERE t.next_attempt_at <= now() AT TIME ZONE 'UTC'
 ORDER BY t.next_attempt_at, t.transmission_id
 LIMIT %(limit)s

-- transmit_accept --
-- The transport's write in the receiving broker, one transaction: each conversation's
-- endpoint locked and its next expected sequence number advanced, and the messages it had not
-- yet received stored on its queue (a batch sent again after a lost acknowledgement adds
-- nothing).
WITH arrived AS (
    SELECT * FROM unnest(%(conversation_ids)s::uuid[], %(from_initiator)s::boolean[],
                         %(seqs)s::bigint[], %(types)s::text[], %(bodies)s::bytea[])
                  AS a(conversation_id, from_initiator, seq, type_name, body)
), receiver AS (
    SELECT e.conversation_handle, e.conversation_id, e.is_initiator, e.conversation_group_id,
           e.service_id, e.service_contract_id, e.priority, e.inbound_sequence, a.last
      FROM (SELECT conversation_id, from_initiator, max(seq) AS last
              FROM arrived GROUP BY conversation_id, from_initiator) a
      JOIN broker.endpoints e ON e.conversation_id = a.conversation_id
                             AND e.is_initiator = NOT a.from_initiator
       FOR NO KEY UPDATE OF e
), advanced AS (
    UPDATE broker.endpoints e SET inbound_sequence = r.last + 1
      FROM receiver r
     WHERE e.conversation_handle = r.conversation_handle AND r.inbound_sequence <= r.last
)
INSERT INTO broker.queue_messages {_message_columns}
SELECT s.service_queue_id, r.priority, r.conversation_group_id, r.conversation_handle, a.seq,
       2, r.service_id, r.service_contract_id, t.message_type_id, a.body, gen_random_uuid(),
       now() AT TIME ZONE 'UTC'
  FROM arrived a
  JOIN receiver r ON r.conversation_id = a.conversation_id
                 AND r.is_initiator = NOT a.from_initiator
  JOIN broker.service_defs s ON s.service_id = r.service_id
  JOIN broker.message_types t ON t.name = a.type_name
 WHERE a.seq >= r.inbound_sequence

-- transmit_acknowledged --
-- The transport's last write in the sending broker, after the far broker's commit: what
-- arrived there leaves the transmission queue.
DELETE FROM broker.transmissions WHERE transmission_id = ANY (%(ids)s::bigint[])

-- The complete checked floors: each step of the local common case with everything the
-- broker's own statement keeps for it, in as few statements as it allows. Service Broker's
-- checks (the services, the contract and the direction of the message type, the endpoints'
-- states, the queues enabled, the caller's permission), validation's type check (a type
-- without validation, as the common case's), the largest message size, WAITFOR's wake-up, the
-- counter the queue monitor reads, the attempts and the names RECEIVE returns, and poison
-- detection's record with its check of the reader. Left out: replay protection's timestamps,
-- the retention and transmission-queue paths (the statements find no row there and the broker
-- goes its general way), and the ordering lock of the broker's record (docs/performance.md).

-- send_checked --
-- SEND of one message on an open local conversation, with its checks: the sender's endpoint
-- CONVERSING and its conversation group locked, the message type one without validation that
-- the contract lets this side send, the caller allowed to RECEIVE on the sending service's
-- queue (Service Broker's rule), that queue without retention, nothing of the conversation in
-- the transmission queue, the broker enabled, the peer open on an enabled queue; the message
-- stored and WAITFOR woken.
WITH sender AS (
    SELECT ce.conversation_handle, ce.far_handle, ce.send_sequence, ce.service_contract_id,
           ce.priority, mt.message_type_id
      FROM broker.endpoints ce
      JOIN broker.dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
      JOIN broker.service_defs os ON os.service_id = ce.service_id
      JOIN broker.queues oq ON oq.object_id = os.service_queue_id
      JOIN broker.message_types mt ON mt.name = %(message_type)s
     WHERE ce.conversation_handle = %(handle)s AND ce.state = 'CO' AND NOT ce.is_remote
       AND NOT oq.is_retention_enabled AND mt.validation_kind = 'NONE'
       AND octet_length(%(body)s::bytea) <= 2147483647
       AND {_side_may_send}
       AND {_allowed(1, os.service_queue_id, 'RECEIVE')}
       FOR NO KEY UPDATE OF ce, g
), peer AS (
    SELECT p.conversation_handle, p.conversation_group_id, p.service_id, ps.service_queue_id
      FROM sender
      JOIN broker.endpoints p ON p.conversation_handle = sender.far_handle
      JOIN broker.service_defs ps ON ps.service_id = p.service_id
      JOIN broker.queues pq ON pq.object_id = ps.service_queue_id
     WHERE p.state NOT IN ('DO', 'CD') AND pq.is_enqueue_enabled
       AND (SELECT is_broker_enabled FROM broker.broker_identity)
       AND NOT EXISTS (SELECT 1 FROM broker.transmissions t
                        WHERE t.conversation_handle = sender.conversation_handle)
), stored AS (
    INSERT INTO broker.queue_messages {_message_columns}
    SELECT peer.service_queue_id, sender.priority, peer.conversation_group_id,
           peer.conversation_handle, sender.send_sequence, 2, peer.service_id,
           sender.service_contract_id, sender.message_type_id, %(body)s, gen_random_uuid(),
           now() AT TIME ZONE 'UTC'
      FROM sender, peer
    RETURNING queue_id
), numbered AS (
    UPDATE broker.endpoints ce SET send_sequence = sender.send_sequence + 1
      FROM sender
     WHERE ce.conversation_handle = sender.conversation_handle
       AND EXISTS (SELECT 1 FROM stored)
)
{_wake(stored)}

-- dialog_begin_checked --
WITH new AS (
    {_new_dialog}
      FROM broker.service_defs i, broker.service_defs t, broker.contracts c,
           broker.message_types mt, broker.queues tq
     WHERE i.name = %(initiator)s AND t.name = %(target)s AND c.name = %(contract)s
       AND mt.name = %(message_type)s AND mt.validation_kind = 'NONE'
       AND tq.object_id = t.service_queue_id AND tq.is_enqueue_enabled
       AND {_initiator_may_send(c.service_contract_id)}
       AND octet_length(%(body)s::bytea) <= 2147483647
       AND {_may_begin}
       AND {_allowed(17, t.service_id, 'SEND')}
), {_dialog_begin_sides}, stored AS (
    {_message0}
    RETURNING queue_id
)
{_wake(stored)}

-- receive_checked --
-- RECEIVE with its checks: the queue one its name finds, enabled, without retention, that the
-- caller may read, in READ COMMITTED; the RECEIVE counted for the queue monitor; each message
-- with its names, its validation and its attempts.
WITH q AS (
    SELECT q.object_id, q.receive_counter FROM broker.queues q
     WHERE q.name = %(queue)s AND q.is_receive_enabled AND NOT q.is_retention_enabled
       AND current_setting('transaction_isolation') IN ('read committed',
                                                        'read uncommitted')
       AND {_allowed(1, q.object_id, 'RECEIVE')}
), {_receive_taking((SELECT object_id FROM q), picked)}, taken AS (
    DELETE FROM broker.queue_messages m
     USING picked
     WHERE m.queuing_order = picked.queuing_order
    RETURNING m.*
), counted AS (
    SELECT nextval(q.receive_counter) FROM q WHERE EXISTS (SELECT 1 FROM taken)
)
SELECT t.conversation_handle, t.message_type_id, t.message_body, t.message_id,
       pg_current_xact_id()::text, t.conversation_group_id, t.message_sequence_number,
       s.name, c.name, mt.name,
       CASE mt.validation_kind WHEN 'NONE' THEN 'N' WHEN 'EMPTY' THEN 'E' ELSE 'X' END,
       t.priority, t.queuing_order, coalesce(a.attempts, 0)
  FROM taken t
 CROSS JOIN counted
  JOIN broker.service_defs s ON s.service_id = t.service_id
  JOIN broker.contracts c ON c.service_contract_id = t.service_contract_id
  JOIN broker.message_types mt ON mt.message_type_id = t.message_type_id
  LEFT JOIN broker.message_attempts a ON a.message_id = t.message_id
 ORDER BY t.conversation_handle, t.precedence, t.message_sequence_number

-- receive_record_checked --
-- Poison detection's record with its check: only a reader of the queue records receives of
-- it (a forged record could disable the queue), in the same INSERT.
INSERT INTO broker.receive_log (queue_id, xid, message_ids, backend_pid, received_at)
SELECT q.object_id, $2::xid8, $3::uuid[], $4::integer, now() AT TIME ZONE 'UTC'
  FROM broker.queues q
 WHERE q.object_id = $1::integer AND {_allowed(1, q.object_id, 'RECEIVE')}

-- dialog_reply_and_end_checked --
WITH own AS (
    UPDATE broker.endpoints ce
       SET send_sequence = send_sequence + 2, end_dialog_sequence = send_sequence + 1,
           state = 'CD'
      FROM broker.service_defs os, broker.message_types mt
     {_reply_checks}
    RETURNING ce.far_handle, ce.send_sequence - 2 AS sequence, ce.service_contract_id,
              ce.priority, mt.message_type_id
), {_peer_ended}
              own.service_contract_id, own.priority, own.message_type_id,
              ps.service_queue_id
), stored AS (
    INSERT INTO broker.queue_messages {_message_columns}
    SELECT peer.service_queue_id, peer.priority, peer.conversation_group_id,
           peer.conversation_handle, peer.sequence + x.n, 2, peer.service_id,
           peer.service_contract_id, coalesce(x.type_id, peer.message_type_id), x.body,
           gen_random_uuid(), now() AT TIME ZONE 'UTC'
      FROM peer
     CROSS JOIN (VALUES (0, NULL::integer, %(body)s::bytea), (1, 2, NULL::bytea))
                AS x(n, type_id, body)
    RETURNING queue_id
)
{_wake(stored)}

-- dialog_end_checked --
WITH gone AS (
    DELETE FROM broker.endpoints ce
     USING broker.service_defs os
     WHERE ce.conversation_handle = %(handle)s AND ce.state = 'DI' AND ce.is_initiator
       AND os.service_id = ce.service_id
       AND NOT EXISTS (SELECT 1 FROM broker.queue_messages m
                        WHERE m.conversation_handle = ce.conversation_handle)
       AND NOT EXISTS (SELECT 1 FROM broker.transmissions t
                        WHERE t.conversation_handle = ce.conversation_handle)
       AND {_allowed(1, os.service_queue_id, 'RECEIVE')}
    RETURNING ce.conversation_group_id
)
DELETE FROM broker.dialog_groups g
 USING gone
 WHERE g.conversation_group_id = gone.conversation_group_id
   AND NOT EXISTS (SELECT 1 FROM broker.endpoints o
                    WHERE o.conversation_group_id = gone.conversation_group_id
                      AND o.conversation_handle <> %(handle)s)

-- dialog_reply_checked --
-- The target's SEND of the reply alone, with its checks, as a statement of its own: Service
-- Broker's SEND and END CONVERSATION are two statements, and a transaction that is not
-- pipelined sends them one after the other.
WITH own AS (
    UPDATE broker.endpoints ce
       SET send_sequence = send_sequence + 1
      FROM broker.service_defs os, broker.message_types mt
     {_reply_checks}
    RETURNING ce.far_handle, ce.send_sequence - 1 AS sequence, ce.service_contract_id,
              ce.priority, mt.message_type_id
), stored AS (
    INSERT INTO broker.queue_messages {_message_columns}
    SELECT ps.service_queue_id, own.priority, p.conversation_group_id, p.conversation_handle,
           own.sequence, 2, p.service_id, own.service_contract_id, own.message_type_id,
           %(body)s, gen_random_uuid(), now() AT TIME ZONE 'UTC'
      FROM own
      JOIN broker.endpoints p ON p.conversation_handle = own.far_handle
                             AND p.state NOT IN ('DO', 'CD')
      JOIN broker.service_defs ps ON ps.service_id = p.service_id
      JOIN broker.queues pq ON pq.object_id = ps.service_queue_id AND pq.is_enqueue_enabled
    RETURNING queue_id
)
{_wake(stored)}

-- dialog_end_target_checked --
-- The target's END CONVERSATION after its reply, with its checks, as a statement of its own:
-- its endpoint numbered and closed, the initiator's marked as ended by its peer, the EndDialog
-- on the initiator's queue.
WITH own AS (
    UPDATE broker.endpoints ce
       SET send_sequence = send_sequence + 1, end_dialog_sequence = send_sequence,
           state = 'CD'
      FROM broker.service_defs os
     WHERE ce.conversation_handle = %(handle)s AND ce.state = 'CO'
       AND NOT EXISTS (SELECT 1 FROM broker.transmissions t
                        WHERE t.conversation_handle = ce.conversation_handle)
       AND os.service_id = ce.service_id
       AND {_allowed(1, os.service_queue_id, 'RECEIVE')}
    RETURNING ce.far_handle, ce.send_sequence - 1 AS sequence, ce.service_contract_id,
              ce.priority
), {_peer_ended}
              own.service_contract_id, own.priority, ps.service_queue_id
), stored AS (
    INSERT INTO broker.queue_messages {_message_columns}
    SELECT service_queue_id, priority, conversation_group_id, conversation_handle, sequence,
           2, service_id, service_contract_id, 2, NULL, gen_random_uuid(),
           now() AT TIME ZONE 'UTC'
      FROM peer
    RETURNING queue_id
)
{_wake(stored)}

-- begin_dialog_checked --
-- BEGIN DIALOG alone, with its checks, as a statement of its own (SEND is another): the
-- caller's rights, the initiator's endpoint, STARTED_OUTBOUND, in a conversation group of its
-- own.
WITH new AS (
    SELECT i.service_id, c.service_contract_id, now() AT TIME ZONE 'UTC' AS now
      FROM broker.service_defs i, broker.contracts c
     WHERE i.name = %(initiator)s AND c.name = %(contract)s
       AND {_may_begin}
), grouped AS (
    INSERT INTO broker.dialog_groups (conversation_group_id, service_id)
    SELECT %(group)s, service_id FROM new
)
INSERT INTO broker.endpoints (conversation_handle, conversation_id, is_initiator,
                              service_contract_id, conversation_group_id, service_id,
                              far_service, lifetime, state, created_at, send_sequence)
SELECT %(handle)s, gen_random_uuid(), true, service_contract_id, %(group)s, service_id,
       %(target)s, now + interval '2147483647 seconds', 'SO', now, 0
  FROM new

-- send_first_checked --
-- SEND of message 0, with its checks, as a statement of its own: the target service found by
-- name, its queue enabled, the contract its own, the message type the initiator's to send and
-- the sender allowed to send to it; the target's endpoint created in a group of its own, the
-- message stored on its queue and the initiator's endpoint opened and numbered.
WITH own AS (
    SELECT ce.conversation_handle, ce.conversation_id, ce.service_contract_id, ce.service_id,
           t.service_id AS target_id, t.service_queue_id AS target_queue, mt.message_type_id,
           gen_random_uuid() AS target_handle, gen_random_uuid() AS target_group,
           now() AT TIME ZONE 'UTC' AS now
      FROM broker.endpoints ce
      JOIN broker.service_defs t ON t.name = ce.far_service
      JOIN broker.queues tq ON tq.object_id = t.service_queue_id AND tq.is_enqueue_enabled
      JOIN broker.message_types mt ON mt.name = %(message_type)s
                                  AND mt.validation_kind = 'NONE'
     WHERE ce.conversation_handle = %(handle)s AND ce.state = 'SO'
       AND octet_length(%(body)s::bytea) <= 2147483647
       AND {_initiator_may_send(ce.service_contract_id)}
       AND {_allowed(17, t.service_id, 'SEND')}
       FOR NO KEY UPDATE OF ce
), opened AS (
    UPDATE broker.endpoints ce
       SET state = 'CO', send_sequence = 1, far_handle = own.target_handle
      FROM own
     WHERE ce.conversation_handle = own.conversation_handle
), grouped AS (
    INSERT INTO broker.dialog_groups (conversation_group_id, service_id)
    SELECT target_group, target_id FROM own
), target AS (
    INSERT INTO broker.endpoints {_endpoint_columns}
    SELECT target_handle, conversation_id, false, service_contract_id, target_group,
           target_id, conversation_handle, %(initiator)s,
           now + interval '2147483647 seconds', 'CO', now, 0
      FROM own
), stored AS (
    INSERT INTO broker.queue_messages {_message_columns}
    SELECT target_queue, 5, target_group, target_handle, 0, 2, target_id,
           service_contract_id, message_type_id, %(body)s, gen_random_uuid(), now
      FROM own
    RETURNING queue_id
)
{_wake(stored)}

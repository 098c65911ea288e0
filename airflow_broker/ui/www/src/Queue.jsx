import { Badge, Box, Button, Code, Heading, HStack, Input, Link, Stack, Table, Text } from "@chakra-ui/react";
import { useState } from "react";
import { Link as RouterLink } from "react-router-dom";

import { getJson, postJson, queuePath } from "./api";
import { when } from "./format";
import { Problem } from "./Problem";
import { useAction } from "./useAction";
import { usePolling } from "./usePolling";

// ALTER QUEUE ... WITH ACTIVATION for an operator whose login may ALTER the queue: on / off,
// and MAX_QUEUE_READERS; the broker checks the values and says why it refuses.
function Activation({ name, activation, canAlter, done }) {
  const [readers, setReaders] = useState("");
  const { busy, error, run } = useAction();
  if (!activation) return null;
  const change = (body) => run(true, async () => {
    await postJson(`${queuePath(name)}/activation`, body);
    setReaders("");
    await done();
  });
  return (
    <Box data-testid="queue-activation">
      <Text>
        Activation <Badge colorPalette={activation.enabled ? "green" : "gray"}
                          data-testid="activation-state">{activation.enabled ? "on" : "off"}</Badge>
        {activation.procedure ? <> procedure <Code>{activation.procedure}</Code></> : " (no procedure)"}
        , at most <span data-testid="activation-max-readers">{activation.max_queue_readers}</span> reader(s)
        {activation.execute_as ? `, as ${activation.execute_as}` : ""}
      </Text>
      {canAlter && (
        <HStack mt={1}>
          <Button size="xs" variant="outline" loading={busy} data-testid="activation-toggle"
                  onClick={() => change({ enabled: !activation.enabled })}>
            {activation.enabled ? "Turn activation off" : "Turn activation on"}
          </Button>
          <Input size="xs" w="28" type="number" placeholder="MAX_QUEUE_READERS" value={readers}
                 onChange={(e) => setReaders(e.target.value)} data-testid="activation-readers" />
          <Button size="xs" variant="outline" loading={busy} disabled={readers === ""}
                  data-testid="activation-readers-set"
                  onClick={() => change({ max_queue_readers: Number(readers) })}>Set</Button>
        </HStack>
      )}
      <Problem error={error} />
    </Box>
  );
}

export function Queue({ name }) {
  const { data, error, refresh } = usePolling(() => getJson(queuePath(name)), [name]);
  return (
    <Box data-testid="broker-queue">
      <Heading size="lg" mb={1}>Queue {name}</Heading>
      <Problem error={error} />
      {data && (
        <Stack gap={3}>
          <Text data-testid="queue-summary">
            {data.enabled ? "Enabled" : `Disabled (${data.disabled_reason || "?"}) since ${when(data.disabled_at)}`}
            {data.poison_reason ? `: ${data.poison_reason}` : ""}; {data.depth} message(s) ready
            {data.truncated ? " (showing the first ones)" : ""}
          </Text>
          <Activation name={name} activation={data.activation} done={refresh}
                      canAlter={data.permissions.enable_disable_queue && data.may_alter} />
          {data.groups.length === 0 && <Text data-testid="no-messages">No messages waiting.</Text>}
          {data.groups.map((g) => (
            <Box key={g.conversation_group_id} borderWidth="1px" borderRadius="md" p={2}
                 data-testid="conversation-group">
              <Text fontSize="sm" fontWeight="semibold">
                Conversation group <Code>{g.conversation_group_id}</Code>
              </Text>
              <Table.Root size="sm" mt={1}>
                <Table.Header>
                  <Table.Row>
                    <Table.ColumnHeader>#</Table.ColumnHeader>
                    <Table.ColumnHeader>Type</Table.ColumnHeader>
                    <Table.ColumnHeader>Enqueued</Table.ColumnHeader>
                    <Table.ColumnHeader>Body</Table.ColumnHeader>
                  </Table.Row>
                </Table.Header>
                <Table.Body>
                  {g.messages.map((m) => (
                    <Table.Row key={m.message_id} data-testid="message-row">
                      <Table.Cell>{m.message_sequence_number}</Table.Cell>
                      <Table.Cell>{m.message_type_name}</Table.Cell>
                      <Table.Cell>{when(m.enqueued_at)}</Table.Cell>
                      <Table.Cell data-testid="message-body">
                        {m.body_masked ? <Badge>hidden</Badge> : <Code>{m.body}</Code>}
                      </Table.Cell>
                    </Table.Row>
                  ))}
                </Table.Body>
              </Table.Root>
            </Box>
          ))}
          <ReaderRuns runs={data.reader_runs} />
          <Activations activations={data.activations} />
        </Stack>
      )}
    </Box>
  );
}

// Airflow's own route of a task instance: its page, on the try that ran the readers.
function taskInstancePath(ti) {
  const base = `/dags/${encodeURIComponent(ti.dag_id)}/runs/${encodeURIComponent(ti.run_id)}` +
    `/tasks/${encodeURIComponent(ti.task_id)}`;
  return `${base}${ti.map_index >= 0 ? `/mapped/${ti.map_index}` : ""}?try_number=${ti.try_number}`;
}

function ReaderRuns({ runs }) {
  return (
    <Box>
      <Heading size="md" mb={1}>Reader runs</Heading>
      {runs.length === 0 ? <Text data-testid="no-reader-runs">No reader run has read this queue.</Text> : (
        <Table.Root size="sm">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Started</Table.ColumnHeader>
              <Table.ColumnHeader>Ended</Table.ColumnHeader>
              <Table.ColumnHeader>Task instance</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Readers</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Received</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Processed</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Quarantined</Table.ColumnHeader>
              <Table.ColumnHeader>Failed readers</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {runs.map((r) => (
              <Table.Row key={r.run_id} data-testid="reader-run">
                <Table.Cell>{when(r.started_at)}</Table.Cell>
                <Table.Cell>{r.ended_at ? when(r.ended_at) : <Badge colorPalette="blue">running</Badge>}</Table.Cell>
                <Table.Cell>
                  {r.task_instance ? (
                    <Link asChild colorPalette="blue" data-testid="reader-run-task">
                      <RouterLink to={taskInstancePath(r.task_instance)}>
                        {r.task_instance.dag_id} / {r.task_instance.task_id}, try {r.task_instance.try_number}
                      </RouterLink>
                    </Link>
                  ) : <Text color="fg.muted">not started by Airflow</Text>}
                </Table.Cell>
                <Table.Cell textAlign="end">{r.readers ?? ""}</Table.Cell>
                <Table.Cell textAlign="end">{r.received ?? 0}</Table.Cell>
                <Table.Cell textAlign="end">{r.processed ?? 0}</Table.Cell>
                <Table.Cell textAlign="end">{r.quarantined ?? 0}</Table.Cell>
                <Table.Cell>{r.failed_readers.length ? r.failed_readers.join(", ") : ""}</Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
    </Box>
  );
}

function Activations({ activations }) {
  if (activations.length === 0) return null;
  return (
    <Box>
      <Heading size="md" mb={1}>Activations</Heading>
      <Table.Root size="sm">
        <Table.Header>
          <Table.Row>
            <Table.ColumnHeader>Started</Table.ColumnHeader>
            <Table.ColumnHeader>Procedure</Table.ColumnHeader>
            <Table.ColumnHeader>As</Table.ColumnHeader>
            <Table.ColumnHeader>Outcome</Table.ColumnHeader>
            <Table.ColumnHeader textAlign="end">Received</Table.ColumnHeader>
            <Table.ColumnHeader textAlign="end">Rollbacks</Table.ColumnHeader>
            <Table.ColumnHeader>Exception</Table.ColumnHeader>
          </Table.Row>
        </Table.Header>
        <Table.Body>
          {activations.map((a) => (
            <Table.Row key={a.task_id} data-testid="activation">
              <Table.Cell>{when(a.started_at)}</Table.Cell>
              <Table.Cell><Code>{a.procedure}</Code></Table.Cell>
              <Table.Cell>{a.execute_as || ""}</Table.Cell>
              <Table.Cell>{a.ended_at ? a.outcome : <Badge colorPalette="blue">running</Badge>}</Table.Cell>
              <Table.Cell textAlign="end">{a.messages_received ?? ""}</Table.Cell>
              <Table.Cell textAlign="end">{a.rollbacks ?? ""}</Table.Cell>
              <Table.Cell>{a.exception || ""}</Table.Cell>
            </Table.Row>
          ))}
        </Table.Body>
      </Table.Root>
    </Box>
  );
}

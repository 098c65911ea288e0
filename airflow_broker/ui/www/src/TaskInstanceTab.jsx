// The "Broker" tab of a task instance's page: the broker fields Airflow rendered for it, the
// conversations they and its messages name (as the UI's login may see them), and what it
// received through the Airflow inbox (of the queues the login may RECEIVE from).
import { Badge, Box, Code, Heading, Table, Text } from "@chakra-ui/react";

import { getJson } from "./api";
import { QueueLink } from "./DagTab";
import { when } from "./format";
import { Problem } from "./Problem";
import { usePolling } from "./usePolling";

const show = (value) => (typeof value === "string" ? value : JSON.stringify(value));

export function TaskInstanceTab({ dagId, runId, taskId, mapIndex }) {
  const query = new URLSearchParams({ run_id: runId, task_id: taskId,
    map_index: mapIndex ?? "-1" });
  const { data, error } = usePolling(
    () => getJson(`dags/${encodeURIComponent(dagId)}/task-instance?${query}`),
    [dagId, runId, taskId, mapIndex]);
  const fields = data ? Object.entries(data.fields) : [];

  return (
    <Box p={2} data-testid="broker-ti-tab">
      <Problem error={error} />
      {data && !data.is_broker_task && data.inbox.length === 0 && (
        <Text mb={3} data-testid="not-a-broker-task">This is not a task of the broker's.</Text>
      )}
      <Heading size="md" mb={2}>Broker fields</Heading>
      {data && !data.rendered && (
        <Text mb={3} data-testid="not-rendered">Nothing rendered yet: the task has not run.</Text>
      )}
      {fields.length > 0 && (
        <Table.Root size="sm" variant="outline" mb={4} data-testid="ti-fields">
          <Table.Body>
            {fields.map(([name, value]) => (
              <Table.Row key={name} data-testid={`ti-field-${name}`}>
                <Table.Cell width="xs"><Code>{name}</Code></Table.Cell>
                <Table.Cell>
                  {name === "queue_name" && typeof value === "string"
                    ? <QueueLink name={value} /> : show(value)}
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
      <Heading size="md" mb={2}>Conversations</Heading>
      {data && data.conversations.length === 0 && (
        <Text mb={3} data-testid="no-ti-conversations">None that the UI's login may see.</Text>
      )}
      {data && data.conversations.length > 0 && (
        <Table.Root size="sm" variant="outline" mb={4} data-testid="ti-conversations">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Handle</Table.ColumnHeader>
              <Table.ColumnHeader>Service</Table.ColumnHeader>
              <Table.ColumnHeader>Far service</Table.ColumnHeader>
              <Table.ColumnHeader>State</Table.ColumnHeader>
              <Table.ColumnHeader>Created</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.conversations.map((c) => (
              <Table.Row key={c.conversation_handle} data-testid="ti-conversation"
                         data-state={c.state}>
                <Table.Cell><Code fontSize="xs">{c.conversation_handle}</Code></Table.Cell>
                <Table.Cell>{c.service_name} ({c.is_initiator ? "initiator" : "target"})</Table.Cell>
                <Table.Cell>{c.far_service}</Table.Cell>
                <Table.Cell>
                  <Badge colorPalette={c.state === "ER" ? "red" : c.state === "CD" ? "gray"
                    : "green"}>{c.state_desc}</Badge>
                  {c.is_leaked && <Badge colorPalette="orange" ml={1}>leaked</Badge>}
                </Table.Cell>
                <Table.Cell>{when(c.created_at)}</Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
      <Heading size="md" mb={2}>Received through the Airflow inbox</Heading>
      {data && data.inbox.length === 0 && (
        <Text data-testid="no-inbox">No message that the UI's login may read.</Text>
      )}
      {data && data.inbox.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="ti-inbox">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Queue</Table.ColumnHeader>
              <Table.ColumnHeader>Message type</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Seq.</Table.ColumnHeader>
              <Table.ColumnHeader>Inbox state</Table.ColumnHeader>
              <Table.ColumnHeader>Received</Table.ColumnHeader>
              <Table.ColumnHeader>Body</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.inbox.map((m) => (
              <Table.Row key={m.inbox_id} data-testid="ti-inbox-message" data-state={m.state}>
                <Table.Cell><QueueLink name={m.queue_name} /></Table.Cell>
                <Table.Cell>{m.message_type_name}</Table.Cell>
                <Table.Cell textAlign="end">{m.message_sequence_number}</Table.Cell>
                <Table.Cell>
                  <Badge colorPalette={m.state === "rejected" ? "red" : "blue"}>{m.state}</Badge>
                </Table.Cell>
                <Table.Cell>{when(m.claimed_at)}</Table.Cell>
                <Table.Cell>
                  {m.body_masked
                    ? <Text color="fg.muted" data-testid="body-masked">hidden</Text>
                    : <Code fontSize="xs" whiteSpace="pre-wrap">{m.body ?? ""}</Code>}
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
      {data && data.truncated && <Text fontSize="sm" mt={2}>Only the first 500.</Text>}
    </Box>
  );
}

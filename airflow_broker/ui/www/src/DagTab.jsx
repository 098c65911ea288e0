// The "Broker" tab of a DAG's page: the queues the DAG's broker tasks name (read from the DAG
// as the api-server has it), each with its state as the overview shows it and links to the
// broker's pages of that queue. A name that is a template has a value only in a run, so it is
// shown as written, without a state.
import { Badge, Box, Code, Heading, Link, Table, Text } from "@chakra-ui/react";
import { Link as RouterLink } from "react-router-dom";

import { getJson } from "./api";
import { age, depth } from "./format";
import { QueueState } from "./Overview";
import { Problem } from "./Problem";
import { usePolling } from "./usePolling";

// The broker's own pages (plugin.py's nav app), at the queue's page or its quarantine.
export const brokerPage = (queue, page) =>
  `/plugin/broker?${new URLSearchParams({ queue, page })}`;

export function QueueLink({ name, page = "queue", children, testId = "queue-link" }) {
  return (
    <Link asChild colorPalette="blue" data-testid={testId}>
      <RouterLink to={brokerPage(name, page)}>{children ?? name}</RouterLink>
    </Link>
  );
}

export function DagTab({ dagId }) {
  const { data, error } = usePolling(
    () => getJson(`dags/${encodeURIComponent(dagId)}/queues`), [dagId]);

  return (
    <Box p={2} data-testid="broker-dag-tab">
      <Heading size="md" mb={3}>Queues of this DAG's broker tasks</Heading>
      <Problem error={error} />
      {data && data.queues.length === 0 && (
        <Text data-testid="no-dag-queues">No task of this DAG names a broker queue.</Text>
      )}
      {data && data.queues.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="dag-queue-table">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Queue</Table.ColumnHeader>
              <Table.ColumnHeader>Tasks</Table.ColumnHeader>
              <Table.ColumnHeader>State</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Depth</Table.ColumnHeader>
              <Table.ColumnHeader>Oldest message</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Quarantined</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.queues.map((q) => (
              <Table.Row key={q.raw} data-testid={`dag-queue-${q.raw}`}
                         bg={q.state && !q.state.enabled ? "bg.error" : undefined}>
                <Table.Cell>
                  {q.is_template
                    ? (<><Code data-testid="queue-template">{q.raw}</Code>
                      <Text fontSize="xs" color="fg.muted">set in each run</Text></>)
                    : <QueueLink name={q.name} />}
                </Table.Cell>
                <Table.Cell>
                  {q.tasks.map((t) => (
                    <Text key={`${t.task_id}.${t.field}`} fontSize="sm">
                      {t.task_id} <Text as="span" color="fg.muted">({t.task_type}.{t.field})</Text>
                    </Text>
                  ))}
                </Table.Cell>
                <Table.Cell>
                  {q.state ? <QueueState queue={q.state} />
                    : !q.is_template && (
                      <Badge colorPalette="gray" data-testid="queue-state">
                        not found (or not visible to the UI's login)
                      </Badge>)}
                </Table.Cell>
                <Table.Cell textAlign="end" data-testid="queue-depth">
                  {q.state ? depth(q.state) : ""}
                </Table.Cell>
                <Table.Cell>{q.state ? age(q.state.oldest_message_age_seconds) : ""}</Table.Cell>
                <Table.Cell textAlign="end">
                  {q.state && (
                    <QueueLink name={q.name} page="quarantine" testId="quarantine-link">
                      {q.state.quarantined}
                    </QueueLink>)}
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
    </Box>
  );
}

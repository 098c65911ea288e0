import { Badge, Box, Button, Heading, HStack, Link, Table, Text } from "@chakra-ui/react";

import { getJson, postJson, queuePath } from "./api";
import { age, depth, when } from "./format";
import { Problem } from "./Problem";
import { useAction } from "./useAction";
import { usePolling } from "./usePolling";

export function QueueState({ queue }) {
  if (queue.enabled) {
    return <Badge colorPalette="green" data-testid="queue-state">enabled</Badge>;
  }
  return (
    <Box>
      <Badge colorPalette="red" data-testid="queue-state">
        disabled{queue.disabled_reason ? ` (${queue.disabled_reason})` : ""}
      </Badge>
      <Text fontSize="xs" color="fg.error" data-testid="disabled-by">
        {queue.poison
          ? `${queue.poison.reason} at ${when(queue.poison.at)}; message ${queue.poison.message_ids.join(", ")}`
          : `since ${when(queue.disabled_at)}`}
      </Text>
    </Box>
  );
}

export function Overview({ open }) {
  const { data, error, refresh } = usePolling(() => getJson("overview"), []);
  const { busy, error: actionError, run } = useAction();
  const perms = data ? data.permissions : {};

  const setStatus = (name, enabled) => run(name, async () => {
    await postJson(`${queuePath(name)}/status`, { enabled });
    await refresh();
  });

  return (
    <Box data-testid="broker-overview">
      <Heading size="lg" mb={3}>Service Broker queues</Heading>
      <Problem error={error || actionError} />
      {data && data.queues.length === 0 && <Text data-testid="no-queues">No queues.</Text>}
      {data && data.queues.length > 0 && (
        <Table.Root size="sm" variant="outline" interactive data-testid="queue-table">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Queue</Table.ColumnHeader>
              <Table.ColumnHeader>State</Table.ColumnHeader>
              <Table.ColumnHeader>Activation</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Depth</Table.ColumnHeader>
              <Table.ColumnHeader>Oldest message</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Readers</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Quarantined</Table.ColumnHeader>
              <Table.ColumnHeader />
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.queues.map((q) => (
              <Table.Row
                key={q.name}
                data-testid={`queue-row-${q.name}`}
                data-enabled={q.enabled ? "true" : "false"}
                bg={q.enabled ? undefined : "bg.error"}
              >
                <Table.Cell>
                  <Link onClick={() => open(q.name, "queue")} data-testid="queue-link"
                        colorPalette="blue" cursor="pointer">{q.name}</Link>
                </Table.Cell>
                <Table.Cell><QueueState queue={q} /></Table.Cell>
                <Table.Cell>{q.activation_enabled ? `on (max ${q.max_readers})` : "off"}</Table.Cell>
                <Table.Cell textAlign="end" data-testid="queue-depth"
                            title={q.depth_is_estimate
                              ? "estimated from PostgreSQL's statistics" : undefined}>
                  {depth(q)}
                </Table.Cell>
                <Table.Cell>{age(q.oldest_message_age_seconds)}</Table.Cell>
                <Table.Cell textAlign="end">{q.readers_running}</Table.Cell>
                <Table.Cell textAlign="end">
                  <Link onClick={() => open(q.name, "quarantine")} data-testid="quarantine-link"
                        cursor="pointer">{q.quarantined}</Link>
                </Table.Cell>
                <Table.Cell>
                  {perms.enable_disable_queue && q.may_alter && (
                    <HStack>
                      <Button size="xs" variant="outline" loading={busy === q.name}
                              data-testid={q.enabled ? "disable-queue" : "enable-queue"}
                              onClick={() => setStatus(q.name, !q.enabled)}>
                        {q.enabled ? "Disable" : "Enable"}
                      </Button>
                    </HStack>
                  )}
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
    </Box>
  );
}

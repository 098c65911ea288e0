import { Badge, Box, Button, Heading, HStack, Link, Table, Text } from "@chakra-ui/react";
import { useRef } from "react";

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

// The receive rate is over this much of the page's own refreshes.
const RATE_WINDOW_MS = 5 * 60 * 1000;

// RECEIVEs that took messages, per second, per queue, over the last minutes the page was
// open: each refresh brings every queue's counter; null until there are two refreshes.
function useReceiveRates(queues) {
  const samples = useRef([]);
  const kept = samples.current;
  if (queues && (kept.length === 0 || kept[kept.length - 1].queues !== queues)) {
    const at = Date.now();
    kept.push({ at, queues, counts: Object.fromEntries(queues.map((q) => [q.name, q.receives])) });
    while (kept.length > 2 && at - kept[0].at > RATE_WINDOW_MS) kept.shift();
  }
  if (kept.length < 2) return {};
  const first = kept[0];
  const last = kept[kept.length - 1];
  const seconds = (last.at - first.at) / 1000;
  return Object.fromEntries(Object.entries(last.counts).map(([name, count]) => [
    name, name in first.counts ? Math.max(0, count - first.counts[name]) / seconds : null]));
}

export function MonitorState({ monitor }) {
  if (!monitor) return <Text color="fg.muted">none</Text>;
  return (
    <Badge colorPalette={monitor.stuck ? "red" : monitor.state === "INACTIVE" ? "gray" : "blue"}
           title={monitor.since ? `since ${when(monitor.since)}` : undefined}
           data-testid="monitor-state">
      {monitor.stuck ? `stuck (${monitor.state})` : monitor.state}
    </Badge>
  );
}

export function Overview({ open }) {
  const { data, error, refresh } = usePolling(() => getJson("overview"), []);
  const { busy, error: actionError, run } = useAction();
  const perms = data ? data.permissions : {};
  const rates = useReceiveRates(data ? data.queues : null);

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
              <Table.ColumnHeader textAlign="end"
                                  title="RECEIVEs that took messages, per second, over the last 5 minutes this page was open">
                Receives/s
              </Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Readers</Table.ColumnHeader>
              <Table.ColumnHeader>Monitor</Table.ColumnHeader>
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
                <Table.Cell textAlign="end" data-testid="receive-rate">
                  {rates[q.name] == null ? "…" : rates[q.name].toFixed(2)}
                </Table.Cell>
                <Table.Cell textAlign="end">{q.readers_running}</Table.Cell>
                <Table.Cell><MonitorState monitor={q.monitor} /></Table.Cell>
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

// What waits in the transmission queue (sys.transmission_queue), per route: the destination
// service and broker instance. Retry now makes a route's messages due at once; it never shows
// a route's address, which may carry a password.
import { Badge, Box, Button, Heading, Table, Text } from "@chakra-ui/react";
import { useState } from "react";

import { getJson, postJson } from "./api";
import { age, when } from "./format";
import { Problem } from "./Problem";
import { useAction } from "./useAction";
import { usePolling } from "./usePolling";

const DELIVERY = { remote: "blue", local: "gray", "no route": "red" };

// One key per route: the broker instance is null for a route to any instance.
const routeKey = (r) => `${r.to_service_name}\u0000${r.to_broker_instance ?? ""}`;

export function Transmission() {
  const { data, error, refresh } = usePolling(() => getJson("transmission"), []);
  const { busy, error: actionError, run } = useAction();
  const [done, setDone] = useState(null);
  const perms = data ? data.permissions : {};

  const retry = (route) => run(routeKey(route), async () => {
    setDone(null);
    const result = await postJson("transmission/retry", {
      to_service_name: route.to_service_name,
      to_broker_instance: route.to_broker_instance,
    });
    setDone(`${result.retried} message(s) to ${route.to_service_name} due now`);
    await refresh();
  });

  return (
    <Box data-testid="broker-transmission">
      <Heading size="lg" mb={2}>Transmission queue</Heading>
      <Problem error={error || actionError} />
      {done && <Text color="fg.success" data-testid="retry-done" mb={2}>{done}</Text>}
      {data && data.routes.length === 0 && (
        <Text data-testid="transmission-empty">Nothing waits to be sent.</Text>
      )}
      {data && data.routes.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="transmission-table">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>To service</Table.ColumnHeader>
              <Table.ColumnHeader>Broker instance</Table.ColumnHeader>
              <Table.ColumnHeader>Delivery</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Waiting</Table.ColumnHeader>
              <Table.ColumnHeader>Oldest</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Attempts</Table.ColumnHeader>
              <Table.ColumnHeader>transmission_status</Table.ColumnHeader>
              <Table.ColumnHeader>Next attempt</Table.ColumnHeader>
              <Table.ColumnHeader />
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.routes.map((r) => (
              <Table.Row key={routeKey(r)} data-testid="transmission-row"
                         data-service={r.to_service_name}
                         bg={r.transmission_status ? "bg.warning" : undefined}>
                <Table.Cell fontFamily="mono" fontSize="xs">{r.to_service_name}</Table.Cell>
                <Table.Cell fontFamily="mono" fontSize="xs">{r.to_broker_instance || "any"}</Table.Cell>
                <Table.Cell>
                  <Badge colorPalette={DELIVERY[r.delivery] || "gray"}
                         data-testid="transmission-delivery">{r.delivery}</Badge>
                </Table.Cell>
                <Table.Cell textAlign="end" data-testid="transmission-messages">
                  {r.messages}
                  <Text as="span" fontSize="xs" color="fg.muted">
                    {" "}in {r.conversations} conv.
                  </Text>
                </Table.Cell>
                <Table.Cell title={when(r.oldest_enqueue_time)}>
                  {age(r.oldest_age_seconds)}
                </Table.Cell>
                <Table.Cell textAlign="end">{r.attempts}</Table.Cell>
                <Table.Cell fontSize="xs" data-testid="transmission-status">
                  {r.transmission_status || <Text as="span" color="fg.muted">not attempted yet</Text>}
                </Table.Cell>
                <Table.Cell data-testid="transmission-next">{when(r.next_attempt_at)}</Table.Cell>
                <Table.Cell>
                  {perms.retry_transmission && r.may_retry && (
                    <Button size="xs" variant="outline" loading={busy === routeKey(r)}
                            data-testid="retry-now" onClick={() => retry(r)}>Retry now</Button>
                  )}
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
      {data && data.truncated && <Text fontSize="sm" mt={2}>The 500 oldest routes shown.</Text>}
    </Box>
  );
}

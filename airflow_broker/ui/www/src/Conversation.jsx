// One conversation end to end: its endpoints in this broker (both, when the peer is local),
// and its messages waiting in their queues or in the transmission queue, with the status of
// their transmission. A peer in another broker is named by its service and broker instance.
import { Badge, Box, Button, Code, Heading, HStack, Table, Text } from "@chakra-ui/react";

import { getJson } from "./api";
import { when } from "./format";
import { Problem } from "./Problem";
import { usePolling } from "./usePolling";

function Endpoints({ endpoints }) {
  return (
    <Table.Root size="sm" variant="outline" mb={3} data-testid="conversation-endpoints">
      <Table.Header>
        <Table.Row>
          <Table.ColumnHeader>Side</Table.ColumnHeader>
          <Table.ColumnHeader>Handle</Table.ColumnHeader>
          <Table.ColumnHeader>Service (queue)</Table.ColumnHeader>
          <Table.ColumnHeader>Far service</Table.ColumnHeader>
          <Table.ColumnHeader>State</Table.ColumnHeader>
          <Table.ColumnHeader textAlign="end">Sent / received</Table.ColumnHeader>
          <Table.ColumnHeader>Lifetime</Table.ColumnHeader>
          <Table.ColumnHeader>Transmission status</Table.ColumnHeader>
        </Table.Row>
      </Table.Header>
      <Table.Body>
        {endpoints.map((e) => (
          <Table.Row key={e.conversation_handle} data-testid="conversation-endpoint">
            <Table.Cell>{e.is_initiator ? "initiator" : "target"}</Table.Cell>
            <Table.Cell fontFamily="mono" fontSize="xs">{e.conversation_handle}</Table.Cell>
            <Table.Cell>{e.service_name} ({e.queue_name})</Table.Cell>
            <Table.Cell>
              {e.far_service}
              {e.far_broker_instance && (
                <Text fontSize="xs" color="fg.muted">broker {e.far_broker_instance}</Text>
              )}
            </Table.Cell>
            <Table.Cell data-testid="endpoint-state">{e.state_desc}</Table.Cell>
            <Table.Cell textAlign="end">{e.send_sequence} / {e.receive_sequence}</Table.Cell>
            <Table.Cell>{when(e.lifetime)}</Table.Cell>
            <Table.Cell data-testid="endpoint-transmission-status">
              {e.transmission_status || ""}
            </Table.Cell>
          </Table.Row>
        ))}
      </Table.Body>
    </Table.Root>
  );
}

export function Conversation({ handle, close }) {
  const { data, error } = usePolling(
    () => getJson(`conversations/${encodeURIComponent(handle)}`), [handle]);
  const sides = data ? Object.fromEntries(data.endpoints.map((e) => [
    e.conversation_handle, e.is_initiator ? "initiator" : "target"])) : {};

  return (
    <Box mb={4} p={3} borderWidth="1px" borderRadius="md" data-testid="conversation-detail">
      <HStack justify="space-between" mb={2}>
        <Heading size="md">Conversation {data && data.endpoints.length > 0
          ? data.endpoints[0].conversation_id : handle}</Heading>
        <Button size="xs" variant="ghost" onClick={close} data-testid="conversation-close">
          Close
        </Button>
      </HStack>
      <Problem error={error} />
      {data && <Endpoints endpoints={data.endpoints} />}
      {data && data.messages.length === 0 && (
        <Text data-testid="conversation-no-messages">No message of it waits in this broker.</Text>
      )}
      {data && data.messages.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="conversation-messages">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>At</Table.ColumnHeader>
              <Table.ColumnHeader>Side</Table.ColumnHeader>
              <Table.ColumnHeader textAlign="end">Sequence</Table.ColumnHeader>
              <Table.ColumnHeader>Message type</Table.ColumnHeader>
              <Table.ColumnHeader>Where</Table.ColumnHeader>
              <Table.ColumnHeader>Enqueued</Table.ColumnHeader>
              <Table.ColumnHeader>Body</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.messages.map((m) => (
              <Table.Row key={`${m.place}-${m.message_id}`} data-testid="conversation-message"
                         data-place={m.place}>
                <Table.Cell>{m.place === "queue" ? "its queue" : "transmission queue"}</Table.Cell>
                <Table.Cell>{sides[m.conversation_handle]}</Table.Cell>
                <Table.Cell textAlign="end">{m.message_sequence_number}</Table.Cell>
                <Table.Cell>{m.message_type_name}</Table.Cell>
                <Table.Cell>
                  <Badge colorPalette={m.transmission_status ? "red" : "gray"}>{m.status}</Badge>
                  {m.transmission_status && (
                    <Text fontSize="xs" color="fg.error">{m.transmission_status}</Text>
                  )}
                </Table.Cell>
                <Table.Cell>{when(m.at)}</Table.Cell>
                <Table.Cell>{m.body_masked ? <Badge>hidden</Badge> : <Code>{m.body}</Code>}</Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
    </Box>
  );
}

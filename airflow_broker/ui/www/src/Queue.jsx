import { Badge, Box, Code, Heading, Stack, Table, Text } from "@chakra-ui/react";

import { getJson, queuePath } from "./api";
import { when } from "./format";
import { Problem } from "./Problem";
import { usePolling } from "./usePolling";

export function Queue({ name }) {
  const { data, error } = usePolling(() => getJson(queuePath(name)), [name]);
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
        </Stack>
      )}
    </Box>
  );
}

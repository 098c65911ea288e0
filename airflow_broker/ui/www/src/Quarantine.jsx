import { Badge, Box, Button, Code, Heading, HStack, Input, Table, Text } from "@chakra-ui/react";
import { useState } from "react";

import { getJson, postJson, queuePath } from "./api";
import { when } from "./format";
import { Problem } from "./Problem";
import { useAction } from "./useAction";
import { usePolling } from "./usePolling";

export function Quarantine({ name }) {
  const [filter, setFilter] = useState("");
  const query = filter ? `?error=${encodeURIComponent(filter)}` : "";
  const { data, error, refresh } = usePolling(
    () => getJson(`${queuePath(name)}/quarantine${query}`), [name, query]);
  const [selected, setSelected] = useState(new Set());
  const { busy, error: actionError, run } = useAction();
  const [done, setDone] = useState(null);
  const messages = data ? data.messages : [];
  const perms = data ? data.permissions : {};
  // The auth manager's consent and the broker's: the UI's login may lack ALTER on the queue.
  const mayEnable = perms.replay_quarantine && data && data.may_alter;
  const mayReplay = perms.replay_only && data && data.may_receive;
  const selecting = mayEnable || mayReplay;

  const toggle = (id) => {
    const next = new Set(selected);
    if (next.has(id)) next.delete(id); else next.add(id);
    setSelected(next);
  };
  const allSelected = messages.length > 0 && messages.every((m) => selected.has(m.quarantine_id));

  // Replay (and enable), or discard: each acts on the selected messages and says what it did.
  const act = (action, said) => run(true, async () => {
    const result = await postJson(`${queuePath(name)}/${action}`,
                                  { quarantine_ids: [...selected] });
    setDone(said(result));
    setSelected(new Set());
    await refresh();
  });
  const replay = (enable) => act(enable ? "replay-and-enable" : "replay", (result) =>
    `${result.replayed} message(s) replayed${enable ? `; queue ${name} enabled` : ""}`);
  const discard = () => act("discard", (result) => `${result.discarded} message(s) discarded`);

  return (
    <Box data-testid="broker-quarantine">
      <Heading size="lg" mb={2}>Quarantine of {name}</Heading>
      <Problem error={error || actionError} />
      {done && <Text color="fg.success" data-testid="replay-done" mb={2}>{done}</Text>}
      <HStack mb={3}>
        <Input size="sm" maxW="sm" placeholder="Filter by error text" value={filter}
               onChange={(e) => setFilter(e.target.value)} data-testid="error-filter" />
        {mayEnable && (
          <Button size="sm" colorPalette="blue" disabled={selected.size === 0 || busy}
                  loading={busy} onClick={() => replay(true)} data-testid="replay-and-enable">
            Replay and enable queue
          </Button>
        )}
        {!mayEnable && mayReplay && (
          <Button size="sm" colorPalette="blue" disabled={selected.size === 0 || busy}
                  loading={busy} onClick={() => replay(false)} data-testid="replay">
            Replay
          </Button>
        )}
        {perms.discard_quarantine && mayReplay && (
          <Button size="sm" variant="outline" colorPalette="red"
                  disabled={selected.size === 0 || busy} loading={busy} onClick={discard}
                  data-testid="discard">
            Discard
          </Button>
        )}
      </HStack>
      {data && messages.length === 0 && (
        <Text data-testid="quarantine-empty">No quarantined messages.</Text>
      )}
      {messages.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="quarantine-table">
          <Table.Header>
            <Table.Row>
              {selecting && (
                <Table.ColumnHeader>
                  <input type="checkbox" aria-label="select all" checked={allSelected}
                         data-testid="select-all"
                         onChange={() => setSelected(allSelected ? new Set()
                           : new Set(messages.map((m) => m.quarantine_id)))} />
                </Table.ColumnHeader>
              )}
              <Table.ColumnHeader>Id</Table.ColumnHeader>
              <Table.ColumnHeader>Status</Table.ColumnHeader>
              <Table.ColumnHeader>Quarantined</Table.ColumnHeader>
              <Table.ColumnHeader>Error</Table.ColumnHeader>
              <Table.ColumnHeader>Body</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {messages.map((m) => (
              <Table.Row key={m.quarantine_id} data-testid="quarantine-row">
                {selecting && (
                  <Table.Cell>
                    <input type="checkbox" aria-label={`select ${m.quarantine_id}`}
                           checked={selected.has(m.quarantine_id)}
                           onChange={() => toggle(m.quarantine_id)}
                           data-testid="select-message" />
                  </Table.Cell>
                )}
                <Table.Cell>{m.quarantine_id}</Table.Cell>
                <Table.Cell><Badge colorPalette={m.status === "quarantined" ? "red" : "orange"}>{m.status}</Badge></Table.Cell>
                <Table.Cell>{when(m.quarantined_at)}</Table.Cell>
                <Table.Cell data-testid="quarantine-error">{m.error}</Table.Cell>
                <Table.Cell>{m.body_masked ? <Badge>hidden</Badge> : <Code>{m.body}</Code>}</Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
    </Box>
  );
}

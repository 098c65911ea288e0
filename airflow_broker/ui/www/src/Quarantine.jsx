import {
  Badge, Box, Button, Code, Heading, HStack, Input, NativeSelect, Table, Text,
} from "@chakra-ui/react";
import { useState } from "react";

import { getJson, postJson, queuePath } from "./api";
import { when } from "./format";
import { Problem } from "./Problem";
import { useAction } from "./useAction";
import { usePolling } from "./usePolling";

// Quarantined within the last ..., as the "since" filter offers it.
const WINDOWS = [["", "any time"], ["3600", "the last hour"], ["86400", "the last day"],
                 ["604800", "the last week"]];

export function Quarantine({ name }) {
  const [filter, setFilter] = useState("");
  const [bodyFilter, setBodyFilter] = useState("");
  const [within, setWithin] = useState("");
  // The start of the window when it was chosen: a refresh keeps the same messages in view.
  const [since, setSince] = useState("");
  const params = new URLSearchParams();
  if (filter) params.set("error", filter);
  if (bodyFilter) params.set("body", bodyFilter);
  if (since) params.set("since", since);
  const query = params.size ? `?${params}` : "";
  const { data, error, refresh } = usePolling(
    () => getJson(`${queuePath(name)}/quarantine${query}`), [name, query]);
  const [selected, setSelected] = useState(new Set());
  const { busy, error: actionError, run } = useAction();
  const [done, setDone] = useState(null);
  // Discarding cannot be undone: the button asks once more, naming how many it discards.
  const [confirming, setConfirming] = useState(false);
  const asking = confirming && selected.size > 0;
  const messages = data ? data.messages : [];
  const groups = data ? data.groups : [];
  // Every match is in a group, also those beyond the listed ones.
  const matching = groups.reduce((sum, g) => sum + g.count, 0);
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
  const chooseWindow = (seconds) => {
    setWithin(seconds);
    setSince(seconds ? new Date(Date.now() - Number(seconds) * 1000).toISOString() : "");
  };

  // Replay (and enable), or discard: each acts on the selected messages and says what it did.
  const act = (action, said) => run(true, async () => {
    const result = await postJson(`${queuePath(name)}/${action}`,
                                  { quarantine_ids: [...selected] });
    setDone(said(result));
    setSelected(new Set());
    setConfirming(false);
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
        <Input size="sm" maxW="xs" placeholder="Filter by error text" value={filter}
               onChange={(e) => setFilter(e.target.value)} data-testid="error-filter" />
        {perms.view_bodies && (
          <Input size="sm" maxW="xs" placeholder="Filter by body content" value={bodyFilter}
                 onChange={(e) => setBodyFilter(e.target.value)} data-testid="body-filter" />
        )}
        <NativeSelect.Root size="sm" maxW="3xs">
          <NativeSelect.Field value={within} onChange={(e) => chooseWindow(e.target.value)}
                              aria-label="quarantined within" data-testid="since-filter">
            {WINDOWS.map(([seconds, label]) => (
              <option key={seconds} value={seconds}>{label}</option>))}
          </NativeSelect.Field>
          <NativeSelect.Indicator />
        </NativeSelect.Root>
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
        {perms.discard_quarantine && mayReplay && !asking && (
          <Button size="sm" variant="outline" colorPalette="red"
                  disabled={selected.size === 0 || busy} onClick={() => setConfirming(true)}
                  data-testid="discard">
            Discard
          </Button>
        )}
      </HStack>
      {asking && (
        <HStack mb={3} data-testid="discard-confirmation">
          <Text color="fg.error">
            Discard {selected.size} message(s)? They leave the quarantine for good and cannot be
            replayed.
          </Text>
          <Button size="sm" colorPalette="red" loading={busy} onClick={discard}
                  data-testid="discard-confirm">
            Discard {selected.size}
          </Button>
          <Button size="sm" variant="ghost" onClick={() => setConfirming(false)}
                  data-testid="discard-cancel">
            Cancel
          </Button>
        </HStack>
      )}
      {groups.length > 0 && (
        <Table.Root size="sm" variant="outline" mb={4} data-testid="quarantine-groups">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Error</Table.ColumnHeader>
              <Table.ColumnHeader>Messages</Table.ColumnHeader>
              <Table.ColumnHeader>First</Table.ColumnHeader>
              <Table.ColumnHeader>Last</Table.ColumnHeader>
              <Table.ColumnHeader />
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {groups.map((g) => (
              <Table.Row key={g.error} data-testid="quarantine-group">
                <Table.Cell>{g.error}</Table.Cell>
                <Table.Cell data-testid="group-count">{g.count}</Table.Cell>
                <Table.Cell>{when(g.first_quarantined_at)}</Table.Cell>
                <Table.Cell>{when(g.last_quarantined_at)}</Table.Cell>
                <Table.Cell>
                  <HStack>
                    <Button size="xs" variant="ghost" onClick={() => setFilter(g.error)}
                            data-testid="group-show">Only these</Button>
                    {selecting && (
                      <Button size="xs" variant="outline"
                              onClick={() => setSelected(new Set(g.quarantine_ids))}
                              data-testid="group-select">
                        {g.quarantine_ids.length < g.count
                          ? `Select the oldest ${g.quarantine_ids.length}` : `Select all ${g.count}`}
                      </Button>
                    )}
                  </HStack>
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
      {messages.length > 0 && (
        <Text mb={2} data-testid="quarantine-count">
          {data.truncated
            ? `${matching} messages match; the oldest ${messages.length} are listed`
            : `${messages.length} message(s) match`}
          {selected.size ? `; ${selected.size} selected` : ""}
        </Text>
      )}
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

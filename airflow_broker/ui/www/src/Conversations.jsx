// The conversations the UI's login may see, by state, leaks flagged. END CONVERSATION WITH
// CLEANUP never tells the peer, so it is offered for a leak alone, and only after the user
// types the conversation's handle; WITH ERROR for an open conversation.
import {
  Badge, Box, Button, Heading, HStack, Input, Link, NativeSelect, Table, Text,
} from "@chakra-ui/react";
import { useState } from "react";

import { getJson, postJson } from "./api";
import { Conversation } from "./Conversation";
import { useAction } from "./useAction";
import { when } from "./format";
import { Problem } from "./Problem";
import { usePolling } from "./usePolling";

const STATES = ["SO", "SI", "CO", "DI", "DO", "ER", "CD"];

function Cleanup({ handle, done }) {
  const [typed, setTyped] = useState(null);
  const { busy, error, run } = useAction();
  if (typed === null) {
    return (
      <Button size="xs" variant="outline" colorPalette="red" data-testid="cleanup-start"
              onClick={() => setTyped("")}>Clean up</Button>
    );
  }
  const submit = () => run(true, async () => {
    await postJson(`conversations/${encodeURIComponent(handle)}/cleanup`, { confirm: typed });
    await done();
  });
  return (
    <Box>
      <HStack>
        <Input size="xs" minW="xs" placeholder="type the handle to confirm" value={typed}
               onChange={(e) => setTyped(e.target.value)} data-testid="cleanup-confirm" />
        <Button size="xs" colorPalette="red" loading={busy} disabled={typed.trim() !== handle}
                onClick={submit} data-testid="cleanup-submit">END WITH CLEANUP</Button>
        <Button size="xs" variant="ghost" onClick={() => setTyped(null)}>Cancel</Button>
      </HStack>
      <Problem error={error} />
    </Box>
  );
}

// END CONVERSATION WITH ERROR: the peer gets an Error message with this code and text, and
// what still waited to be delivered is dropped; the broker checks both and says why it refuses.
const ENDABLE = ["SO", "SI", "CO", "DI"];

function EndWithError({ handle, done }) {
  const [form, setForm] = useState(null);
  const { busy, error, run } = useAction();
  if (form === null) {
    return (
      <Button size="xs" variant="outline" data-testid="end-error-start"
              onClick={() => setForm({ error: "", description: "" })}>End with error</Button>
    );
  }
  const submit = () => run(true, async () => {
    await postJson(`conversations/${encodeURIComponent(handle)}/end-with-error`,
                   { error: Number(form.error), description: form.description });
    await done();
  });
  return (
    <Box>
      <HStack>
        <Input size="xs" w="24" type="number" placeholder="error code" value={form.error}
               onChange={(e) => setForm({ ...form, error: e.target.value })}
               data-testid="end-error-code" />
        <Input size="xs" minW="xs" placeholder="description" value={form.description}
               onChange={(e) => setForm({ ...form, description: e.target.value })}
               data-testid="end-error-description" />
        <Button size="xs" colorPalette="red" loading={busy}
                disabled={form.error === "" || form.description.trim() === ""}
                onClick={submit} data-testid="end-error-submit">END WITH ERROR</Button>
        <Button size="xs" variant="ghost" onClick={() => setForm(null)}>Cancel</Button>
      </HStack>
      <Problem error={error} />
    </Box>
  );
}

export function Conversations() {
  const [state, setState] = useState("");
  const [leakedOnly, setLeakedOnly] = useState(false);
  const params = new URLSearchParams();
  if (state) params.set("state", state);
  if (leakedOnly) params.set("leaked", "true");
  const query = params.toString() ? `?${params}` : "";
  const { data, error, refresh } = usePolling(() => getJson(`conversations${query}`), [query]);
  const perms = data ? data.permissions : {};
  // The conversation shown end to end above the list.
  const [shown, setShown] = useState(null);

  return (
    <Box data-testid="broker-conversations">
      <Heading size="lg" mb={2}>Conversations</Heading>
      <Problem error={error} />
      {shown && <Conversation handle={shown} close={() => setShown(null)} />}
      {data && (
        <HStack mb={2} wrap="wrap" data-testid="conversation-counts">
          {data.counts.map((c) => (
            <Badge key={c.state} colorPalette={c.leaked ? "red" : "gray"}>
              {c.state}: {c.endpoints}{c.leaked ? ` (${c.leaked} leaked)` : ""}
            </Badge>
          ))}
        </HStack>
      )}
      <HStack mb={3}>
        <NativeSelect.Root size="sm" maxW="3xs">
          <NativeSelect.Field value={state} onChange={(e) => setState(e.target.value)}
                              data-testid="state-filter" aria-label="state">
            <option value="">every state</option>
            {STATES.map((s) => <option key={s} value={s}>{s}</option>)}
          </NativeSelect.Field>
          <NativeSelect.Indicator />
        </NativeSelect.Root>
        <label>
          <input type="checkbox" checked={leakedOnly} data-testid="leaked-only"
                 onChange={() => setLeakedOnly(!leakedOnly)} /> leaks only
        </label>
      </HStack>
      {data && data.conversations.length === 0 && (
        <Text data-testid="no-conversations">No conversations.</Text>
      )}
      {data && data.conversations.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="conversation-table">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Handle</Table.ColumnHeader>
              <Table.ColumnHeader>Service</Table.ColumnHeader>
              <Table.ColumnHeader>Far service</Table.ColumnHeader>
              <Table.ColumnHeader>State</Table.ColumnHeader>
              <Table.ColumnHeader>Created</Table.ColumnHeader>
              <Table.ColumnHeader>Lifetime</Table.ColumnHeader>
              <Table.ColumnHeader />
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {data.conversations.map((c) => (
              <Table.Row key={c.conversation_handle} data-testid="conversation-row"
                         data-leaked={c.is_leaked ? "true" : "false"}
                         bg={c.is_leaked ? "bg.error" : undefined}>
                <Table.Cell fontFamily="mono" fontSize="xs">
                  <Link onClick={() => setShown(c.conversation_handle)} cursor="pointer"
                        colorPalette="blue" data-testid="conversation-link">
                    {c.conversation_handle}
                  </Link>
                </Table.Cell>
                <Table.Cell>{c.service_name}{c.is_initiator ? " (initiator)" : ""}</Table.Cell>
                <Table.Cell>{c.far_service}</Table.Cell>
                <Table.Cell>
                  {c.state_desc}
                  {c.is_leaked && <Badge ml={2} colorPalette="red" data-testid="leak-flag">leak</Badge>}
                </Table.Cell>
                <Table.Cell>{when(c.created_at)}</Table.Cell>
                <Table.Cell>{when(c.lifetime)}</Table.Cell>
                <Table.Cell>
                  {c.is_leaked && perms.cleanup_conversation && (
                    <Cleanup handle={c.conversation_handle} done={refresh} />
                  )}
                  {!c.is_leaked && perms.end_conversation && ENDABLE.includes(c.state) && (
                    <EndWithError handle={c.conversation_handle} done={refresh} />
                  )}
                </Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
      {data && data.truncated && <Text fontSize="sm" mt={2}>The newest 500 shown.</Text>}
    </Box>
  );
}

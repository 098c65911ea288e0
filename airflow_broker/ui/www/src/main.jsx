// The broker's pages, rendered by Airflow's UI at /plugin/broker. The page and queue are in
// the query string (?queue=...&page=queue|quarantine, ?page=health|conversations|transmission),
// so each page has its own address.
import { Box, Breadcrumb, Button, ChakraProvider, defaultSystem, HStack } from "@chakra-ui/react";
import { useSearchParams } from "react-router-dom";

import { Conversations } from "./Conversations";
import { Health } from "./Health";
import { Overview } from "./Overview";
import { Quarantine } from "./Quarantine";
import { Queue } from "./Queue";
import { Transmission } from "./Transmission";

const TOP_PAGES = ["health", "conversations", "transmission"];

function Pages() {
  const [params, setParams] = useSearchParams();
  const queue = params.get("queue");
  const top = params.get("page");
  const page = queue ? top || "queue"
    : TOP_PAGES.includes(top) ? top : "overview";
  const open = (name, where) => setParams(name ? { queue: name, page: where }
    : where ? { page: where } : {});

  return (
    <Box p={4} data-testid="broker-ui">
      <HStack mb={3}>
        {[["overview", "Queues", "tab-queues"], ["conversations", "Conversations",
          "to-conversations"], ["transmission", "Transmission", "to-transmission"],
          ["health", "Health", "to-health"]].map(([where, label, id]) => (
          <Button key={where} size="xs" data-testid={id}
                  variant={page === where || (where === "overview" && queue) ? "solid" : "outline"}
                  onClick={() => open(null, where === "overview" ? null : where)}>{label}</Button>
        ))}
      </HStack>
      <Breadcrumb.Root mb={3}>
        <Breadcrumb.List>
          <Breadcrumb.Item>
            <Breadcrumb.Link onClick={() => open(null)} cursor="pointer"
                             data-testid="to-overview">Broker</Breadcrumb.Link>
          </Breadcrumb.Item>
          {queue && <Breadcrumb.Separator />}
          {queue && (
            <Breadcrumb.Item>
              <Breadcrumb.Link onClick={() => open(queue, "queue")} cursor="pointer"
                               data-testid="to-queue">{queue}</Breadcrumb.Link>
            </Breadcrumb.Item>
          )}
          {queue && <Breadcrumb.Separator />}
          {queue && (
            <Breadcrumb.Item>
              <Breadcrumb.Link onClick={() => open(queue, "quarantine")} cursor="pointer"
                               data-testid="to-quarantine">quarantine</Breadcrumb.Link>
            </Breadcrumb.Item>
          )}
        </Breadcrumb.List>
      </Breadcrumb.Root>
      {page === "overview" && <Overview open={open} />}
      {page === "queue" && <Queue name={queue} />}
      {page === "quarantine" && <Quarantine name={queue} />}
      {page === "health" && <Health />}
      {page === "conversations" && <Conversations />}
      {page === "transmission" && <Transmission />}
    </Box>
  );
}

// The host's theme, so the pages follow Airflow's light and dark mode.
export default function BrokerPlugin() {
  return (
    <ChakraProvider value={globalThis.ChakraUISystem ?? defaultSystem}>
      <Pages />
    </ChakraProvider>
  );
}

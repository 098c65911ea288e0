// The broker's pages, rendered by Airflow's UI at /plugin/broker, and its "Broker" tabs on a
// DAG's and a task instance's pages (plugin.py). The page and queue are in the query string
// (?queue=...&page=queue|quarantine, ?page=health|conversations|transmission), so each page
// has its own address.
import { Box, Breadcrumb, Button, ChakraProvider, defaultSystem, HStack } from "@chakra-ui/react";
import { useSearchParams } from "react-router-dom";

import { Conversations } from "./Conversations";
import { DagTab } from "./DagTab";
import { Health } from "./Health";
import { Overview } from "./Overview";
import { Quarantine } from "./Quarantine";
import { Queue } from "./Queue";
import { TaskInstanceTab } from "./TaskInstanceTab";
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

// One component for the three apps, all named "Broker" so that the tabs are labelled so: the
// host renders it with the route's dagId, runId, taskId and mapIndex, which tell a task
// instance's tab and a DAG's from the nav pages (which have none of them).
// The host's theme, so the pages follow Airflow's light and dark mode.
export default function BrokerPlugin({ dagId, runId, taskId, mapIndex }) {
  const page = dagId && runId && taskId
    ? <TaskInstanceTab dagId={dagId} runId={runId} taskId={taskId} mapIndex={mapIndex} />
    : dagId ? <DagTab dagId={dagId} /> : <Pages />;
  // The browser draws native controls (selects, checkboxes, scroll bars) by the CSS
  // color-scheme, which the host's dark mode leaves light.
  return (
    <ChakraProvider value={globalThis.ChakraUISystem ?? defaultSystem}>
      <Box css={{ colorScheme: "light", _dark: { colorScheme: "dark" } }}>{page}</Box>
    </ChakraProvider>
  );
}

// The host imports the bundle once per app, but a module runs once: it clears
// globalThis.AirflowPlugin before each import and then takes globalThis[<app name>], so the
// component is published under the apps' name as well.
globalThis.Broker = BrokerPlugin;

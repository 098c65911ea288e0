// `airflow-broker doctor`'s findings, as the API last ran them; the button runs them again.
import { Badge, Box, Button, Heading, HStack, Table, Text } from "@chakra-ui/react";
import { useEffect, useState } from "react";

import { getJson, postJson } from "./api";
import { when } from "./format";
import { Problem } from "./Problem";

const PALETTE = { error: "red", warning: "orange", info: "gray" };

export function Health() {
  const [report, setReport] = useState(null);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    getJson("health").then(setReport, setError);
  }, []);

  const rerun = async () => {
    setBusy(true);
    setError(null);
    try {
      setReport(await postJson("health", {}));
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <Box data-testid="broker-health">
      <Heading size="lg" mb={2}>Health</Heading>
      <Problem error={error} />
      <HStack mb={3}>
        {report && (
          <Badge colorPalette={!report.healthy ? "red" : report.not_checked.length ? "orange" : "green"}
                 data-testid="health-state">
            {!report.healthy ? "problems found"
              : report.not_checked.length ? `${report.not_checked.length} checks not run`
                : "healthy"}
          </Badge>
        )}
        {report && (
          <Text fontSize="sm" data-testid="health-checked-at">
            schema {report.schema}, {report.checks.length} checks, {when(report.checked_at)}
            {" "}(run {report.run})
          </Text>
        )}
        <Button size="sm" variant="outline" loading={busy} onClick={rerun}
                data-testid="health-rerun">Check again</Button>
      </HStack>
      {report && report.findings.length === 0 && (
        <Text data-testid="health-clean">Everything looks right.</Text>
      )}
      {report && report.findings.length > 0 && (
        <Table.Root size="sm" variant="outline" data-testid="health-table">
          <Table.Header>
            <Table.Row>
              <Table.ColumnHeader>Severity</Table.ColumnHeader>
              <Table.ColumnHeader>Check</Table.ColumnHeader>
              <Table.ColumnHeader>Subject</Table.ColumnHeader>
              <Table.ColumnHeader>Problem</Table.ColumnHeader>
              <Table.ColumnHeader>Fix</Table.ColumnHeader>
            </Table.Row>
          </Table.Header>
          <Table.Body>
            {report.findings.map((f, i) => (
              <Table.Row key={i} data-testid="health-finding" data-severity={f.severity}>
                <Table.Cell>
                  <Badge colorPalette={PALETTE[f.severity] || "gray"}>{f.severity}</Badge>
                </Table.Cell>
                <Table.Cell>{f.check}</Table.Cell>
                <Table.Cell>{f.subject}</Table.Cell>
                <Table.Cell>{f.problem}</Table.Cell>
                <Table.Cell>{f.fix}</Table.Cell>
              </Table.Row>
            ))}
          </Table.Body>
        </Table.Root>
      )}
    </Box>
  );
}

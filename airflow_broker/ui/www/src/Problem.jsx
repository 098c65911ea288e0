import { Alert } from "@chakra-ui/react";

export function Problem({ error }) {
  if (!error) return null;
  return (
    <Alert.Root status="error" data-testid="error" my={2}>
      <Alert.Indicator />
      <Alert.Description>{error.message}</Alert.Description>
    </Alert.Root>
  );
}

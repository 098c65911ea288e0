// A write the page makes for its user: which one is under way (a key, for a row's button), and
// the error that ended the last one, shown where the page shows its problems.
import { useState } from "react";

export function useAction() {
  const [busy, setBusy] = useState(null);
  const [error, setError] = useState(null);
  const run = async (key, action) => {
    setBusy(key);
    setError(null);
    try {
      await action();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(null);
    }
  };
  return { busy, error, run };
}

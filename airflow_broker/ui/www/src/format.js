export const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");

export function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

// Deep queues are estimated, not counted, on each refresh (ui/console.py).
export const depth = (queue) =>
  queue.depth_is_estimate ? `≈ ${queue.depth.toLocaleString()}` : String(queue.depth);

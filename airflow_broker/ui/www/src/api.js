// Calls of the plugin's API (airflow_broker/ui/api.py). The session is Airflow's own cookie;
// writes are JSON POSTs, which the API requires, and the browser marks them same-origin.

export class ApiError extends Error {
  constructor(status, body) {
    const number = body && body.error_number ? ` (Msg ${body.error_number})` : "";
    const detail = body && body.detail ? JSON.stringify(body.detail).replace(/^"|"$/g, "") : "";
    super(`${detail || `HTTP ${status}`}${number}`);
    this.status = status;
    this.errorNumber = body ? body.error_number : undefined;
  }
}

const url = (path) => new URL(`broker/api/${path}`, document.baseURI).toString();

async function handle(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

export const getJson = (path) =>
  fetch(url(path), { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(handle);

export const postJson = (path, payload) =>
  fetch(url(path), {
    method: "POST",
    credentials: "same-origin",
    headers: { Accept: "application/json", "Content-Type": "application/json" },
    body: JSON.stringify(payload),
  }).then(handle);

export const queuePath = (name) => `queues/${encodeURIComponent(name)}`;

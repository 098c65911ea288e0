-- The lifetime sweep (expire_lifetimes) also ends DISCONNECTED_OUTBOUND endpoints, which the
-- index on lifetimes left out: the sweep could not use it and read every endpoint, with a
-- sort, on every pass of the broker worker.
DROP INDEX endpoints_lifetime;
CREATE INDEX endpoints_lifetime ON endpoints (lifetime) WHERE state IN ('SO', 'CO', 'DI', 'DO');

-- No statement finds an endpoint by its peer's handle (a peer is always found by its own
-- handle, the primary key); the index cost every new endpoint and message 0 an entry.
DROP INDEX endpoints_far_handle;

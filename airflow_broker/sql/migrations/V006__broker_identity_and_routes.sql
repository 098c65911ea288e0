-- Delivery between brokers (spec 21): each broker schema's identity, its routes, and what the
-- dialog protocol keeps per endpoint.

-- The broker instance of this schema (SQL Server: sys.databases.service_broker_guid and
-- is_broker_enabled). ALTER DATABASE ... SET NEW_BROKER gives it a new guid.
CREATE TABLE broker_identity (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    service_broker_guid uuid NOT NULL DEFAULT gen_random_uuid(),
    is_broker_enabled   boolean NOT NULL DEFAULT true,
    changed_at          timestamp
);
INSERT INTO broker_identity DEFAULT VALUES;

-- Routes map a service name (and optionally a broker instance) to an address: 'LOCAL',
-- 'TRANSPORT', a PostgreSQL URI or an Airflow connection ('airflow://conn_id').
CREATE TABLE route_defs (
    route_id            serial PRIMARY KEY,
    name                text NOT NULL UNIQUE,
    remote_service_name text,
    broker_instance     text,
    lifetime            timestamp,
    address             text NOT NULL,
    mirror_address      text,
    created_at          timestamp NOT NULL
);
CREATE INDEX route_defs_service ON route_defs (remote_service_name);
SELECT setval(pg_get_serial_sequence('route_defs', 'route_id'), 65535);
-- Every broker starts with the route that sends any service to this broker (spec 21.2).
INSERT INTO route_defs (name, address, created_at) VALUES ('AutoCreatedLocal', 'LOCAL', '1900-01-01');

-- The dialog protocol between brokers (spec 21.4).
-- is_remote: the peer endpoint lives in another broker; messages travel through the
-- transmission queue and the transport.
ALTER TABLE endpoints ADD COLUMN is_remote boolean NOT NULL DEFAULT false;
-- The broker instance named in BEGIN DIALOG (far_broker_instance stays NULL until the target
-- acknowledges message 0, as in SQL Server).
ALTER TABLE endpoints ADD COLUMN to_broker_instance text;
-- The next sequence number expected from a remote peer; later ones are held (status 2).
ALTER TABLE endpoints ADD COLUMN inbound_sequence bigint NOT NULL DEFAULT 0;
-- Initiator: the acknowledgement of message 0 has been processed, so every later transmission
-- (acknowledgements included) carries the flag that starts the target's security timestamp.
ALTER TABLE endpoints ADD COLUMN message0_acked boolean NOT NULL DEFAULT false;
-- The outcome of the conversation's last transmission, acknowledgements included
-- (GET_TRANSMISSION_STATUS).
ALTER TABLE endpoints ADD COLUMN transmission_status text NOT NULL DEFAULT '';

-- When the transport last tried, for the status and the doctor.
ALTER TABLE transmissions ADD COLUMN last_attempt_at timestamp;

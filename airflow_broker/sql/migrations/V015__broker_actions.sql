-- The broker acting on its own inside an application's transaction: fire_event sends event
-- notifications from the broker's own service in whichever session disabled or activated a
-- queue. A row here, written and removed by that function alone, tells the permission checks
-- that the action is the broker's, not the login's. Rows never outlive the action: they are
-- deleted before it returns, and a failed action rolls back with its row.
CREATE UNLOGGED TABLE broker_actions (
    backend_pid integer NOT NULL,
    xact        xid8 NOT NULL,
    PRIMARY KEY (backend_pid, xact)
);

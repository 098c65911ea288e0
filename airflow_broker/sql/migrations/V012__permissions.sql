-- Service Broker's permissions on broker objects (GRANT / DENY ... ON SERVICE::, ON QUEUE,
-- ON CONTRACT::, ON MESSAGE TYPE::, and CREATE ... on the database), and their owners.
-- Principals are PostgreSQL roles, kept by oid so that a renamed role keeps its grants; 0 is
-- public. class follows sys.database_permissions: 0 database, 1 object (a queue), 15 message
-- type, 16 contract, 17 service, 19 route.
CREATE TABLE permissions (
    class        smallint NOT NULL CHECK (class IN (0, 1, 15, 16, 17, 19)),
    major_id     integer NOT NULL,
    grantee      oid NOT NULL,
    permission   text NOT NULL,
    -- G granted, W granted WITH GRANT OPTION, D denied.
    state        char(1) NOT NULL CHECK (state IN ('G', 'W', 'D')),
    grantor      oid NOT NULL,
    PRIMARY KEY (class, major_id, grantee, permission)
);

-- The owner (AUTHORIZATION) of each object; NULL: the owner of the broker schema, as
-- principal_id is NULL in SQL Server's catalog views for objects the schema's owner owns.
ALTER TABLE queues ADD COLUMN principal_id oid;
ALTER TABLE service_defs ADD COLUMN principal_id oid;
ALTER TABLE contracts ADD COLUMN principal_id oid;
ALTER TABLE message_types ADD COLUMN principal_id oid;

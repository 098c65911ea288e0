"""Ownership and the identity activated readers run as: no sequence of statements by a login
makes code run as a role that login could not already act as.

Microsoft's rules, from ALTER AUTHORIZATION (Transact-SQL), "Permissions": the login needs
TAKE OWNERSHIP on the entity, and "if the new owner is not the user that is executing this
statement, also requires, 1) IMPERSONATE permission on the new owner if it is a user or
login; or 2) if the new owner is a role, membership in the role, or ALTER permission on the
role". CREATE SERVICE, CONTRACT and MESSAGE TYPE ... AUTHORIZATION: the owner must be "the
name of the current user, the name of a user that the current user has IMPERSONATE permission
for, or the name of a role to which the current user belongs". CREATE / ALTER QUEUE ...
EXECUTE AS 'user_name' requires IMPERSONATE on that user. Here a role is a PostgreSQL role,
and IMPERSONATE, like membership, is the right to SET ROLE to it. ALTER on a role (SQL
Server's third way) has no analog that does not also lend the role's rights, so only
membership counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from airflow_broker import Broker
from airflow_broker.errors import BrokerError
from airflow_broker.transaction import Transaction
from airflow_broker.worker.activation import TARGETS_VARIABLE, ActivationManager
from tests.support import roles
from tests.support.helpers import wait_until
from tests.support.privileges import login, snapshot

# A procedure of the creator's own that records who runs it: the escalation's payload.
WHOAMI = """
CREATE PROCEDURE {schema}.usp_whoami() LANGUAGE plpgsql AS $$
DECLARE
    m record;
BEGIN
    FOR m IN SELECT * FROM broker.receive('q_own', 100, NULL, NULL) LOOP
        INSERT INTO {schema}.ran_as
        SELECT session_user, current_user, rolsuper FROM pg_roles WHERE rolname = session_user;
    END LOOP;
END
$$
"""


@dataclass
class Creator:
    """A login holding the CREATE permissions of an application and a schema of its own for
    its procedures, as a team lead's login would: nothing else."""

    dsn: str
    name: str
    schema: str

    def broker(self) -> Broker:
        return login(self.dsn, self.name)


@pytest.fixture
def creator(owned_dsn: str) -> Iterator[Creator]:
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS,
                    *(roles.broker_grant(p, "DATABASE") for p in roles.CREATE_PERMISSIONS),
                    prefix="lead", login=True) as name:
        schema = f"{name}_code"
        with psycopg.connect(owned_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(schema), sql.Identifier(name)))
        try:
            yield Creator(owned_dsn, name, schema)
        finally:
            with psycopg.connect(owned_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def other_app(owned_dsn: str) -> Iterator[str]:
    """Another application's login, of which the creator is not a member."""
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS, prefix="other", login=True) as name:
        yield name


def superuser(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper ORDER BY oid"
                           " LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])


def refused(dsn: str, app: Broker, number: int,
            statements: Callable[[Transaction], object]) -> BrokerError:
    """Runs ``statements`` (a callable taking a transaction) as ``app``: it must fail with
    ``number`` and leave every row of the database as it was."""
    before = snapshot(dsn)
    with pytest.raises(BrokerError) as denied, app.transaction() as tx:
        statements(tx)
    assert denied.value.number == number, denied.value
    assert snapshot(dsn) == before
    return denied.value


def create_own_dialog_objects(tx: Transaction) -> None:
    """A dialog's objects around the creator's queue q_own, all the creator's."""
    tx.create_message_type("own_Req")
    tx.create_contract("own_C", {"own_Req": "INITIATOR"})
    tx.create_queue("q_own_i")
    tx.create_service("own_I", "q_own_i")
    tx.create_service("own_T", "q_own", ["own_C"])


def test_the_escalation_through_execute_as_owner_is_refused_and_runs_nothing_as_the_superuser(
        creator: Creator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported attack: a login holding CREATE QUEUE creates a queue whose reader runs as
    its OWNER with a procedure of its own, then gives the queue to the superuser. The gift is
    refused; the worker runs the procedure as the creator, never as the superuser."""
    dsn = creator.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(creator.name)))
        conn.execute(sql.SQL("CREATE TABLE {}.ran_as (session_role name, acting_role name,"
                             " is_superuser boolean)").format(sql.Identifier(creator.schema)))
        conn.execute(sql.SQL(WHOAMI.format(schema=sql.Identifier(creator.schema).as_string(
            conn))))
    procedure = f"{creator.schema}.usp_whoami"
    with creator.broker() as app:
        with app.transaction() as tx:
            tx.create_queue("q_own", activation_procedure=procedure, max_queue_readers=1,
                            execute_as="OWNER")
            create_own_dialog_objects(tx)
        error = refused(dsn, app, 15151, lambda tx: tx.alter_authorization(
            "QUEUE::q_own", superuser(dsn)))
        assert superuser(dsn) in str(error)
        with app.transaction() as tx:
            handle = tx.begin_dialog("own_I", "own_T", "own_C")
            tx.send(handle, "own_Req", "run me")
    monkeypatch.delenv(TARGETS_VARIABLE, raising=False)
    with Broker(dsn) as worker_broker:
        manager = ActivationManager(worker_broker)
        try:
            assert manager.step() == 1
            wait_until(lambda: all(r.process.poll() is not None
                                   for r in manager.readers.values()),
                       "the activated procedure to finish")
        finally:
            manager.stop(timeout=30)
            manager.close()
    with psycopg.connect(dsn) as conn:
        ran_as = conn.execute(sql.SQL("SELECT session_role, acting_role, is_superuser"
                                      " FROM {}.ran_as").format(
            sql.Identifier(creator.schema))).fetchall()
    assert ran_as == [(creator.name, creator.name, False)]


@pytest.mark.parametrize("new_owner", ["superuser", "other application", "schema owner",
                                       "public", "a role that does not exist"])
@pytest.mark.parametrize("securable", ["QUEUE::q_own", "SERVICE::own_T", "CONTRACT::own_C",
                                       "MESSAGE TYPE::own_Req"])
def test_an_object_is_given_only_to_a_role_the_giver_may_act_as(
        creator: Creator, other_app: str, owner_role: str, new_owner: str,
        securable: str) -> None:
    """Transfer of any of the login's objects to a principal it cannot act as: 15151, as for
    a principal that does not exist, and nothing changes (the permissions on it included)."""
    principal = {"superuser": superuser(creator.dsn), "other application": other_app,
                 "schema owner": "SCHEMA OWNER", "public": "public",
                 "a role that does not exist": "no_such_role_x"}[new_owner]
    with creator.broker() as app:
        with app.transaction() as tx:
            tx.create_queue("q_own")
            create_own_dialog_objects(tx)
            tx.grant("CONTROL", securable, other_app)
        error = refused(creator.dsn, app, 15151,
                        lambda tx: tx.alter_authorization(securable, principal))
    assert "Cannot find the user" in str(error)


@pytest.mark.parametrize("kind", ["queue", "service", "contract", "message type"])
def test_creation_with_authorization_needs_the_right_to_act_as_the_owner(
        creator: Creator, other_app: str, kind: str) -> None:
    """CREATE ... AUTHORIZATION another application's role: refused with 15151, and the
    object is not created either."""
    def create(tx: Transaction) -> None:
        tx.create_queue("q_base")
        tx.create_message_type("base_M")
        if kind == "queue":
            tx.create_queue("q_given", authorization=other_app)
        elif kind == "service":
            tx.create_service("given", "q_base", authorization=other_app)
        elif kind == "contract":
            tx.create_contract("given", {"base_M": "ANY"}, authorization=other_app)
        else:
            tx.create_message_type("given", authorization=other_app)

    with creator.broker() as app:
        refused(creator.dsn, app, 15151, create)


def test_a_member_gives_an_object_to_its_role_and_the_grants_on_it_go(
        creator: Creator, other_app: str) -> None:
    """Membership of the new owner is enough; as SQL Server does, every permission on the
    object is dropped when it changes hands, and the new owner may run its reader."""
    with roles.role(creator.dsn, prefix="team") as team:
        roles.give(creator.dsn, team, f"GRANT {{}} TO {creator.name}")
        with creator.broker() as app, app.transaction() as tx:
            tx.create_queue("q_own", activation_procedure="x.usp", max_queue_readers=1,
                            execute_as="OWNER")
            tx.grant("RECEIVE", "QUEUE::q_own", other_app)
            tx.alter_authorization("QUEUE::q_own", team)
        with psycopg.connect(creator.dsn) as conn:
            assert conn.execute("SELECT pg_get_userbyid(principal_id) FROM broker.queues"
                                " WHERE name = 'q_own'").fetchone() == (team,)
            assert conn.execute("SELECT count(*) FROM broker.database_permissions"
                                " WHERE object_name = 'q_own'").fetchone() == (0,)
            assert conn.execute("SELECT execute_as FROM broker.monitored_queues"
                                " WHERE name = 'q_own'").fetchone() == (team,)


def test_take_ownership_lets_a_login_take_an_object_for_itself(
        creator: Creator, other_app: str) -> None:
    with Broker(creator.dsn) as admin, admin.transaction() as tx:
        tx.create_queue("q_admin")
        tx.grant("TAKE OWNERSHIP", "QUEUE::q_admin", creator.name)
    with creator.broker() as app, app.transaction() as tx:
        tx.alter_authorization("QUEUE::q_admin", creator.name)
    with psycopg.connect(creator.dsn) as conn:
        assert conn.execute("SELECT pg_get_userbyid(principal_id) FROM broker.queues"
                            " WHERE name = 'q_admin'").fetchone() == (creator.name,)


@pytest.mark.parametrize("change", ["procedure", "execute as owner"])
def test_alter_queue_on_anothers_queue_does_not_lend_its_owners_rights(
        creator: Creator, other_app: str, change: str) -> None:
    """ALTER on a queue another role owns, whose reader runs as that owner: choosing the code
    (PROCEDURE_NAME) or the identity (EXECUTE AS OWNER) needs the right to act as the owner
    (15517), or ALTER would be a way to run one's code with another's rights."""
    with Broker(creator.dsn) as admin, admin.transaction() as tx:
        tx.create_queue("q_theirs", activation_procedure="theirs.usp", max_queue_readers=1,
                        execute_as="OWNER" if change == "procedure" else None)
        tx.alter_authorization("QUEUE::q_theirs", other_app)
        tx.grant("ALTER", "QUEUE::q_theirs", creator.name)
    with creator.broker() as app:
        if change == "procedure":
            refused(creator.dsn, app, 15517, lambda tx: tx.alter_queue(
                "q_theirs", activation_procedure=f"{creator.schema}.usp_whoami"))
        else:
            refused(creator.dsn, app, 15517, lambda tx: tx.alter_queue(
                "q_theirs", execute_as="OWNER"))
        # What ALTER is for still works: turning the queue off and on.
        with app.transaction() as tx:
            tx.alter_queue("q_theirs", status=False)


def test_execute_as_a_role_needs_the_right_to_act_as_it_even_for_the_schemas_owner(
        owned_dsn: str, owner_role: str, other_app: str) -> None:
    """Membership of the schema's owner is the broker's rights, not every role's: a member
    naming a role it is not a member of gets 15517."""
    with roles.role(owned_dsn, f"GRANT {owner_role} TO {{}}", prefix="dba",
                    login=True) as dba, login(owned_dsn, dba) as app:
        refused(owned_dsn, app, 15517, lambda tx: tx.create_queue(
            "q_dba", activation_procedure="x.usp", max_queue_readers=1,
            execute_as=other_app))
        refused(owned_dsn, app, 15517, lambda tx: tx.create_queue(
            "q_dba", activation_procedure="x.usp", max_queue_readers=1,
            execute_as=superuser(owned_dsn)))

"""Every statement against every role: a sender, a reader, an administrator and an outsider,
each logged in as itself with the documented grants (docs/security.md). An allowed statement
does what it says; a denied one fails with SQL Server's number and leaves the database as it
was.

Each row's rule is Microsoft's, from the statement's "Permissions" section of its Transact-SQL
reference, as docs/security.md maps it onto roles: BEGIN DIALOG "requires RECEIVE permission
on the queue for the service specified in the FROM clause and REFERENCES permission for the
specified contract"; SEND, RECEIVE privileges on the queue of the sending or receiving
service; MOVE CONVERSATION, "the owner of the conversation and the conversation group"; the
CREATE statements, db_ddladmin or db_owner (here CREATE ... or CONTROL on DATABASE); ALTER and
DROP, "the owner of the queue" or db_ddladmin/db_owner (here ALTER or CONTROL on the object);
GRANT, DENY and REVOKE, "the grantor ... must have either the permission itself with GRANT
OPTION, or a higher permission that implies the permission being granted"; ALTER
AUTHORIZATION, TAKE OWNERSHIP plus IMPERSONATE on (or membership of) the new owner; EXECUTE
AS 'user', IMPERSONATE on the user; CREATE ROUTE, db_ddladmin or db_owner (here the schema's
owner alone). A login that may not see an object is told it does not exist (15151), as SQL
Server's metadata visibility does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.errors import BrokerError
from airflow_broker.transaction import Transaction
from tests.support import roles
from tests.support.privileges import Application, login, snapshot

APP = Application("")
ROLES = ("sender", "reader", "administrator", "outsider")


@dataclass
class Setup:
    """A dialog I -> T with one message waiting in q_t, and a second dialog of I to move the
    first one's group into."""

    dsn: str
    initiator: uuid.UUID
    target: uuid.UUID
    other_group: uuid.UUID
    queue_id: int
    other_role: str


@dataclass(frozen=True)
class Statement:
    run: Callable[[Transaction, Setup], object]
    allowed: frozenset[str]
    # The number a denied role gets: one for all, or by role where what the role may see
    # decides between "not found" (15151) and "denied" (4613, 229).
    denied_with: int | dict[str, int]
    # GET CONVERSATION GROUP only locks: its effect is its (asserted) result.
    changes: bool = True

    def number_for(self, kind: str) -> int:
        return self.denied_with if isinstance(self.denied_with, int) else self.denied_with[kind]


def begin_dialog(tx: Transaction, s: Setup) -> object:
    return tx.begin_dialog("I", "T", "C")


def send(tx: Transaction, s: Setup) -> object:
    tx.send(s.initiator, "Req", b"second")
    return None


def send_reply(tx: Transaction, s: Setup) -> object:
    tx.send(s.target, "Resp", b"reply")
    return None


def receive(tx: Transaction, s: Setup) -> object:
    (message,) = tx.receive("q_t")
    assert message.message_body == b"first"
    return message


def get_conversation_group(tx: Transaction, s: Setup) -> object:
    group = tx.get_conversation_group("q_t")
    assert group is not None
    return group


def end_conversation(tx: Transaction, s: Setup) -> object:
    tx.end_conversation(s.target)
    return None


def timer(tx: Transaction, s: Setup) -> object:
    tx.begin_conversation_timer(s.initiator, 60)
    return None


def move(tx: Transaction, s: Setup) -> object:
    tx.move_conversation(s.initiator, s.other_group)
    return None


def create_queue(tx: Transaction, s: Setup) -> object:
    return tx.create_queue("q_new")


def create_service(tx: Transaction, s: Setup) -> object:
    return tx.create_service("S_new", "q_t", ["C"])


def create_contract(tx: Transaction, s: Setup) -> object:
    return tx.create_contract("C_new", {"Req": "ANY"})


def create_message_type(tx: Transaction, s: Setup) -> object:
    return tx.create_message_type("M_new")


def alter_queue(tx: Transaction, s: Setup) -> object:
    tx.alter_queue("q_t", retention=True)
    return None


def drop_queue(tx: Transaction, s: Setup) -> object:
    tx.drop_queue("q_spare")
    return None


def create_event_notification(tx: Transaction, s: Setup) -> object:
    return tx.create_event_notification("disabled", "q_t", ["BROKER_QUEUE_DISABLED"], "I")


def grant(tx: Transaction, s: Setup) -> object:
    tx.grant("RECEIVE", "QUEUE::q_t", "public")
    return None


def deny(tx: Transaction, s: Setup) -> object:
    tx.deny("RECEIVE", "QUEUE::q_t", "public")
    return None


def revoke(tx: Transaction, s: Setup) -> object:
    tx.revoke("REFERENCES", "QUEUE::q_t", s.other_role)
    return None


def waitfor_receive(tx: Transaction, s: Setup) -> object:
    (message,) = tx.receive("q_t", waitfor=True, timeout=1)
    assert message.message_body == b"first"
    return message


def end_with_error(tx: Transaction, s: Setup) -> object:
    tx.end_conversation(s.target, error=50, description="refused")
    return None


def end_with_cleanup(tx: Transaction, s: Setup) -> object:
    tx.end_conversation(s.target, cleanup=True)
    return None


def alter_service(tx: Transaction, s: Setup) -> object:
    tx.alter_service("T", drop_contracts=["C"])
    return None


def drop_service(tx: Transaction, s: Setup) -> object:
    tx.drop_service("I_spare")
    return None


def drop_contract(tx: Transaction, s: Setup) -> object:
    tx.drop_contract("C_spare")
    return None


def alter_message_type(tx: Transaction, s: Setup) -> object:
    tx.alter_message_type("M_loose", "EMPTY")
    return None


def drop_message_type(tx: Transaction, s: Setup) -> object:
    tx.drop_message_type("M_loose")
    return None


def take_ownership(tx: Transaction, s: Setup) -> object:
    tx.alter_authorization("QUEUE::q_spare", str(runner_of(tx).scalar(b"SELECT session_user")))
    return None


def give_to_the_schema_owner(tx: Transaction, s: Setup) -> object:
    tx.alter_authorization("QUEUE::q_spare", "SCHEMA OWNER")
    return None


def execute_as_a_role(tx: Transaction, s: Setup) -> object:
    tx.alter_queue("q_spare", activation_procedure="app.usp_read", max_queue_readers=1,
                   execute_as=s.other_role)
    return None


def create_route(tx: Transaction, s: Setup) -> object:
    return tx.create_route("r_new", "postgresql://far.example/db")


# GRANT, DENY and REVOKE on q_t: not found for whoever may not see q_t, 4613 for its reader.
HIDDEN_Q_T_OR_4613 = {"sender": 15151, "reader": 4613, "outsider": 15151}

# A statement on a conversation handle answers a login that may not see the conversation (no
# RECEIVE on its service's queue, nor any other permission on that queue) as for a handle that
# does not exist, 8426: a 229 would name the queue behind the handle.
STATEMENTS = {
    # ... and a FROM service it may not see, as a service that does not exist (8423).
    "BEGIN DIALOG": Statement(begin_dialog, frozenset({"sender", "administrator"}), 8423),
    "SEND": Statement(send, frozenset({"sender", "administrator"}), 8426),
    "SEND reply": Statement(send_reply, frozenset({"reader", "administrator"}), 8426),
    "RECEIVE": Statement(receive, frozenset({"reader", "administrator"}), 229),
    "GET CONVERSATION GROUP": Statement(
        get_conversation_group, frozenset({"reader", "administrator"}), 229, changes=False),
    "END CONVERSATION": Statement(
        end_conversation, frozenset({"reader", "administrator"}), 8426),
    "BEGIN CONVERSATION TIMER": Statement(timer, frozenset({"sender", "administrator"}), 8426),
    "MOVE CONVERSATION": Statement(move, frozenset({"sender", "administrator"}), 8426),
    "CREATE QUEUE": Statement(create_queue, frozenset({"administrator"}), 262),
    "CREATE SERVICE": Statement(create_service, frozenset({"administrator"}), 262),
    "CREATE CONTRACT": Statement(create_contract, frozenset({"administrator"}), 262),
    "CREATE MESSAGE TYPE": Statement(create_message_type, frozenset({"administrator"}), 262),
    "ALTER QUEUE": Statement(alter_queue, frozenset({"administrator"}), 15151),
    "DROP QUEUE": Statement(drop_queue, frozenset({"administrator"}), 15151),
    "CREATE EVENT NOTIFICATION": Statement(
        create_event_notification, frozenset({"administrator"}), 15151),
    "GRANT": Statement(grant, frozenset({"administrator"}), HIDDEN_Q_T_OR_4613),
    "DENY": Statement(deny, frozenset({"administrator"}), HIDDEN_Q_T_OR_4613),
    "REVOKE": Statement(revoke, frozenset({"administrator"}), HIDDEN_Q_T_OR_4613),
    "WAITFOR (RECEIVE)": Statement(waitfor_receive, frozenset({"reader", "administrator"}),
                                   229),
    "END CONVERSATION WITH ERROR": Statement(
        end_with_error, frozenset({"reader", "administrator"}), 8426),
    # The peer is never told: the schema owner's alone (docs/security.md); 229 to a login
    # that may see the conversation.
    "END CONVERSATION WITH CLEANUP": Statement(
        end_with_cleanup, frozenset(),
        {"sender": 8426, "reader": 229, "administrator": 229, "outsider": 8426}),
    "ALTER SERVICE": Statement(alter_service, frozenset({"administrator"}), 15151),
    "DROP SERVICE": Statement(drop_service, frozenset({"administrator"}), 15151),
    "DROP CONTRACT": Statement(drop_contract, frozenset({"administrator"}), 15151),
    "ALTER MESSAGE TYPE": Statement(alter_message_type, frozenset({"administrator"}), 15151),
    "DROP MESSAGE TYPE": Statement(drop_message_type, frozenset({"administrator"}), 15151),
    "ALTER AUTHORIZATION to oneself": Statement(
        take_ownership, frozenset({"administrator"}), 15151),
    # CONTROL on DATABASE is not membership of the schema's owner.
    "ALTER AUTHORIZATION to SCHEMA OWNER": Statement(
        give_to_the_schema_owner, frozenset(), 15151),
    # Not even CONTROL on DATABASE lends another role's identity.
    "EXECUTE AS a role": Statement(
        execute_as_a_role, frozenset(),
        {"sender": 15151, "reader": 15151, "administrator": 15517, "outsider": 15151}),
    "CREATE ROUTE": Statement(create_route, frozenset(), 262),
}

GRANTS = {
    "sender": APP.sender_grants(),
    "reader": APP.reader_grants(),
    "administrator": (roles.broker_grant("CONTROL", "DATABASE"),),
    "outsider": (),
}


@pytest.fixture
def other_role(owned_dsn: str) -> Iterator[str]:
    with roles.role(owned_dsn, prefix="other", login=True) as name:
        yield name


@pytest.fixture
def setup(owned_dsn: str, other_role: str) -> Setup:
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        APP.create(tx)
        tx.create_queue("q_spare")
        tx.create_queue("q_svc")
        tx.create_service("I_spare", "q_svc")
        tx.create_message_type("M_spare")
        tx.create_message_type("M_loose")
        tx.create_contract("C_spare", {"M_spare": "ANY"})
        tx.grant("REFERENCES", "QUEUE::q_t", other_role)
        initiator = tx.begin_dialog("I", "T", "C")
        tx.send(initiator, "Req", b"first")
        other = tx.begin_dialog("I", "T", "C")
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        runner = runner_of(tx)
        target = runner.scalar(b"SELECT far_handle FROM broker.endpoints"
                               b" WHERE conversation_handle = %s", [initiator])
        other_group = runner.scalar(b"SELECT conversation_group_id FROM broker.endpoints"
                                    b" WHERE conversation_handle = %s", [other])
        queue_id = runner.scalar(b"SELECT object_id FROM broker.queues WHERE name = 'q_t'")
    return Setup(owned_dsn, initiator, target, other_group, queue_id, other_role)


@pytest.fixture(params=ROLES)
def principal(request: pytest.FixtureRequest, setup: Setup) -> Iterator[tuple[str, str]]:
    """(kind, role name): a login role with the grants of its kind."""
    kind: str = request.param
    with roles.role(setup.dsn, *roles.APPLICATION_GRANTS, *GRANTS[kind],
                    prefix=kind[:8], login=True) as name:
        yield kind, name


@pytest.mark.parametrize("statement", list(STATEMENTS))
def test_each_statement_is_allowed_or_denied_by_permission(
        statement: str, principal: tuple[str, str], setup: Setup) -> None:
    kind, name = principal
    case = STATEMENTS[statement]
    before = snapshot(setup.dsn)
    with login(setup.dsn, name) as app:
        if kind in case.allowed:
            with app.transaction() as tx:
                case.run(tx, setup)
            if case.changes:
                assert snapshot(setup.dsn) != before, f"{statement} as {kind} did nothing"
            return
        with pytest.raises(BrokerError) as denied, app.transaction() as tx:
            case.run(tx, setup)
    assert denied.value.number == case.number_for(kind), denied.value
    assert snapshot(setup.dsn) == before


@pytest.mark.parametrize("table", ["queue_messages", "endpoints", "route_defs", "permissions",
                                   "receive_log", "quarantine"])
def test_no_application_role_reads_or_writes_a_table(
        table: str, principal: tuple[str, str], setup: Setup) -> None:
    """Every way in goes through the functions' checks: no role, the administrator's
    included, holds a right on the tables themselves."""
    _, name = principal
    with psycopg.connect(roles.login_dsn(setup.dsn, name)) as conn:
        for statement in (f"SELECT * FROM broker.{table}", f"DELETE FROM broker.{table}"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.encode())
            conn.rollback()


@pytest.mark.parametrize(("call", "argument"), [
    ("broker.enqueue_local(%s, 3, 'forged'::bytea, 5::smallint)", "target"),
    ("broker.deliver_error(%s, -8494, 'forged')", "target"),
    ("broker.poison_disable(%s, 5, '{}'::uuid[])", "queue_id"),
    # A queue's whole row, activation procedure and EXECUTE AS included.
    ("broker.find_queue('q_t')", None),
])
def test_internal_functions_are_the_owners_alone(
        call: str, argument: str | None, principal: tuple[str, str], setup: Setup) -> None:
    """What delivery, the worker and the administrator use inside the broker (injecting a
    message, failing a conversation, disabling a queue, reading a queue's definition) is not
    executable by applications."""
    _, name = principal
    before = snapshot(setup.dsn)
    with psycopg.connect(roles.login_dsn(setup.dsn, name)) as conn, \
            pytest.raises(psycopg.errors.InsufficientPrivilege) as denied:
        conn.execute(f"SELECT {call}".encode(), [getattr(setup, argument)] if argument else [])
    assert call.split("(")[0].removeprefix("broker.") in str(denied.value)
    assert snapshot(setup.dsn) == before

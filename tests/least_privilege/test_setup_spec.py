"""BrokerSetupOperator's spec (apply_spec) applied by logins, as an Airflow deployment's
connection runs it: an administrator holding only the CREATE permissions sets up and re-applies
its application, sees no other application's objects, and can neither take them over nor create
what the schema's owner alone may."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.errors import CreatePermissionDenied, ObjectExists
from airflow_broker.operators.setup import apply_spec
from tests.support import roles
from tests.support.privileges import login, snapshot

NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"


def spec(prefix: str) -> dict[str, Any]:
    return {
        "message_types": [{"name": f"{prefix}Req"}],
        "contracts": [{"name": f"{prefix}C", "message_types": {f"{prefix}Req": "INITIATOR"}}],
        "queues": [{"name": f"{prefix}q_i"},
                   {"name": f"{prefix}q_t", "poison_threshold": 3},
                   {"name": f"{prefix}alerts"}],
        "services": [{"name": f"{prefix}I", "queue_name": f"{prefix}q_i"},
                     {"name": f"{prefix}T", "queue_name": f"{prefix}q_t",
                      "contracts": [f"{prefix}C"]},
                     {"name": f"{prefix}Alerts", "queue_name": f"{prefix}alerts",
                      "contracts": [NOTIFICATION]}],
        "event_notifications": [{"name": f"{prefix}disabled", "queue_name": f"{prefix}q_t",
                                 "events": ["BROKER_QUEUE_DISABLED"],
                                 "service_name": f"{prefix}Alerts"}],
    }


@pytest.fixture
def administrator(owned_dsn: str) -> Iterator[str]:
    """A login holding USAGE and the CREATE permissions an application's setup needs."""
    grants = [roles.broker_grant(p, "DATABASE") for p in roles.CREATE_PERMISSIONS]
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS, *grants, prefix="setup",
                    login=True) as name:
        yield name


def apply(dsn: str, role_name: str, wanted: dict[str, Any]) -> dict[str, list[str]]:
    with login(dsn, role_name) as broker, broker.transaction() as tx:
        return apply_spec(tx, wanted).as_dict()


def test_an_administrator_sets_up_its_application_and_applies_it_again(
        owned_dsn: str, administrator: str) -> None:
    first = apply(owned_dsn, administrator, spec("s_"))
    assert len(first["created"]) == 9 and not first["altered"]
    # Read back through the definitions it may see: nothing to do the second time.
    again = apply(owned_dsn, administrator, spec("s_"))
    assert again == {"created": [], "altered": [], "unchanged": first["created"]}
    changed = spec("s_")
    changed["queues"][1]["poison_threshold"] = 4
    assert apply(owned_dsn, administrator, changed)["altered"] == ["queue s_q_t"]

    # It owns what it created, so it runs its application with no further grant.
    with login(owned_dsn, administrator) as broker:
        with broker.transaction() as tx:
            handle = tx.begin_dialog("s_I", "s_T", "s_C")
            tx.send(handle, "s_Req", "<order/>")
        # Four rolled-back receives disable the queue (poison_threshold 4), and the
        # application's own session, resolving them, fires its event notification.
        for _ in range(4):
            with pytest.raises(RuntimeError), broker.transaction() as tx:
                (message,) = tx.receive("s_q_t", waitfor=True, timeout=5)
                assert message.message_body == b"<order/>"
                raise RuntimeError("the reader fails")
        with broker.transaction() as tx:
            runner_of(tx).scalar(b"SELECT broker.resolve_receives()")
            assert runner_of(tx).run(b"SELECT is_receive_enabled FROM broker.service_queues"
                                     b" WHERE name = 's_q_t'") == [(False,)]
        with broker.transaction() as tx:
            (event,) = tx.receive("s_alerts", waitfor=True, timeout=5)
            assert "BROKER_QUEUE_DISABLED" in (event.message_body or b"").decode("utf-16")
    with Broker(owned_dsn) as owner, owner.transaction() as tx:
        owned = runner_of(tx).run(b"SELECT q.name FROM broker.queues q JOIN pg_roles r"
                                  b" ON r.oid = q.principal_id WHERE r.rolname = %s ORDER BY 1",
                                  [administrator])
        # The broker's own event-notification service, created then, is the schema owner's.
        system = runner_of(tx).run(b"SELECT principal_id FROM broker.queues"
                                   b" WHERE name = 'EventNotificationQueue'")
    assert [name for (name,) in owned] == ["s_alerts", "s_q_i", "s_q_t"]
    assert system == [(None,)]


def test_another_applications_objects_are_neither_seen_nor_taken_over(
        owned_dsn: str, administrator: str) -> None:
    apply(owned_dsn, administrator, spec("s_"))
    grants = [roles.broker_grant(p, "DATABASE") for p in roles.CREATE_PERMISSIONS]
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS, *grants, prefix="rival",
                    login=True) as rival:
        before = snapshot(owned_dsn)
        # Its own definitions are invisible to the rival, so the spec tries to create the
        # message type, which exists: 2714, and nothing of the spec is applied.
        with pytest.raises(ObjectExists) as exists:
            apply(owned_dsn, rival, spec("s_"))
        assert exists.value.number == 2714
        assert snapshot(owned_dsn) == before


def test_a_login_without_create_permissions_changes_nothing(owned_dsn: str) -> None:
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS, prefix="outsider",
                    login=True) as outsider:
        before = snapshot(owned_dsn)
        with pytest.raises(CreatePermissionDenied) as denied:
            apply(owned_dsn, outsider, spec("o_"))
        assert denied.value.number == 262
        assert "CREATE MESSAGE TYPE" in str(denied.value)
        assert snapshot(owned_dsn) == before


@pytest.mark.parametrize("section,entry,permission", [
    ("routes", {"name": "far", "service_name": "//Far", "address": "LOCAL"}, "CREATE ROUTE"),
    ("xml_schema_collections", {"name": "xs", "schemas": ["<xs:schema/>"]},
     "CREATE XML SCHEMA COLLECTION"),
])
def test_routes_and_schema_collections_are_the_owners(owned_dsn: str, administrator: str,
                                                     section: str, entry: dict[str, Any],
                                                     permission: str) -> None:
    before = snapshot(owned_dsn)
    with pytest.raises(CreatePermissionDenied) as denied:
        apply(owned_dsn, administrator, {section: [entry]})
    assert permission in str(denied.value)
    assert snapshot(owned_dsn) == before

"""The broker's pages in Airflow's UI, in a real browser (Debian's Chromium driven by
Playwright) against the deployment's api-server, which loads the plugin from the installed
wheel's entry point.

Screenshots go to the session's folder, or to the folder AIRFLOW_BROKER_UI_SCREENSHOTS names
(docs/ui holds the ones the documentation shows).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from airflow_broker import Broker
from tests.fixtures.system import ROLE_USERS, USERNAME, SystemDatabases
from tests.support import roles
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.helpers import target_handle
from tests.support.quarantine import (
    PoisonedQueue,
    poisoned_queue,
    quarantine_received,
    quarantined,
)

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # the failure is the browser fixture's, with its reason
    sync_playwright = None  # type: ignore[assignment]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# A guard against a hang (the page polls the API every few seconds), not a performance bound.
GUARD_MS = 120_000

QUEUE = "ui_trades_q"
TRADE = "//UI/Trade"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if sync_playwright is None:
        pytest.fail("the UI tests need Playwright for Python: pip install -e '.[dev]' "
                    "(constraints.txt pins it)")
    if not CHROMIUM.exists():
        pytest.fail(f"the UI tests need Chromium at {CHROMIUM}: apt-get install -y chromium "
                    "(.ci/run installs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def screenshots(system_home: Path) -> Path:
    folder = Path(os.environ.get("AIRFLOW_BROKER_UI_SCREENSHOTS") or system_home / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def poisoned(system_databases: SystemDatabases, airflow_deployment: Deployment,
             ) -> PoisonedQueue:
    """A trading queue no reader serves: two trades its reader quarantined, and a third whose
    five rolled-back receives made poison detection disable the queue."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            tx.create_message_type(TRADE)
            tx.create_contract("//UI/TradeContract", {TRADE: "INITIATOR"})
            tx.create_queue("ui_desk_q")
            tx.create_queue(QUEUE)
            tx.create_service("//UI/Desk", "ui_desk_q")
            tx.create_service("//UI/Settlement", QUEUE, ["//UI/TradeContract"])
        # The operator recipe of docs/security.md for this queue: its readers' RECEIVE (the
        # queue's messages, its quarantine, replay) and ALTER (enable, disable).
        system_databases.grant_ui(roles.broker_grant("RECEIVE", f"QUEUE::{QUEUE}"),
                                  roles.broker_grant("ALTER", f"QUEUE::{QUEUE}"))
        return poisoned_queue(
            broker, "//UI/Desk", "//UI/Settlement", "//UI/TradeContract", TRADE, QUEUE,
            ["<trade id='1'/>", "<trade id='2'/>", "<trade id='3'>BAD</trade>"],
            error="ValueError: no settlement account for trade")


def open_page(browser: Browser, deployment: Deployment, role: str, color_scheme: str,
              path: str = "plugin/broker") -> Page:
    """A browser tab logged in as the deployment's user with ``role``, as Airflow's login
    page leaves it: the token in the ``_token`` cookie."""
    user = USERNAME if role == "admin" else ROLE_USERS[role]
    response = httpx.post(f"{deployment.api_url}/auth/token",
                          json={"username": user, "password": deployment.passwords[user]})
    assert response.status_code == 201, response.text
    context = browser.new_context(color_scheme=color_scheme,  # type: ignore[arg-type]
                                  viewport={"width": 1400, "height": 900})
    context.set_default_timeout(GUARD_MS)
    context.add_cookies([{"name": "_token", "value": response.json()["access_token"],
                          "url": deployment.api_url}])
    page = context.new_page()
    page.goto(f"{deployment.api_url}/{path}")
    return page


def queue_row(page: Page) -> Any:
    return page.get_by_test_id(f"queue-row-{QUEUE}")


def test_the_plugin_is_in_airflows_menu_and_serves_its_bundle(
        airflow_deployment: Deployment, airflow_api: AirflowApi) -> None:
    plugins = {p["name"]: p for p in airflow_api.get("/api/v2/plugins")["plugins"]}
    apps = {(a["name"], a["destination"], a["url_route"])
            for a in plugins["airflow_broker_ui"]["react_apps"]}
    assert apps == {("Broker", "nav", "broker"), ("Broker", "dag", "broker-dag"),
                    ("Broker", "task_instance", "broker-task-instance")}
    api = airflow_deployment.api_url
    bundle = httpx.get(f"{api}/broker/static/broker-ui.umd.cjs")
    assert bundle.status_code == 200
    assert bundle.headers["content-type"].startswith("application/javascript")
    assert httpx.get(f"{api}/broker/api/overview").status_code == 401


def test_a_viewer_sees_the_poisoned_queue_but_no_actions(
        browser: Browser, airflow_deployment: Deployment, poisoned: PoisonedQueue) -> None:
    page = open_page(browser, airflow_deployment, "viewer", "light")
    row = queue_row(page)
    expect(row).to_have_attribute("data-enabled", "false")
    expect(row.get_by_test_id("disabled-by")).to_contain_text(str(poisoned.poison_message_id))
    expect(page.get_by_test_id("enable-queue")).to_have_count(0)
    expect(page.get_by_test_id("disable-queue")).to_have_count(0)
    row.get_by_test_id("quarantine-link").click()
    expect(page.get_by_test_id("quarantine-row")).to_have_count(2)
    expect(page.get_by_test_id("replay-and-enable")).to_have_count(0)
    expect(page.get_by_test_id("select-message")).to_have_count(0)
    page.context.close()


def test_an_operator_replays_and_enables_in_one_click_and_the_queue_drains(
        browser: Browser, airflow_deployment: Deployment, poisoned: PoisonedQueue,
        system_databases: SystemDatabases, screenshots: Path) -> None:
    dark = open_page(browser, airflow_deployment, "op", "dark")
    expect(queue_row(dark)).to_have_attribute("data-enabled", "false")
    dark.screenshot(path=screenshots / "overview-dark.png", full_page=True)
    queue_row(dark).get_by_test_id("quarantine-link").click()
    expect(dark.get_by_test_id("quarantine-group")).to_have_count(1)
    dark.screenshot(path=screenshots / "quarantine-dark.png", full_page=True)
    dark.get_by_test_id("to-queue").click()
    expect(dark.get_by_test_id("message-row")).to_have_count(1)
    dark.screenshot(path=screenshots / "queue-dark.png", full_page=True)
    dark.context.close()

    page = open_page(browser, airflow_deployment, "op", "light")
    row = queue_row(page)
    expect(row).to_have_attribute("data-enabled", "false")
    expect(row.get_by_test_id("queue-state")).to_contain_text("POISON")
    expect(row.get_by_test_id("disabled-by")).to_contain_text(str(poisoned.poison_message_id))
    expect(row.get_by_test_id("queue-depth")).to_have_text("1")
    page.screenshot(path=screenshots / "overview-light.png", full_page=True)

    row.get_by_test_id("quarantine-link").click()
    expect(page.get_by_test_id("quarantine-row")).to_have_count(2)
    expect(page.get_by_test_id("quarantine-error").first).to_contain_text(
        "no settlement account")
    # One error, one group; the body filter narrows to the trade it names.
    expect(page.get_by_test_id("quarantine-group")).to_have_count(1)
    expect(page.get_by_test_id("group-count")).to_have_text("2")
    page.get_by_test_id("body-filter").fill("id='2'")
    expect(page.get_by_test_id("quarantine-row")).to_have_count(1)
    page.get_by_test_id("body-filter").fill("")
    page.get_by_test_id("since-filter").select_option(label="the last day")
    expect(page.get_by_test_id("quarantine-row")).to_have_count(2)
    # The group's button selects all its messages, shown or not.
    page.get_by_test_id("group-select").click()
    expect(page.get_by_test_id("quarantine-count")).to_contain_text("2 selected")
    page.screenshot(path=screenshots / "quarantine-light.png", full_page=True)
    page.get_by_test_id("replay-and-enable").click()
    expect(page.get_by_test_id("replay-done")).to_contain_text("2 message(s) replayed")
    expect(page.get_by_test_id("quarantine-empty")).to_be_visible()

    page.get_by_test_id("to-queue").click()
    expect(page.get_by_test_id("message-row")).to_have_count(3)
    expect(page.get_by_test_id("queue-summary")).to_contain_text("Enabled")
    page.screenshot(path=screenshots / "queue-light.png", full_page=True)
    # MAX_QUEUE_READERS from the queue page (activation stays off: the deployment's worker
    # would start readers).
    expect(page.get_by_test_id("activation-state")).to_have_text("off")
    page.get_by_test_id("activation-readers").fill("2")
    page.get_by_test_id("activation-readers-set").click()
    expect(page.get_by_test_id("activation-max-readers")).to_have_text("2")

    # The application's reader, fixed, takes the three trades.
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker, \
            broker.transaction() as tx:
        trades = [m.text() for m in tx.receive(QUEUE, 10)]
    assert trades == ["<trade id='1'/>", "<trade id='2'/>", "<trade id='3'>BAD</trade>"]

    page.get_by_test_id("to-overview").click()
    row = queue_row(page)
    expect(row).to_have_attribute("data-enabled", "true")
    # The overview refreshes itself: the drained queue shows without a reload.
    expect(row.get_by_test_id("queue-depth")).to_have_text("0")
    expect(row.get_by_test_id("queue-state")).to_have_text(re.compile("enabled"))
    # A RECEIVE while the overview is open shows as a receive rate above zero.
    expect(row.get_by_test_id("receive-rate")).to_have_text("0.00")
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            tx.send(tx.begin_dialog("//UI/Desk", "//UI/Settlement", "//UI/TradeContract"),
                    TRADE, "<trade id='4'/>")
        with broker.transaction() as tx:
            assert len(tx.receive(QUEUE, 10)) == 1
    expect(row.get_by_test_id("receive-rate")).to_have_text(re.compile(r"^(0\.0[1-9]|0\.[1-9]|[1-9])"))
    page.context.close()


def test_an_operator_discards_a_quarantined_message_once_asked_again(
        browser: Browser, airflow_deployment: Deployment, system_databases: SystemDatabases,
        ) -> None:
    """Discard cannot be undone: the page asks once more, naming how many, and only then
    takes the message out of the quarantine for good (nothing returns to the queue)."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            tx.send(tx.begin_dialog("//UI/Desk", "//UI/Settlement", "//UI/TradeContract"),
                    TRADE, "<trade id='5'>DUPLICATE</trade>")
        [discarded] = quarantine_received(broker, QUEUE, 1, "ValueError: duplicate trade 5")

    page = open_page(browser, airflow_deployment, "op", "light",
                     f"plugin/broker?queue={QUEUE}&page=quarantine")
    expect(page.get_by_test_id("quarantine-row")).to_have_count(1)
    expect(page.get_by_test_id("discard")).to_be_disabled()
    page.get_by_test_id("select-message").check()
    page.get_by_test_id("discard").click()
    expect(page.get_by_test_id("discard-confirmation")).to_contain_text("Discard 1 message(s)?")
    page.get_by_test_id("discard-cancel").click()
    expect(page.get_by_test_id("discard-confirmation")).to_have_count(0)
    expect(page.get_by_test_id("quarantine-row")).to_have_count(1)
    page.get_by_test_id("discard").click()
    page.get_by_test_id("discard-confirm").click()
    expect(page.get_by_test_id("replay-done")).to_contain_text("1 message(s) discarded")
    expect(page.get_by_test_id("quarantine-empty")).to_be_visible()
    page.context.close()

    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        assert quarantined(broker, QUEUE) == []
        with broker.transaction() as tx:
            assert tx.receive(QUEUE, 10) == []
    with psycopg.connect(system_databases.broker_dsn) as conn:
        row = conn.execute("SELECT status FROM broker.quarantine WHERE quarantine_id = %s",
                           [discarded]).fetchone()
    assert row == ("discarded",)


def test_health_and_conversations_as_the_least_privileged_login(
        browser: Browser, airflow_deployment: Deployment, system_databases: SystemDatabases,
        screenshots: Path) -> None:
    """Health shows doctor's findings (the checks the UI's login may not run say so) and runs
    them again on a click; Conversations flags a fire-and-forget leak, and its cleanup, once
    the handle is typed, is the broker's to refuse (229: WITH CLEANUP is the owner's)."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            tx.create_queue("ui_leak_q")
            tx.create_service("//UI/Audit", "ui_leak_q", ["//UI/TradeContract"])
        # docs/security.md's read-only UI, with RECEIVE where it is to read.
        system_databases.grant_ui(roles.broker_grant("RECEIVE", "QUEUE::ui_leak_q"))
        with broker.transaction() as tx:
            initiator = tx.begin_dialog("//UI/Desk", "//UI/Audit", "//UI/TradeContract")
            tx.send(initiator, TRADE, "<trade id='4'/>")
            tx.end_conversation(initiator)
        with broker.transaction() as tx:
            [received, _] = tx.receive("ui_leak_q", 10)
            tx.end_conversation(received.conversation_handle)
    leak = str(received.conversation_handle)

    page = open_page(browser, airflow_deployment, "op", "light", "plugin/broker?page=health")
    expect(page.get_by_test_id("health-state")).to_be_visible()
    first = page.get_by_test_id("health-checked-at").inner_text()
    expect(page.get_by_test_id("health-finding").first).to_be_visible()
    page.get_by_test_id("health-rerun").click()
    expect(page.get_by_test_id("health-checked-at")).not_to_have_text(first)
    page.screenshot(path=screenshots / "health-light.png", full_page=True)

    page.get_by_test_id("to-conversations").click()
    row = page.get_by_test_id("conversation-row").filter(has_text=leak)
    expect(row).to_have_attribute("data-leaked", "true")
    row.get_by_test_id("cleanup-start").click()
    expect(row.get_by_test_id("cleanup-submit")).to_be_disabled()
    row.get_by_test_id("cleanup-confirm").fill(leak)
    page.screenshot(path=screenshots / "conversations-light.png", full_page=True)
    row.get_by_test_id("cleanup-submit").click()
    expect(row.get_by_test_id("error")).to_contain_text("229")
    expect(page.get_by_test_id("conversation-row").filter(has_text=leak)).to_have_count(1)

    # An open conversation ended WITH ERROR from the page: the initiator gets the Error.
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            initiator = tx.begin_dialog("//UI/Desk", "//UI/Audit", "//UI/TradeContract")
            tx.send(initiator, TRADE, "<trade id='5'/>")
        with broker.transaction() as tx:
            [trade] = tx.receive("ui_leak_q", 1)
        target = str(trade.conversation_handle)
        row = page.get_by_test_id("conversation-row").filter(has_text=target)
        row.get_by_test_id("end-error-start").click()
        expect(row.get_by_test_id("end-error-submit")).to_be_disabled()
        row.get_by_test_id("end-error-code").fill("50002")
        row.get_by_test_id("end-error-description").fill("audit stopped by an operator")
        row.get_by_test_id("end-error-submit").click()
        # The endpoint is closed, and nothing more may be done with it from the page.
        expect(row).to_contain_text("CLOSED")
        expect(row.get_by_test_id("end-error-start")).to_have_count(0)
        with broker.transaction() as tx:
            [error] = tx.receive("ui_desk_q", conversation_handle=initiator)
            tx.end_conversation(initiator)
        assert error.is_error
        assert (error.error().code, error.error().description) == (
            50002, "audit stopped by an operator")

    # One conversation end to end: the audit's endpoint (the login may RECEIVE from its queue,
    # not from the desk's) and the trade waiting on it, light and dark.
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            waiting = tx.begin_dialog("//UI/Desk", "//UI/Audit", "//UI/TradeContract")
            tx.send(waiting, TRADE, "<trade id='6'/>")
        audit = str(target_handle(broker, waiting))
    dark = open_page(browser, airflow_deployment, "op", "dark",
                     "plugin/broker?page=health")
    expect(dark.get_by_test_id("health-finding").first).to_be_visible()
    dark.screenshot(path=screenshots / "health-dark.png", full_page=True)
    dark.get_by_test_id("to-conversations").click()
    expect(dark.get_by_test_id("conversation-row").filter(has_text=audit)).to_have_count(1)
    # Native controls follow the dark theme, as Airflow's own do.
    expect(dark.get_by_test_id("state-filter")).to_have_css("color-scheme", "dark")
    expect(page.get_by_test_id("state-filter")).to_have_css("color-scheme", "light")
    dark.screenshot(path=screenshots / "conversations-dark.png", full_page=True)
    for shown, scheme in ((page, "light"), (dark, "dark")):
        shown.get_by_test_id("conversation-row").filter(has_text=audit).get_by_test_id(
            "conversation-link").click()
        detail = shown.get_by_test_id("conversation-detail")
        expect(detail.get_by_test_id("conversation-endpoint")).to_have_count(1)
        expect(detail.get_by_test_id("conversation-endpoint")).to_contain_text("//UI/Audit")
        expect(detail.get_by_test_id("conversation-message")).to_have_count(1)
        expect(detail.get_by_test_id("conversation-message")).to_contain_text("<trade id='6'/>")
        shown.screenshot(path=screenshots / f"conversation-{scheme}.png", full_page=True)
    dark.context.close()
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            [trade] = tx.receive("ui_leak_q", 1, conversation_handle=uuid.UUID(audit))
            tx.end_conversation(trade.conversation_handle)
        with broker.transaction() as tx:
            [ended] = tx.receive("ui_desk_q", 1, conversation_handle=waiting)
            assert ended.is_end_dialog
            tx.end_conversation(waiting)
    page.context.close()


FAR = "//UI/FarSettlement"


def test_transmission_shows_a_message_waiting_on_a_route_and_retries_it(
        browser: Browser, airflow_deployment: Deployment, poisoned: PoisonedQueue,
        system_databases: SystemDatabases, screenshots: Path) -> None:
    """A trade for a far broker that does not answer waits in the transmission queue: the
    page shows its route, the deployment's transport's failure and, to an operator whose UI
    login may RECEIVE from the sending service's queue, Retry now."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            # Nothing listens on port 1; the address's password is the page's to hide.
            tx.create_route("ui_far_route", "postgresql://far:s3cret@127.0.0.1:1/far",
                            service_name=FAR)
            handle = tx.begin_dialog("//UI/Desk", FAR, "//UI/TradeContract")
            tx.send(handle, TRADE, "<trade id='5'/>")
        # docs/security.md: Retry now takes RECEIVE on the sending service's queue.
        system_databases.grant_ui(roles.broker_grant("RECEIVE", "QUEUE::ui_desk_q"))
        try:
            viewer = open_page(browser, airflow_deployment, "viewer", "light",
                               "plugin/broker?page=transmission")
            row = viewer.get_by_test_id("transmission-row").filter(has_text=FAR)
            # The deployment's broker worker tried it and backs off.
            expect(row.get_by_test_id("transmission-status")).to_contain_text("unreachable")
            expect(row.get_by_test_id("transmission-delivery")).to_have_text("remote")
            expect(row.get_by_test_id("transmission-messages")).to_contain_text("1")
            expect(row.get_by_test_id("retry-now")).to_have_count(0)
            assert "s3cret" not in viewer.content()
            viewer.context.close()

            dark = open_page(browser, airflow_deployment, "op", "dark",
                             "plugin/broker?page=transmission")
            row = dark.get_by_test_id("transmission-row").filter(has_text=FAR)
            expect(row.get_by_test_id("transmission-status")).to_contain_text("unreachable")
            expect(row.get_by_test_id("retry-now")).to_be_visible()
            dark.screenshot(path=screenshots / "transmission-dark.png", full_page=True)
            dark.context.close()

            page = open_page(browser, airflow_deployment, "op", "light")
            page.get_by_test_id("to-transmission").click()
            row = page.get_by_test_id("transmission-row").filter(has_text=FAR)
            expect(row.get_by_test_id("transmission-status")).to_contain_text("unreachable")
            page.screenshot(path=screenshots / "transmission-light.png", full_page=True)
            row.get_by_test_id("retry-now").click()
            expect(page.get_by_test_id("retry-done")).to_contain_text(
                f"1 message(s) to {FAR} due now")
            page.context.close()
        finally:
            # Later tests' doctor finds no route to nowhere and nothing waiting for it.
            with broker.transaction() as tx:
                tx.end_conversation(handle, cleanup=True)
                tx.drop_route("ui_far_route")


def test_the_broker_tabs_of_a_dag_and_of_a_finished_task_instance(
        browser: Browser, airflow_deployment: Deployment, airflow_api: AirflowApi,
        system_databases: SystemDatabases, screenshots: Path) -> None:
    """broker_stock_trade's tab lists TraderQueue, which its sensor and receiver use, with
    its state; a trade's send, finished while the trader waits for the brokerage (paused
    here), shows the conversation it sent on, still open, and its far service."""
    dag_id = "broker_stock_trade"
    airflow_api.wait_for_dag(dag_id)
    airflow_api.wait_for_dag("broker_stock_trade_brokerage")
    airflow_api.set_paused("broker_stock_trade_brokerage", True)
    airflow_api.unpause(dag_id)
    run_id = airflow_api.trigger(dag_id)
    airflow_deployment.wait_for(
        lambda: airflow_api.task_states(dag_id, run_id).get("send_trade_3") == "success",
        "the trader's trades sent")
    # docs/security.md: the conversations of a queue's services are its readers' to see.
    system_databases.grant_ui(roles.broker_grant("RECEIVE", "QUEUE::TraderQueue"))
    try:
        for scheme in ("light", "dark"):
            page = open_page(browser, airflow_deployment, "viewer", scheme,
                             f"dags/{dag_id}/plugin/broker-dag")
            row = page.get_by_test_id("dag-queue-TraderQueue")
            # Airflow's DAG and task pages load more than the plugin's page before the tab's
            # bundle: seconds on a busy machine, past expect()'s default of five.
            expect(row.get_by_test_id("queue-state")).to_have_text(re.compile("enabled"),
                                                                   timeout=GUARD_MS)
            expect(row).to_contain_text("wait_for_brokerage")
            expect(row).to_contain_text("receive_acknowledgements")
            page.screenshot(path=screenshots / f"dag-tab-{scheme}.png", full_page=True)
            if scheme == "light":
                # To the broker's page of that queue.
                row.get_by_test_id("queue-link").click()
                expect(page.get_by_test_id("queue-summary")).to_be_visible()
            page.context.close()

        handle = airflow_api.xcom(dag_id, run_id, "begin_dialog")
        for scheme in ("light", "dark"):
            page = open_page(browser, airflow_deployment, "viewer", scheme,
                             f"dags/{dag_id}/runs/{run_id}/tasks/send_trade_1"
                             "/plugin/broker-task-instance")
            expect(page.get_by_test_id("ti-field-conversation_handle")).to_contain_text(
                handle, timeout=GUARD_MS)
            expect(page.get_by_test_id("ti-field-message_type_name")).to_contain_text(
                "//Trading/TradeEntry")
            conversation = page.get_by_test_id("ti-conversation")
            expect(conversation).to_contain_text(handle)
            expect(conversation).to_contain_text("//Trading/BrokerageService")
            # Open: the brokerage has not answered (STARTED_OUTBOUND until its side exists).
            expect(conversation).to_have_attribute("data-state", re.compile("^(SO|CO)$"))
            expect(page.get_by_test_id("no-inbox")).to_be_visible()
            page.screenshot(path=screenshots / f"task-instance-tab-{scheme}.png",
                            full_page=True)
            page.context.close()
    finally:
        # The brokerage acknowledges, the run completes, and the conversation ends.
        airflow_api.unpause("broker_stock_trade_brokerage")
        assert airflow_api.wait_for_run(dag_id, run_id)["state"] == "success"
        airflow_api.set_paused("broker_stock_trade_brokerage", True)

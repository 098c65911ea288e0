"""QueueDisabledNotifier: the queue-disabled alert, sent through Airflow's notifier mechanism.

By default it e-mails through the SMTP provider (``SmtpNotifier``); give ``notifier=`` to send
through any other BaseNotifier (Slack, Teams, ...). The event a QueueDisabledSensor returned
is in the template context as ``broker_event``, so subjects and bodies can say which queue,
when and why::

    QueueDisabledSensor(task_id="wait_for_disable", queue_names=["BrokerageQueue"],
                        on_success_callback=QueueDisabledNotifier(to="ops@example.com"))
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseNotifier

if TYPE_CHECKING:
    from airflow.sdk import Context

DEFAULT_SUBJECT = (
    "[airflow-broker] queue {{ broker_event.queue_name }} disabled "
    "({{ broker_event.reason }})"
)
DEFAULT_HTML = """\
<h3>Service Broker queue {{ broker_event.queue_name }} was disabled</h3>
<table>
<tr><td>Queue</td><td>{{ broker_event.schema_name }}.{{ broker_event.queue_name }}</td></tr>
<tr><td>Database</td><td>{{ broker_event.database_name }}</td></tr>
<tr><td>Event time (UTC)</td><td>{{ broker_event.post_time }}</td></tr>
<tr><td>Reason</td><td>{{ broker_event.reason }}: {{ broker_event.reason_text }}</td></tr>
<tr><td>Reported by</td><td>{{ ti.dag_id }} / {{ ti.task_id }} ({{ ti.run_id }})</td></tr>
</table>
<p>Poison-message detection disables a queue after five consecutive rolled-back
transactions that received from it. Fix the reader or remove the message, then enable the
queue again: <code>airflow-broker enable-queue {{ broker_event.queue_name }}</code> or the
EnableQueueOperator.</p>
"""


class QueueDisabledNotifier(BaseNotifier):
    """Sends the alert for a BROKER_QUEUE_DISABLED event.

    :param to: recipients of the e-mail (when no ``notifier`` is given)
    :param from_email: sender (default: the SMTP connection's ``from_email`` extra)
    :param smtp_conn_id: the SMTP connection (default: ``[email] email_conn_id``, else
        ``smtp_default``)
    :param subject: Jinja template; ``broker_event`` holds the event
    :param html_content: Jinja template of the body
    :param notifier: another BaseNotifier to send through instead of e-mail
    :param event_task_id: the task whose XCom holds the event (default: the task the
        notifier runs for, which is what ``on_success_callback`` of the sensor needs)
    """

    template_fields = ("event_task_id",)

    def __init__(
        self,
        *,
        to: str | Iterable[str] | None = None,
        from_email: str | None = None,
        smtp_conn_id: str | None = None,
        subject: str = DEFAULT_SUBJECT,
        html_content: str = DEFAULT_HTML,
        notifier: BaseNotifier | None = None,
        event_task_id: str | None = None,
    ) -> None:
        super().__init__()
        if notifier is None and not to:
            raise ValueError("give the recipients (to=...) or another notifier (notifier=...)")
        self.to = to
        self.from_email = from_email
        self.smtp_conn_id = smtp_conn_id
        self.subject = subject
        self.html_content = html_content
        self.notifier = notifier
        self.event_task_id = event_task_id

    def event(self, context: Context) -> dict[str, Any]:
        """The queue-disabled event: the context's ``broker_event``, else the XCom of
        ``event_task_id`` (or of the task the notifier runs for)."""
        values = cast("Mapping[str, Any]", context)
        given = values.get("broker_event")
        if isinstance(given, Mapping):
            return dict(given)
        ti = values["ti"]
        task_id = self.event_task_id or ti.task_id
        pulled = ti.xcom_pull(task_ids=task_id)
        if not isinstance(pulled, Mapping) or "queue_name" not in pulled:
            raise ValueError(f"task {task_id!r} returned no queue-disabled event: {pulled!r}")
        return dict(pulled)

    def _target(self) -> BaseNotifier:
        if self.notifier is not None:
            # Rendering replaces a notifier's template fields, so each alert renders a copy.
            return copy.copy(self.notifier)
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        return SmtpNotifier(to=self.to or [], from_email=self.from_email,
                            smtp_conn_id=self.smtp_conn_id, subject=self.subject,
                            html_content=self.html_content)

    def notify(self, context: Context) -> None:
        values = cast("dict[str, Any]", context)
        values["broker_event"] = self.event(context)
        self.log.info("sending the alert for queue %s", values["broker_event"].get("queue_name"))
        self._target()(context)


__all__ = ["DEFAULT_HTML", "DEFAULT_SUBJECT", "QueueDisabledNotifier"]

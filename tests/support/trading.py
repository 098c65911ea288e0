"""The reader tests' trading application: trades sent on the standard application's
conversations, booked in public.results by the handlers of tests/support/reader_handlers.py."""

from __future__ import annotations

import uuid

import psycopg

from airflow_broker.readers.queue_reader import QueueReader, ReaderConfig
from tests.support.brokers import App
from tests.support.helpers import count


def create_results(app: App) -> App:
    """public.results, where the handlers book the trades (``booked``: in commit order)."""
    with psycopg.connect(app.broker.dsn) as conn:
        conn.execute("CREATE TABLE public.results (message_id uuid PRIMARY KEY,"
                     " conversation_handle uuid, sequence bigint, trade text, pid integer,"
                     " booked bigserial)")
    return app


def send_trades(app: App, conversations: int, per_conversation: int,
                bad: set[tuple[int, int]] = frozenset()) -> list[uuid.UUID]:  # type: ignore[assignment]
    handles = []
    with app.broker.transaction() as tx:
        for c in range(conversations):
            h = tx.begin_dialog("I", "T", "C")
            handles.append(h)
            for i in range(per_conversation):
                body = "<trade id='broken" if (c, i) in bad else f"<trade id='{c}-{i}'/>"
                tx.send(h, "Req", body)
    return handles


def reader(app: App, handler: str = "tests.support.reader_handlers:book_trade",
           **options: object) -> QueueReader:
    options = {"idle_exit": 0.5, "waitfor_timeout": 0.2, **options}
    config = ReaderConfig(queue_name="q_t", handler=handler, reply_message_type="Resp",
                          **options)  # type: ignore[arg-type]
    return QueueReader(app.broker, config)


def booked(app: App) -> int:
    return count(app.broker, "SELECT count(*) FROM public.results")

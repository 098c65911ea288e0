"""The queue reader and its poison strategies (spec 18), without Spark."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from airflow_broker.cli import main
from airflow_broker.poison import quarantine
from airflow_broker.readers.queue_reader import ReaderConfig
from airflow_broker.worker import BrokerWorker
from tests.support.brokers import App
from tests.support.helpers import count
from tests.support.quarantine import quarantined
from tests.support.trading import booked, create_results, reader, send_trades


@pytest.fixture
def trading(app: App) -> App:
    create_results(app)
    with psycopg.connect(app.broker.dsn) as conn:
        conn.execute("CREATE TABLE public.handler_fixed (fixed boolean)")
        conn.execute("INSERT INTO public.handler_fixed VALUES (false)")
    return app



def test_quarantine_moves_the_bad_message_aside(trading: App) -> None:
    send_trades(trading, 4, 5, bad={(1, 2)})
    stats = reader(trading).run()
    assert (stats.received, stats.processed, stats.quarantined, stats.replied) == (20, 19, 1, 19)
    assert booked(trading) == 19
    (q,) = quarantined(trading.broker, "q_t")
    assert (q.message_sequence_number, q.attempts, q.status) == (2, 1, "quarantined")
    assert "XMLSyntaxError" in q.error
    with psycopg.connect(trading.broker.dsn) as conn:
        tb = conn.execute("SELECT traceback FROM broker.quarantine").fetchone()
    assert tb and "etree.fromstring" in tb[0]
    with trading.broker.transaction() as tx:
        acks = tx.receive("q_i")
    assert len(acks) == 19 or len(acks) < 19  # one group per RECEIVE; counted below
    assert count(trading.broker, "SELECT count(*) FROM broker.queue_messages"
                                 " WHERE message_type_id = (SELECT message_type_id FROM"
                                 " broker.message_types WHERE name = 'Resp')") + len(acks) == 19


def test_replay_after_the_fix_processes_the_message_once(
    trading: App, capsys: pytest.CaptureFixture[str]
) -> None:
    send_trades(trading, 2, 3)
    stats = reader(trading, "tests.support.reader_handlers:flaky_until_fixed").run()
    assert stats.quarantined == 6 and booked(trading) == 0
    assert main(["quarantine", "list", "--dsn", trading.broker.dsn, "--queue", "q_t"]) == 0
    assert "6 quarantined messages" in capsys.readouterr().out
    with psycopg.connect(trading.broker.dsn) as conn:
        conn.execute("UPDATE public.handler_fixed SET fixed = true")
    ids = [q.quarantine_id for q in quarantined(trading.broker, "q_t")]
    assert main(["quarantine", "replay", *map(str, ids), "--dsn", trading.broker.dsn]) == 0
    stats = reader(trading, "tests.support.reader_handlers:flaky_until_fixed").run()
    assert stats.processed == 6 and booked(trading) == 6
    with psycopg.connect(trading.broker.dsn) as conn:
        order = conn.execute("SELECT conversation_handle, array_agg(sequence ORDER BY trade)"
                             " FROM public.results GROUP BY 1").fetchall()
    assert all(seqs == [0, 1, 2] for _, seqs in order)
    assert quarantined(trading.broker, "q_t") == []
    # A replayed message cannot be replayed again, and a closed conversation refuses replays.
    with pytest.raises(Exception, match="50111"), trading.broker.transaction() as tx:
        quarantine.replay(tx, ids[:1])


def test_replay_refused_once_the_conversation_ended(trading: App) -> None:
    send_trades(trading, 1, 1, bad={(0, 0)})
    reader(trading).run()
    (q,) = quarantined(trading.broker, "q_t")
    with trading.broker.transaction() as tx:
        tx.end_conversation(q.conversation_handle)
    with pytest.raises(Exception, match="50112"), trading.broker.transaction() as tx:
        quarantine.replay(tx, [q.quarantine_id])
    with trading.broker.transaction() as tx:
        assert quarantine.discard(tx, [q.quarantine_id]) == 1
    assert quarantined(trading.broker) == []


def test_end_conversation_strategy(trading: App) -> None:
    handles = send_trades(trading, 2, 3, bad={(0, 1)})
    stats = reader(trading, strategy="end_conversation").run()
    assert stats.ended == 1 and booked(trading) == 3 + 1  # conversation 1, and 0's first trade
    with trading.broker.transaction() as tx:
        errors = [m for m in tx.receive("q_i", conversation_handle=handles[0]) if m.is_error]
    assert len(errors) == 1 and errors[0].error().code == 500
    assert "XMLSyntaxError" in errors[0].error().description


def test_a_strategy_of_ones_own_is_named_by_its_import_path(trading: App) -> None:
    handles = send_trades(trading, 2, 3, bad={(0, 1)})
    stats = reader(trading, strategy="tests.support.reader_handlers:EndMalformedTrades").run()
    assert stats.ended == 1 and stats.quarantined == 0 and booked(trading) == 3 + 1
    with trading.broker.transaction() as tx:
        errors = [m for m in tx.receive("q_i", conversation_handle=handles[0]) if m.is_error]
    assert len(errors) == 1 and "XMLSyntaxError" in errors[0].error().description


def test_retry_strategy_is_bounded_by_attempts(trading: App) -> None:
    send_trades(trading, 1, 2, bad={(0, 0)})
    stats = reader(trading, strategy="retry", max_attempts=3).run()
    # Two rollbacks, then the third attempt quarantines it and the rest goes on.
    assert stats.retried == 2 and stats.quarantined == 1 and booked(trading) == 1
    (q,) = quarantined(trading.broker, "q_t")
    assert q.attempts == 3
    assert count(trading.broker, "SELECT count(*) FROM broker.service_queues"
                                 " WHERE name = 'q_t' AND is_receive_enabled") == 1


def test_disable_strategy_leaves_it_to_poison_detection(trading: App) -> None:
    send_trades(trading, 1, 1, bad={(0, 0)})
    stats = reader(trading, strategy="disable").run()
    assert stats.retried == 5
    assert count(trading.broker, "SELECT count(*) FROM broker.queue_status"
                                 " WHERE name = 'q_t' AND disabled_reason = 'POISON'") == 1


def test_timer_retry_keeps_the_conversation_in_order(trading: App) -> None:
    send_trades(trading, 1, 3)
    worker = BrokerWorker(trading.broker, activation=False)
    r = reader(trading, "tests.support.reader_handlers:flaky_until_fixed", strategy="timer_retry",
               max_attempts=3, retry_delay=30)
    stats = r.run()
    # The first message failed and was parked; the two after it wait behind it.
    assert stats.retried == 1 and booked(trading) == 0
    assert [q.status for q in quarantined(trading.broker)] == ["retrying"] * 3
    trading.broker.advance_clock(dt.timedelta(seconds=31))
    worker.run_once()
    stats = r.run()  # the DialogTimer: the retry fails again, a new timer is set
    assert stats.retried == 2 and booked(trading) == 0
    with psycopg.connect(trading.broker.dsn) as conn:
        conn.execute("UPDATE public.handler_fixed SET fixed = true")
    trading.broker.advance_clock(dt.timedelta(seconds=31))
    worker.run_once()
    r.run()
    assert booked(trading) == 3
    with psycopg.connect(trading.broker.dsn) as conn:
        seqs = [s for (s,) in conn.execute("SELECT sequence FROM public.results ORDER BY trade")]
    assert seqs == [0, 1, 2]
    assert quarantined(trading.broker) == []


def test_timer_retry_gives_up_after_max_attempts(trading: App) -> None:
    send_trades(trading, 1, 1)
    worker = BrokerWorker(trading.broker, activation=False)
    r = reader(trading, "tests.support.reader_handlers:flaky_until_fixed", strategy="timer_retry",
               max_attempts=2, retry_delay=10)
    r.run()
    trading.broker.advance_clock(dt.timedelta(seconds=11))
    worker.run_once()
    r.run()
    (q,) = quarantined(trading.broker)
    assert (q.status, q.attempts) == ("quarantined", 2)


def test_batch_handler_with_dataframes(trading: App) -> None:
    send_trades(trading, 3, 4, bad={(2, 3)})
    stats = reader(trading, "tests.support.reader_handlers:book_trades", batch=True).run()
    assert (stats.processed, stats.quarantined) == (11, 1)
    assert booked(trading) == 11


def test_end_dialog_and_errors_end_the_conversation(trading: App) -> None:
    (handle,) = send_trades(trading, 1, 2)
    with trading.broker.transaction() as tx:
        tx.end_conversation(handle)
    stats = reader(trading).run()
    assert stats.ended == 1 and booked(trading) == 2
    assert count(trading.broker, "SELECT count(*) FROM broker.endpoints"
                                 " WHERE NOT is_initiator AND state = 'CD'") == 1


def test_reader_config_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="poison strategy"):
        ReaderConfig(queue_name="q", handler="m:f", strategy="hope")
    with pytest.raises(ValueError):
        ReaderConfig(queue_name="q", handler="m:f", batch_size=0)

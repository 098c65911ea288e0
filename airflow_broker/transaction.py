"""The one object every broker statement is called on."""

from __future__ import annotations

from airflow_broker.catalog import CatalogStatements
from airflow_broker.conversations import ConversationStatements
from airflow_broker.receiving import ReceiveStatements


class Transaction(CatalogStatements, ConversationStatements, ReceiveStatements):
    """Broker statements on one connection, in its current transaction.

    Everything a statement does commits or rolls back with the caller's own work on the same
    connection. As with any PostgreSQL error, a failed statement aborts the transaction; use
    ``savepoint()`` around a statement whose failure you want to survive.
    """

    def savepoint(self):  # type: ignore[no-untyped-def]
        """``with tx.savepoint(): ...`` rolls back only the block on error."""
        return self.conn.transaction()

"""The handler of s_cluster_readers, a module of the DAGs folder: books each trade into
public.cluster_results with the reader's host and process, in the reader's transaction;
bodies that say "poison" fail."""

from __future__ import annotations

import os
import socket
import time
from typing import Any


def book(message: Any, ctx: Any) -> None:
    body = message.text() or ""
    if "poison" in body:
        raise ValueError(f"cannot book {body!r}")
    # A little work per message, so a reader can be killed in the middle of the queue.
    time.sleep(0.003)
    ctx.tx.conn.execute("INSERT INTO public.cluster_results (message_id, conversation_handle,"
                        " sequence, body, host, pid) VALUES (%s, %s, %s, %s, %s, %s)",
                        [message.message_id, message.conversation_handle,
                         message.message_sequence_number, body, socket.gethostname(),
                         os.getpid()])

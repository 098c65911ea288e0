"""What the demos print: one line at a time, at once (the demo's output is read as it runs,
also through a pipe)."""

from __future__ import annotations


def say(text: str, *, prefix: str = "") -> None:
    print(f"{prefix}{text}", flush=True)

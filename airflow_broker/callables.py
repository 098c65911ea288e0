"""Callables named by text, as every part of the project takes them: reader handlers,
activation targets, poison strategies and operator callbacks, all resolved the standard
library's way (``pkgutil.resolve_name``)."""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from typing import Any

from airflow_broker.errors import IncorrectSyntax


def split_name(name: str, what: str = "handler") -> tuple[str, str]:
    """``package.module:function`` as its module and attribute (``what`` names it in
    errors)."""
    module, _, attribute = name.partition(":")
    if not module or not attribute:
        raise IncorrectSyntax(f"{what} {name!r} is not of the form package.module:function")
    return module, attribute


def load_callable(target: str | Callable[..., Any], what: str = "handler") -> Callable[..., Any]:
    """A callable as it is, or the one named ``package.module:function`` (or
    ``package.module.function``)."""
    if callable(target):
        return target
    if "." not in target and ":" not in target:
        raise IncorrectSyntax(f"{what} {target!r} is not of the form package.module:function")
    obj = pkgutil.resolve_name(target)
    if not callable(obj):
        raise TypeError(f"{what} {target!r} is not callable")
    result: Callable[..., Any] = obj
    return result

"""GRANT, DENY and REVOKE of Service Broker permissions, ALTER AUTHORIZATION, and
sys.database_permissions (docs/security.md).

A securable is named as in T-SQL: ``"SERVICE::Ordering"``, ``"CONTRACT::TradeContract"``,
``"MESSAGE TYPE::Trade"``, ``"QUEUE::OrderQueue"`` (or just ``"OrderQueue"``), ``"DATABASE"``.
Principals are PostgreSQL roles, or ``"public"``. The database enforces every permission, for
psql, Spark and Airflow alike; these are the statements that change them.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_broker._statements import Statements


@dataclass(frozen=True)
class Permission:
    """A row of ``database_permissions``."""

    class_desc: str
    object_name: str
    grantee: str
    permission_name: str
    state_desc: str


class PermissionStatements(Statements):
    __slots__ = ()

    def grant(self, permission: str, on: str, to: str, *,
              with_grant_option: bool = False) -> None:
        """GRANT ``permission`` ON ``on`` TO ``to`` [WITH GRANT OPTION]."""
        q = self._runner.function("grant_permission", 4, ["text", "text", "text", "boolean"])
        self._runner.run(q, [permission, on, to, with_grant_option])

    def deny(self, permission: str, on: str, to: str) -> None:
        """DENY ``permission`` ON ``on`` TO ``to``: wins over every GRANT to the role and to
        the roles it is a member of."""
        runner = self._runner
        runner.run(runner.function("deny_permission", 3, ["text", "text", "text"]),
                   [permission, on, to])

    def revoke(self, permission: str, on: str, to: str) -> None:
        """REVOKE ``permission`` ON ``on`` FROM ``to``: removes a GRANT or a DENY."""
        runner = self._runner
        runner.run(runner.function("revoke_permission", 3, ["text", "text", "text"]),
                   [permission, on, to])

    def alter_authorization(self, on: str, to: str) -> None:
        """ALTER AUTHORIZATION ON ``on`` TO ``to``; ``"SCHEMA OWNER"`` gives the object back
        to the owner of the broker schema."""
        runner = self._runner
        runner.run(runner.function("alter_authorization", 2, ["text", "text"]), [on, to])

    def database_permissions(self) -> list[Permission]:
        """Every GRANT and DENY on the broker's objects."""
        rows = self._runner.run(self._runner.queries["database_permissions"])
        return [Permission(*row) for row in rows]

"""The broker's resources in the FAB auth manager's database.

FAB grants only resources it finds in Airflow's metadata database: ``airflow roles add-perms``,
its roles API and ``[fab] custom_roles`` refuse a name it does not know ("Resource named
'Broker' does not exist"). It creates the resources of its own views itself; a plugin's pages
have none until something creates them, so under FAB nobody, Admin included, could open the
broker's pages. :func:`register_resources` creates each permission the pages ask about
(``access.ASKED``: GET and POST, which FAB calls ``can_read`` and ``can_create``, on the
broker's resources) and gives them to Admin, as FAB gives Admin every permission of its own
views.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_broker.ui import access

# FAB's names for the methods the pages ask with (its map of methods to actions).
ACTIONS = {"GET": "can_read", "POST": "can_create"}


class NotFab(LookupError):
    """The configured auth manager is not FAB's: it keeps no list of resources to add to."""


@dataclass
class Registered:
    admin_role: str
    created: list[tuple[str, str]] = field(default_factory=list)
    existing: list[tuple[str, str]] = field(default_factory=list)


def _fab_is_configured() -> None:
    from airflow.api_fastapi.app import get_auth_manager_cls

    configured = get_auth_manager_cls()
    name = f"{configured.__module__}.{configured.__qualname__}"
    try:
        from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager
    except ImportError:
        raise NotFab(name) from None
    if not issubclass(configured, FabAuthManager):
        raise NotFab(name)


def register_resources() -> Registered:
    """Creates the broker's resources and permissions in FAB's tables, where missing, and
    adds each permission to the Admin role; running it again changes nothing."""
    _fab_is_configured()
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    with get_application_builder() as appbuilder:
        manager = appbuilder.sm
        admin = (manager.find_role(manager.auth_role_admin)
                 or manager.add_role(manager.auth_role_admin))
        done = Registered(admin_role=admin.name)
        for method, resource in access.ASKED:
            action = ACTIONS[method]
            known = manager.get_permission(action, resource)
            (done.existing if known is not None else done.created).append((action, resource))
            manager.add_permission_to_role(
                admin, known or manager.create_permission(action, resource))
    return done

"""Errors raised by broker statements: one class per SQL Server error number, under a few
families a caller can catch at once.

``BrokerError(8426, text)`` builds the class registered for 8426 (``ConversationNotFound``),
so an error raised in SQL and one raised in Python are the same class; ``exc.number`` is the
number either way. Numbers from 50100 up are airflow-broker's own. docs/errors.md lists
them all, and a test holds this module, that page and the SQL's ``error_messages`` to one
another.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import psycopg

# The SQL functions raise SQLSTATE SB000 with "Msg <number>: <text>".
BROKER_SQLSTATE = "SB000"
INVALID_TEXT_REPRESENTATION = "22P02"
_MSG = re.compile(r"^Msg (\d+): (.*)$", re.DOTALL)

_BY_NUMBER: dict[int, type[BrokerError]] = {}


class BrokerError(Exception):
    """A Service Broker statement failed; ``number`` is SQL Server's error number.

    Raised as ``BrokerError(number, text)`` (which builds the number's own class) or as
    ``ConversationNotFound(text)``."""

    number: ClassVar[int] = 0

    def __init_subclass__(cls, *, number: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if number is not None:
            if number in _BY_NUMBER:
                raise TypeError(f"error {number} is {_BY_NUMBER[number].__name__} already")
            _BY_NUMBER[number] = cls
            cls.number = number

    def __new__(cls, *args: Any, **kwargs: Any) -> BrokerError:
        if cls is BrokerError and args and isinstance(args[0], int):
            cls = _BY_NUMBER.get(args[0], BrokerError)
        return super().__new__(cls)

    def __init__(self, *args: Any) -> None:
        if args and isinstance(args[0], int):
            number, message = args[0], str(args[1]) if len(args) > 1 else ""
        else:
            number, message = type(self).number, str(args[0]) if args else ""
        super().__init__(f"Msg {number}: {message}")
        # An instance may carry a number its class does not (BrokerError(n) for a number
        # with no class of its own).
        self.number = number  # type: ignore[misc]
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (BrokerError, (self.number, self.message))


def error_class(number: int) -> type[BrokerError]:
    """The class of error ``number`` (BrokerError itself for a number without one)."""
    return _BY_NUMBER.get(number, BrokerError)


def error_classes() -> dict[int, type[BrokerError]]:
    return dict(_BY_NUMBER)


# Families

class InvalidArgument(BrokerError, ValueError):
    """A statement's argument is missing, malformed, too long or out of range."""


class NotFound(BrokerError):
    """A statement names a queue, service, contract, message type, conversation or group that
    does not exist (where the statement looks for it)."""


class InvalidState(BrokerError):
    """The statement is well formed, but what it acts on does not allow it now."""


class ContractViolation(BrokerError):
    """A message or a conversation goes against its contract or its service."""


class Unsupported(BrokerError):
    """Something Service Broker does that airflow-broker does differently on PostgreSQL."""


class PermissionDenied(BrokerError):
    """The session's login lacks a broker permission the statement needs (docs/security.md)."""


# InvalidArgument

class IncorrectSyntax(InvalidArgument, number=102):
    """An unknown option value, a queue name starting with #, TIMEOUT without WAITFOR, ..."""


class NameTooLong(InvalidArgument, number=103):
    """A name longer than 128 characters (256 for services)."""


class NameMissing(InvalidArgument, number=1038):
    """A name is missing or empty."""


class NotAHandle(InvalidArgument, number=8169):
    """A conversation handle or group id that is not a UUID nor the text of one."""


class DuplicateMessageTypeInContract(InvalidArgument, number=8403):
    """CREATE CONTRACT lists a message type twice."""


class DuplicateContractInService(InvalidArgument, number=8404):
    """CREATE / ALTER SERVICE lists a contract twice."""


class LifetimeIsNull(InvalidArgument, number=8406):
    """BEGIN DIALOG with a NULL LIFETIME."""


class LifetimeOutOfRange(InvalidArgument, number=8411):
    """BEGIN DIALOG with a LIFETIME outside 1 to 2,147,483,647 seconds."""


class ServiceNameTooLong(InvalidArgument, number=8412):
    """BEGIN DIALOG's TO SERVICE is longer than 256 characters."""


class BrokerInstanceTooLong(InvalidArgument, number=8413):
    """BEGIN DIALOG's broker instance is longer than 128 characters."""


class RelatedConversationAndGroup(InvalidArgument, number=8414):
    """BEGIN DIALOG with both RELATED_CONVERSATION and RELATED_CONVERSATION_GROUP."""


class HandleInUse(InvalidArgument, number=50125):
    """BEGIN DIALOG given a conversation handle that an endpoint already has."""


class RunIdInUse(InvalidArgument, number=50126):
    """A reader run begun with the id of a run of another queue."""


class OwnerOnlyPermission(InvalidArgument, number=50127):
    """GRANT, DENY or REVOKE of CREATE ROUTE or CREATE XML SCHEMA COLLECTION, which only the
    schema's owner and its members hold."""


class ContractNameIsNull(InvalidArgument, number=8417):
    """BEGIN DIALOG without a contract."""


class HandleIsNull(InvalidArgument, number=8418):
    """SEND, END, TIMER or MOVE without a conversation handle."""


class ErrorCodeAndDescriptionMissing(InvalidArgument, number=8419):
    """END CONVERSATION WITH ERROR without a code and a description."""


class GroupIdIsNull(InvalidArgument, number=8420):
    """MOVE CONVERSATION without a destination group."""


class ServiceNameIsNull(InvalidArgument, number=8421):
    """BEGIN DIALOG without a service name."""


class ErrorCodeIsNull(InvalidArgument, number=8422):
    """END CONVERSATION WITH ERROR without a code."""


class ErrorDescriptionIsNull(InvalidArgument, number=8424):
    """END CONVERSATION WITH ERROR without a description."""


class BodyIsNull(InvalidArgument, number=8433):
    """SEND of a NULL body expression (SQL only; an omitted body is empty)."""


class ContractWithoutInitiatorMessage(InvalidArgument, number=8492):
    """CREATE CONTRACT with no message type the initiator may send."""


class NothingToAlter(InvalidArgument, number=8493):
    """ALTER SERVICE with nothing to change."""


class RouteAddressEmpty(InvalidArgument, number=9659):
    """CREATE / ALTER ROUTE with an empty ADDRESS or MIRROR_ADDRESS."""


class RouteAddressTooLong(InvalidArgument, number=9660):
    """CREATE / ALTER ROUTE with an address longer than 256 characters."""


class MirrorAddressIncomplete(InvalidArgument, number=9661):
    """MIRROR_ADDRESS without both SERVICE_NAME and BROKER_INSTANCE."""


class BrokerInstanceWithoutService(InvalidArgument, number=9662):
    """A route's BROKER_INSTANCE without SERVICE_NAME."""


class MirrorOfLocalRoute(InvalidArgument, number=9743):
    """MIRROR_ADDRESS with a LOCAL or TRANSPORT address."""


class InvalidRouteAddress(InvalidArgument, number=9744):
    """Not a route address: LOCAL, TRANSPORT, postgresql://... or airflow://conn_id."""


class TransportRouteWithService(InvalidArgument, number=9745):
    """ADDRESS = 'TRANSPORT' together with SERVICE_NAME."""


class RouteLifetimeOutOfRange(InvalidArgument, number=9746):
    """A route's LIFETIME outside 1 to 2,147,483,647 seconds."""


class MirrorSameAsAddress(InvalidArgument, number=9747):
    """A route's ADDRESS and MIRROR_ADDRESS are the same."""


class DuplicateHandleInSend(InvalidArgument, number=50102):
    """A conversation handle appears twice in one SEND."""


class ValueOutOfRange(InvalidArgument, number=50106):
    """A value out of range (MAX_QUEUE_READERS, TOP, TIMEOUT, ...)."""


class InvalidXmlSchema(InvalidArgument, number=50107):
    """CREATE XML SCHEMA COLLECTION with a document that is not a valid XML Schema."""


class InvalidErrorCode(InvalidArgument, number=50109):
    """END CONVERSATION WITH ERROR with a code of 0 or less (negative codes are the
    broker's)."""


class InvalidEventType(InvalidArgument, number=50110):
    """CREATE EVENT NOTIFICATION for an event type other than QUEUE_ACTIVATION or
    BROKER_QUEUE_DISABLED."""


class QueueNameWithPeriod(InvalidArgument, number=50121):
    """CREATE QUEUE with a period in the name (it separates a schema from a queue name)."""


class MessageTooLarge(InvalidArgument, number=50122):
    """SEND of a body larger than the maximum message size, 64 MiB."""


class InvalidSpec(InvalidArgument, number=50123):
    """A broker spec (BrokerSetupOperator, ``apply_spec``) that is not a valid one."""


class AddressError(InvalidRouteAddress):
    """A route address that does not name a reachable broker (raised in Python when the
    transport or the doctor resolves it)."""


# NotFound

class InvalidObjectName(NotFound, number=208):
    """RECEIVE or GET CONVERSATION GROUP on a queue that does not exist."""


class ServiceNotFound(NotFound, number=8423):
    """BEGIN DIALOG's FROM SERVICE does not exist."""


class ContractNotFound(NotFound, number=8425):
    """BEGIN DIALOG or CREATE SERVICE names a contract that does not exist."""


class ConversationNotFound(NotFound, number=8426):
    """A conversation handle that does not exist (or is not on that queue)."""


class MessageTypeNotFound(NotFound, number=8428):
    """SEND or CREATE CONTRACT names a message type that does not exist."""


class GroupNotFound(NotFound, number=8436):
    """RECEIVE WHERE conversation_group_id names a group not on that queue."""


class ObjectNotFound(NotFound, number=15151):
    """ALTER or DROP (and a few CREATEs) name an object or schema that does not exist."""


class NotInInbox(NotFound, number=50120):
    """BrokerHook.consume() of messages that are not in the Airflow inbox."""


# InvalidState

class ObjectExists(InvalidState, number=2714):
    """CREATE of an object whose name is taken."""


class ObjectInUse(InvalidState, number=3729):
    """DROP of an object still referenced."""


class TimerAfterLifetime(InvalidState, number=8410):
    """BEGIN CONVERSATION TIMER that would fire after the conversation's lifetime."""


class ConversationAlreadyEnded(InvalidState, number=8427):
    """END CONVERSATION on an endpoint that has ended already."""


class ConversationNotOpen(InvalidState, number=8429):
    """SEND on an endpoint whose state does not allow it."""


class MoveOfEndedConversation(InvalidState, number=8438):
    """MOVE CONVERSATION of an ended conversation."""


class TimerOnEndedConversation(InvalidState, number=8458):
    """BEGIN CONVERSATION TIMER on an ended conversation."""


class QueueDisabledError(InvalidState, number=9617):
    """RECEIVE or GET CONVERSATION GROUP on a queue whose STATUS is OFF."""


class SenderQueueDisabled(InvalidState, number=9618):
    """SEND while the sender's queue is disabled and has RETENTION ON."""


class ActivationConflictsWithNotification(InvalidState, number=9717):
    """ALTER QUEUE enabling activation where a QUEUE_ACTIVATION notification exists."""


class NotificationConflictsWithActivation(InvalidState, number=9718):
    """CREATE EVENT NOTIFICATION QUEUE_ACTIVATION on a queue with internal activation."""


class SystemObject(InvalidState, number=15247):
    """ALTER or DROP of a system object."""


class QueueViewReadOnly(InvalidState, number=50101):
    """INSERT, UPDATE or DELETE on a queue's view."""


class QuarantineSettled(InvalidState, number=50111):
    """Replay or discard of a quarantined message already replayed or discarded."""


class PoisonDetectionUnavailable(InvalidState, number=50124):
    """RECEIVE by a role that cannot record its receiving transactions for poison-message
    detection (the RECEIVE rolls back with the caller's transaction)."""


class QuarantineConversationClosed(InvalidState, number=50112):
    """Replay of a quarantined message whose conversation can no longer receive."""


# ContractViolation

class MessageTypeNotInContract(ContractViolation, number=8431):
    """SEND of a message type not in the conversation's contract."""


class InitiatorCannotSend(ContractViolation, number=8432):
    """The initiator sends a message type SENT BY TARGET."""


class TargetCannotSend(ContractViolation, number=8434):
    """The target sends a message type SENT BY INITIATOR."""


class GroupOfAnotherService(ContractViolation, number=8439):
    """MOVE CONVERSATION into a group of another service."""


class RelatedConversationOfAnotherService(ContractViolation, number=9610):
    """BEGIN DIALOG related to a conversation or group of another service."""


# PermissionDenied

class ObjectPermissionDenied(PermissionDenied, number=229):
    """RECEIVE on a queue (RECEIVE, SEND, BEGIN DIALOG, END, timers, MOVE), or REFERENCES on a
    contract, message type or queue, is missing or denied."""


class CreatePermissionDenied(PermissionDenied, number=262):
    """CREATE QUEUE, SERVICE, CONTRACT or MESSAGE TYPE without the permission to; CREATE
    ROUTE or XML SCHEMA COLLECTION by anyone but the schema's owner."""


class GrantorLacksPermission(PermissionDenied, number=4613):
    """GRANT, DENY or REVOKE by a login that does not own the object, has no CONTROL on it,
    and does not hold the permission WITH GRANT OPTION."""


class PermissionToOwnerOrSelf(PermissionDenied, number=4624):
    """GRANT, DENY or REVOKE to the object's owner, the schema's owner, a superuser or the
    grantor itself: such a permission could never take effect."""


class AlterDatabaseDenied(PermissionDenied, number=5011):
    """ALTER DATABASE's broker options (ENABLE_BROKER, NEW_BROKER, ...) by a login that is
    not a member of the broker schema's owner."""


class CannotImpersonate(PermissionDenied, number=15517):
    """EXECUTE AS a role the login may not act as, or ALTER QUEUE choosing the procedure or
    identity of a reader that would run as such a role."""


# Unsupported

class SchemaValidationNeedsPython(Unsupported, number=50103):
    """SEND through SQL of a VALID_XML body: schema validation runs in the Python API."""


class WrongIsolationLevel(Unsupported, number=50104):
    """RECEIVE or GET CONVERSATION GROUP outside READ COMMITTED."""


class AmbiguousQueueName(Unsupported, number=50105):
    """A queue name found in several schemas: qualify it."""


class XmlNotParsableHere(Unsupported, number=50108):
    """SEND through SQL of a WELL_FORMED_XML body this PostgreSQL cannot parse."""


# SQL Server's 8169, for a conversation handle or group id that is not a UUID.
NOT_A_HANDLE = ("Conversion failed when converting from a character string to "
                "uniqueidentifier.")


def translate(exc: psycopg.Error) -> BrokerError | None:
    """The BrokerError behind a database error raised by a broker function, if it is one."""
    if exc.sqlstate == INVALID_TEXT_REPRESENTATION and "type uuid" in (
            exc.diag.message_primary or ""):
        return NotAHandle(NOT_A_HANDLE)
    if exc.sqlstate != BROKER_SQLSTATE or exc.diag.message_primary is None:
        return None
    match = _MSG.match(exc.diag.message_primary)
    if match is None:
        return None
    return BrokerError(int(match.group(1)), match.group(2))

"""Poison-message handling, one layer between Transaction and Broker: detection of rolled-back
receives (which disables a queue, as Service Broker does; ``detection``, ``side_channel``), the
strategies a reader applies to a failing message (``strategies``), the quarantine table where
failed messages wait to be inspected and replayed (``quarantine``), and the parked messages of
a timer retry (``parking``). Everything here acts in the Transaction it is given; nothing
imports the Broker or the readers."""

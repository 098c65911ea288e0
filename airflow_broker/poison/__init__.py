"""Poison-message handling: detection of rolled-back receives (which disables a queue, as
Service Broker does), the strategies a reader applies to a failing message, and the quarantine
table where failed messages wait to be inspected and replayed."""

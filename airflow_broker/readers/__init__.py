"""Queue readers: the RECEIVE-process-commit loop of an activated procedure, and the record of
each reader run's attempts."""

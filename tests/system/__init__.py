"""System tier: the deployment users run (api-server, scheduler, dag-processor, triggerer as
separate processes, LocalExecutor, PostgreSQL metadata, the broker worker, SMTP), started once
per test session, with the project installed from its wheel."""

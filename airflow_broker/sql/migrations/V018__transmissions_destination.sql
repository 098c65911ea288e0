-- The transmission page in Airflow's UI retries what waits for one destination service
-- (console_retry_transmissions): without an index on it, each click read the whole
-- transmission queue, which grows fastest exactly when a far broker is down.
CREATE INDEX transmissions_destination ON transmissions (to_service_name);

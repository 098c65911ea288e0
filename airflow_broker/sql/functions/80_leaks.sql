-- Endpoint leaks made impossible to miss (spec 15.3-15.4, 26.1).

-- CLOSED target endpoints whose security timestamp was never initialised and whose lifetime is
-- more than a month away: the fire-and-forget leak, which reclaim will not remove for years.
CREATE OR REPLACE VIEW leaked_endpoints AS
SELECT e.conversation_handle, e.conversation_id, s.name AS service_name, e.far_service,
       e.lifetime, e.created_at
  FROM endpoints e JOIN service_defs s USING (service_id)
 WHERE e.state = 'CD' AND NOT e.is_initiator AND e.security_timestamp = '1900-01-01'
   AND e.lifetime > (SELECT utc_now()) + interval '1 month';  -- evaluated once, not per row

CREATE OR REPLACE VIEW leaked_endpoint_counts AS
SELECT service_name, far_service, count(*) AS leaked, min(created_at) AS oldest
  FROM leaked_endpoints
 GROUP BY service_name, far_service;

-- Every endpoint state per service: what an administrator looks at first.
CREATE OR REPLACE VIEW endpoint_states AS
SELECT s.name AS service_name, e.state, count(*) AS endpoints
  FROM endpoints e JOIN service_defs s USING (service_id)
 GROUP BY s.name, e.state;

-- The leak article's cleanup loop as one batch: END CONVERSATION WITH CLEANUP on up to
-- p_limit leaked endpoints (each logged in cleanup_log). Returns how many went.
CREATE OR REPLACE FUNCTION cleanup_leaked_endpoints(p_limit integer DEFAULT 1000)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_handle uuid;
    v_count integer := 0;
BEGIN
    FOR v_handle IN
        SELECT e.conversation_handle FROM endpoints e
         WHERE e.conversation_handle IN (SELECT conversation_handle FROM leaked_endpoints)
         LIMIT p_limit
           FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        PERFORM end_conversation_with_cleanup(v_handle);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

-- The quarantine page lists a queue's oldest quarantined and parked messages, a page at a
-- time: in this order the list stops at the page's end instead of reading and sorting the
-- queue's whole quarantine (quarantine_open orders each status apart).
CREATE INDEX quarantine_open_by_time ON quarantine (queue_id, quarantined_at, quarantine_id)
    WHERE status IN ('quarantined', 'retrying');

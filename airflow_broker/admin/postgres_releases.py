"""PostgreSQL's releases as known when this table was written, for `airflow-broker doctor`: a
server older than the latest minor release of its major lacks that release's security fixes.

Update it with each release of airflow-broker, from PostgreSQL's release announcements
(https://www.postgresql.org/support/versioning/ has the end-of-life dates).
"""

from __future__ import annotations

WRITTEN = "2026-11-27"

# Per supported major: its latest minor release (the regular release of 2026-11-12, two
# after 18.4 / 17.10 / 16.14 / 15.18 / 14.23 of May; 14.25 is PostgreSQL 14's last), and the day
# it stops receiving fixes.
LATEST_MINOR: dict[int, str] = {
    18: "18.6",
    17: "17.12",
    16: "16.16",
    15: "15.20",
    14: "14.25",
}
END_OF_LIFE: dict[int, str] = {
    18: "2030-11-14",
    17: "2029-11-08",
    16: "2028-11-09",
    15: "2027-11-11",
    14: "2026-11-12",
}

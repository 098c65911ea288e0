-- CREATE ROUTE could be granted on the database, yet gave nothing: creating a route is the
-- schema owner's alone. Such grants (and denials) are no longer accepted; the ones made before
-- are removed, so database_permissions shows no right that does not exist.
DELETE FROM permissions
 WHERE class = 0 AND major_id = 0
   AND permission IN ('CREATE ROUTE', 'CREATE XML SCHEMA COLLECTION');

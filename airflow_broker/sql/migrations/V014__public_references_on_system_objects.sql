-- The system contracts and message types (DEFAULT, EndDialog, Error, the event-notification
-- ones) are the vocabulary every application speaks: a service for event notifications names
-- PostEventNotification, a dialog without a contract of its own uses DEFAULT. REFERENCES on
-- them goes to public, as a grant that database_permissions shows and REVOKE or DENY can take
-- back, instead of a rule hidden in the checks.
INSERT INTO permissions (class, major_id, grantee, permission, state, grantor)
SELECT 16, service_contract_id, 0, 'REFERENCES', 'G',
       (SELECT nspowner FROM pg_namespace WHERE nspname = current_schema())
  FROM contracts WHERE is_system
UNION ALL
SELECT 15, message_type_id, 0, 'REFERENCES', 'G',
       (SELECT nspowner FROM pg_namespace WHERE nspname = current_schema())
  FROM message_types WHERE is_system
ON CONFLICT DO NOTHING;

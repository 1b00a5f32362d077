-- The server session itself, whatever the table (JobQueue.swift, DatabaseProbe.swift).
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: confirm_commit
-- Answered only once the statement before it on this connection committed (see JobQueue.forEachRow).
SELECT 1

-- name: role
-- What the server is: in recovery (a standby), and whether its transactions are read-only.
SELECT pg_is_in_recovery(), current_setting('transaction_read_only')

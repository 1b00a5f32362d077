-- push.schema_migrations, the ledger of applied migrations, and the migrator's lock (Migrator.swift). The
-- migrations themselves are the files of Migrations/.
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: try_lock
-- The migration lock, polled (a session waiting in pg_advisory_lock holds a snapshot, and the holder's
-- CREATE INDEX CONCURRENTLY waits for every older snapshot), with this session's backend.
SELECT pg_try_advisory_lock(:key), pg_backend_pid()

-- name: unlock
SELECT pg_advisory_unlock(:key)

-- name: no_statement_timeout
-- A worker's sessions stop any statement at its deadline; a migration's index build may take longer. Reset by
-- reset_statement_timeout before the pool hands the connection on.
SELECT set_config('statement_timeout', '0', false)

-- name: reset_statement_timeout
-- What RESET statement_timeout does: the session's default back.
SELECT set_config('statement_timeout', (SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout'), false)

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS push

-- name: create_ledger
CREATE TABLE IF NOT EXISTS push.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: ledger_exists
SELECT to_regclass('push.schema_migrations') IS NOT NULL

-- name: applied_versions
SELECT version FROM push.schema_migrations ORDER BY version

-- name: record
INSERT INTO push.schema_migrations (version, name) VALUES (:version, :name) ON CONFLICT (version) DO NOTHING

-- name: backend_pid
-- Which server session runs this statement: the lock and the statements after it need one.
SELECT pg_backend_pid()

-- name: lock_timeout
-- The lock wait of this migration's transaction.
SELECT set_config('lock_timeout', :timeout, true)

-- name: index_invalid
-- Whether an index a failed CREATE INDEX CONCURRENTLY left behind is invalid (to be dropped first).
SELECT NOT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(:index)

-- name: begin
BEGIN

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- name: drop_index
-- An index a concurrent build left invalid, dropped before the build runs again. %I is the index's qualified
-- name, from the migration's own CREATE INDEX CONCURRENTLY (an identifier: no bind can take it).
DROP INDEX CONCURRENTLY IF EXISTS %I

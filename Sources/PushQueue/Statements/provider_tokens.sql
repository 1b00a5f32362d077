-- push.provider_tokens: the provider tokens the fleet shares, one per (team, key) (ProviderTokenTable.swift).
-- Each statement starts at its `-- name:` line; the comment lines right after it describe it.

-- name: load
-- A token "issued" in the future (a worker whose clock runs fast minted it) would count as fresh for the whole
-- fleet for too long: ignored, to be replaced.
SELECT jwt, issued_at, expires_at FROM push.provider_tokens
 WHERE team_id = :team_id AND key_id = :key_id AND issued_at <= now() + interval '60 seconds'

-- name: save
-- Insert, or replace a token minted at least the minimum interval before this one (or one "issued" in the
-- future, or one that has expired whatever its age); either way return the row as it now stands: a token
-- another worker minted moments before this one wins, so both send it. ON CONFLICT sees the newest committed
-- row even when this statement's snapshot predates it (two workers inserting at once), so the answer always
-- comes from the update's RETURNING, never from a second read under the old snapshot.
INSERT INTO push.provider_tokens AS t (team_id, key_id, jwt, issued_at, expires_at)
VALUES (:team_id, :key_id, :jwt, :issued_at, :expires_at::timestamptz)
ON CONFLICT (team_id, key_id) DO UPDATE SET
    jwt = CASE WHEN {{token_replaceable}} THEN excluded.jwt ELSE t.jwt END,
    issued_at = CASE WHEN {{token_replaceable}} THEN excluded.issued_at ELSE t.issued_at END,
    expires_at = CASE WHEN {{token_replaceable}} THEN excluded.expires_at ELSE t.expires_at END
RETURNING jwt, issued_at, expires_at

-- name: replace
-- Compare and swap on the JWT: when another worker replaced it first, nothing matches (Postgres re-checks the
-- row it waited for), and a fresh statement reads what that worker stored.
UPDATE push.provider_tokens
   SET jwt = :jwt, issued_at = :issued_at, expires_at = :expires_at::timestamptz
 WHERE team_id = :team_id AND key_id = :key_id AND jwt = :stale_jwt
RETURNING jwt, issued_at, expires_at

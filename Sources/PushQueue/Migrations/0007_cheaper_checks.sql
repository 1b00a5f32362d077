-- PushWorker schema, version 7: the same producer rules, cheaper to check.
--
-- Postgres checks every CHECK constraint on every UPDATE, whatever columns it sets, so the claim and the
-- outcome write (two UPDATEs per job) paid for the producer rules each time. The device-token rule's regex
-- had a counted, capturing group, which sends Postgres's regex engine down its slow backtracking path: a
-- quarter of Postgres's CPU during a drain. The rules keep their names and their meaning; only the
-- expressions change: lengths, and ltrim() of the allowed characters instead of regular expressions.

ALTER TABLE push.jobs
    DROP CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes,
    ADD CONSTRAINT device_token_must_be_hex_of_16_to_200_bytes
        CHECK (device_token IS NULL
               OR (octet_length(device_token) BETWEEN 32 AND 400 AND octet_length(device_token) % 2 = 0
                   AND ltrim(device_token, '0123456789ABCDEFabcdef') = '')) NOT VALID,
    DROP CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes,
    ADD CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes
        CHECK (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '-')
               AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-') = '') NOT VALID;

COMMENT ON CONSTRAINT topic_must_be_a_bundle_id_up_to_255_bytes ON push.jobs IS
    'topic is the bare bundle id: letters, digits, dots and hyphens, at most 255 bytes';

-- Replay asks this before inserting a dead letter again: the same expressions as the constraints.
CREATE OR REPLACE FUNCTION push.broken_rule(
    topic text, device_token text, channel_id text, payload jsonb, collapse_id text, credential text,
    run_at timestamptz, expires_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN octet_length(payload::text) > 16384 THEN 'payload_must_be_at_most_16384_bytes'
        WHEN device_token IS NOT NULL
             AND NOT (octet_length(device_token) BETWEEN 32 AND 400 AND octet_length(device_token) % 2 = 0
                      AND ltrim(device_token, '0123456789ABCDEFabcdef') = '')
            THEN 'device_token_must_be_hex_of_16_to_200_bytes'
        WHEN NOT (octet_length(topic) BETWEEN 1 AND 255 AND left(topic, 1) NOT IN ('.', '-')
                  AND ltrim(topic, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-') = '')
            THEN 'topic_must_be_a_bundle_id_up_to_255_bytes'
        WHEN channel_id IS NOT NULL AND channel_id !~ '^[A-Za-z0-9+/=_-]{1,128}$'
            THEN 'channel_id_must_be_base64_up_to_128_characters'
        WHEN collapse_id IS NOT NULL AND collapse_id ~ '[[:cntrl:]]'
            THEN 'collapse_id_must_not_contain_control_characters'
        WHEN octet_length(credential) > 64 OR credential ~ '[[:cntrl:]]'
            THEN 'credential_must_be_up_to_64_bytes_without_control_characters'
        WHEN NOT isfinite(run_at) THEN 'run_at_must_be_finite'
        WHEN expires_at IS NOT NULL AND NOT isfinite(expires_at) THEN 'expires_at_must_be_finite'
    END
$$;

-- jobs_claim_idx (send priority, run_at) stays for now: workers of schema 6 probe it for the next due job
-- and the oldest due job's age, and migrations only add (docs/operations.md). Workers of this version no
-- longer read it (JobQueue.earliestPendingRunAt walks jobs_claim_by_credential_idx). A later release drops
-- it, once no older worker runs: the claim's planner then can no longer pick it for a credential's range,
-- where it reads every due row of the other credentials and environments to find none of an empty range.

-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (7, '0007_cheaper_checks.sql') ON CONFLICT (version) DO NOTHING;

-- PushWorker schema, version 12: traces across the queue, and the webhook outbox's claim by hook.
--
-- * push.jobs.traceparent (producer column, text NULL): W3C trace context. Each attempt to send the job is a
--   span in the producer's trace (exported over OTLP when the worker runs with --otlp-endpoint). Kept on
--   dead letters, so a replayed job stays in its trace. A value the worker cannot read is ignored (the job
--   is sent untraced); only its length is bounded here. Adding nullable columns without a default does not
--   rewrite a table.
-- * push.jobs.trace_first_span (worker column): the span id of the job's first attempt whose outcome was
--   written; a retry's span links to it. Reset on insert, like every worker column.
-- * webhook_deliveries_claim_idx: the sender claims a few deliveries per hook (a slow receiver holds only
--   its own), due first. Built CONCURRENTLY, outside the transaction: an outbox that grew under schema 11
--   (which had no sender) is never locked against outcome writes while it is indexed.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS trace_first_span text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS trace_first_span text;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'traceparent_must_be_at_most_512_bytes') THEN
        ALTER TABLE push.jobs ADD CONSTRAINT traceparent_must_be_at_most_512_bytes
            CHECK (traceparent IS NULL OR octet_length(traceparent) <= 512) NOT VALID;
    END IF;
END
$$;

-- The worker's columns a producer's insert cannot set: schema 10's trigger, restated with trace_first_span.
CREATE OR REPLACE FUNCTION push.jobs_platform_before_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.platform = 'fcm' AND NEW.environment = 'production' THEN
        NEW.environment := 'fcm';
    END IF;
    NEW.provider_message_id := NULL;
    -- A producer's insert starts untraced by any attempt; the worker's own (replay, revive) keeps the link.
    -- (IS NOT TRUE: the setting is NULL outside the worker's transactions.)
    IF (current_setting('push.internal_insert', true) = 'on'
        AND pg_has_role(current_user,
                        (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'push.jobs'::regclass),
                        'MEMBER')) IS NOT TRUE THEN
        NEW.trace_first_span := NULL;
    END IF;
    RETURN NEW;
END
$$;

-- push:outside-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_claim_idx
    ON push.webhook_deliveries (webhook_id, run_at) WHERE state IN ('pending', 'running');
ALTER TABLE push.jobs VALIDATE CONSTRAINT traceparent_must_be_at_most_512_bytes;
-- Recorded, so that `push-worker migrate` after applying this file by hand knows it ran.
INSERT INTO push.schema_migrations (version, name) VALUES (12, '0012_traces.sql') ON CONFLICT (version) DO NOTHING;

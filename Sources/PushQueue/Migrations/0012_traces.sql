-- PushWorker schema, version 12: traces across the queue, and the webhook outbox's claim by hook.
--
-- * push.jobs.traceparent (producer column, text NULL): W3C trace context. Each attempt to send the job is a
--   span in the producer's trace (exported over OTLP when the worker runs with --otlp-endpoint). Kept on
--   dead letters, so a replayed job stays in its trace. Adding a nullable column without a default does not
--   rewrite the table.
--   push.jobs.trace_first_span: the first attempt's span id, which the spans of retries link to.
-- * webhook_deliveries_claim_idx: the sender claims a few deliveries per hook (a slow receiver holds only
--   its own), due first.

ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS traceparent text;
-- The span id of the job's first attempt whose outcome was written (set by the outcome write of a traced
-- job): a retry's span links to it.
ALTER TABLE push.jobs ADD COLUMN IF NOT EXISTS trace_first_span text;
ALTER TABLE push.dead_jobs ADD COLUMN IF NOT EXISTS trace_first_span text;

CREATE INDEX IF NOT EXISTS webhook_deliveries_claim_idx
    ON push.webhook_deliveries (webhook_id, run_at) WHERE state IN ('pending', 'running');

INSERT INTO push.schema_migrations (version, name) VALUES (12, '0012_traces.sql') ON CONFLICT (version) DO NOTHING;

public import Logging
public import PostgresNIO

/// Rows in every state for the console's tests and its render benchmark, written straight into the tables
/// (as the worker's own inserts, so the producers' trigger leaves the worker's columns alone).
public enum ConsoleFixture {
    /// The dead letters' reasons, HTTP statuses and trap ids, in rotation.
    public static let deadKinds: [(reason: String, status: Int?, trap: String?)] = [
        ("Unregistered", 410, "MS020"), ("BadDeviceToken", 400, "MS014"), ("PayloadTooLarge", nil, "MS011"),
        ("Expired", nil, nil), ("TooManyRequests", 429, "MS015"), ("BadCollapseId", 400, nil),
    ]

    /// SQL inserting `due` due and `scheduled` later pending jobs, `running` running ones held by `worker-a`,
    /// `delivered` delivered over the last `deliveredHours` hours, `superseded` superseded ones, and `dead`
    /// dead letters over the last `deadHours` hours (reasons in ``deadKinds`` rotation), plus a live and a
    /// stopped worker, a pause and a rate limit, in one transaction. The default windows (54 minutes) sit inside the
    /// console's last-hour chart, whose first minute starts 59 to 60 minutes ago.
    public static func load(
        on client: PostgresClient,
        logger: Logger,
        due: Int = 5,
        scheduled: Int = 3,
        running: Int = 2,
        delivered: Int = 40,
        deliveredHours: Double = 0.9,
        superseded: Int = 2,
        dead: Int = 30,
        deadHours: Double = 0.9
    ) async throws {
        let kinds = deadKinds.enumerated().map { n, kind in
            "(\(n), '\(kind.reason)', \(kind.status.map(String.init) ?? "NULL")::smallint, \(kind.trap.map { "ARRAY['\($0)']" } ?? "'{}'::text[]"))"
        }.joined(separator: ", ")
        func jobs(_ count: Int, offset: Int, _ columns: String, _ values: String) -> String {
            """
            INSERT INTO push.jobs (topic, device_token, payload\(columns))
            SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}'\(values)
              FROM generate_series(\(offset + 1), \(offset + count)) AS g
            """
        }
        let statements = [
            "SELECT set_config('push.internal_insert', 'on', true)",
            jobs(due, offset: 0, "", ""),
            jobs(scheduled, offset: 10_000_000, ", run_at", ", now() + interval '1 hour'"),
            jobs(
                running,
                offset: 20_000_000,
                ", state, locked_by, locked_until, attempts, first_attempt_at, last_attempt_at",
                ", 'running', 'worker-a', now() + interval '30 seconds', 1, now(), now()"
            ),
            jobs(
                delivered,
                offset: 30_000_000,
                ", state, attempts, status, latency_ms, delivered_at, first_attempt_at, last_attempt_at, apns_unique_id",
                ", 'delivered', 1, 200, 40, now() - random() * interval '\(deliveredHours * 3600) seconds', now(), now(), gen_random_uuid()::text"
            ),
            jobs(superseded, offset: 40_000_000, ", state, superseded_by", ", 'superseded', 1"),
            """
            INSERT INTO push.dead_jobs (id, topic, device_token, payload, push_type, environment, credential, run_at,
                                        apns_id, attempts, status, reason, trap_ids, created_at, dead_at, error, history)
            SELECT 1000000000 + g, 'com.example.app', lpad(to_hex(50000000 + g), 64, '0'),
                   '{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}', 'alert', 'production', 'default',
                   now(), gen_random_uuid(), 1, k.status, k.reason, k.traps, now() - interval '2 hours',
                   now() - random() * interval '\(deadHours * 3600) seconds',
                   'APNs answered ' || k.reason || ': see the runbook for ' || coalesce(k.traps[1], 'this reason') || '.',
                   jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now(), 'outcome', 'dead', 'status', k.status,
                                                        'reason', k.reason, 'worker', 'worker-a'))
              FROM generate_series(1, \(dead)) AS g
              JOIN (VALUES \(kinds)) AS k(n, reason, status, traps) ON k.n = g % \(deadKinds.count)
            """,
            """
            INSERT INTO push.workers (worker_id, host, pid, credentials) VALUES ('worker-a', 'push-1', 4242, '{default}')
            """,
            """
            INSERT INTO push.workers (worker_id, host, pid, credentials, stopped_at, heartbeat_at)
            VALUES ('worker-b', 'push-2', 4243, '{default}', now() - interval '1 hour', now() - interval '1 hour')
            """,
            """
            INSERT INTO push.pauses (credential, topic, reason) VALUES (NULL, 'com.example.paused', 'fixture pause')
            """,
            """
            INSERT INTO push.rate_limits (credential, topic, per_second, burst) VALUES ('default', NULL, 500, 100)
            """,
        ]
        try await client.withTransaction(logger: logger) { connection in
            for statement in statements {
                try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
            }
        }
    }
}

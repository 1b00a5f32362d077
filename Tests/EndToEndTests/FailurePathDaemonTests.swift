import APNsSimulator
import Foundation
import Logging
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// The worker's own failures, with the real binary: an outcome Postgres refuses, a drain that must
/// withdraw unsent requests, a Postgres outage longer than the lease.
@Suite("push-worker run: outcomes that cannot be written, clean shutdown, its own Postgres outage")
struct FailurePathDaemonTests {
    @Test(
        "one outcome Postgres refuses never wedges the worker: the rest are delivered, that job is dead-lettered with Postgres' message, the metrics say so"
    )
    func poisonOutcome() async throws {
        try await DaemonFixture.run(expected: .seconds(15)) { f in
            // Any statement writing this token to push.invalid_tokens fails (an operator's trigger, a
            // constraint this build does not know): the batch it rides in is refused as a whole.
            let poison = DaemonFixture.token(4_242)
            try await f.db.execute(
                """
                CREATE FUNCTION push.test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.device_token = '\(poison)' THEN RAISE EXCEPTION 'refused by a test trigger'; END IF;
                    RETURN NEW;
                END $$
                """
            )
            try await f.db.execute(
                """
                CREATE TRIGGER test_refuse BEFORE INSERT ON push.invalid_tokens FOR EACH ROW EXECUTE FUNCTION push.test_refuse();
                """
            )
            f.simulator.script(poison, .respond(status: 410, reason: "Unregistered"))
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}' FROM generate_series(4000, 4499) AS g
                """
            )
            let worker = try f.startWorker("poisoned", ["--log-level", "error"])
            try await f.waitUntil(.seconds(60), "every job terminal") { try await f.unfinished() == 0 }
            #expect(try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 499)
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE device_token = '\(unescaped: poison)' AND error LIKE '%could not write this job''s outcome%refused by a test trigger%'"
                ) == 1
            )
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.invalid_tokens") == 0,
                "the side effect that failed was skipped"
            )
            let (status, _) = try await f.get(worker, "/readyz")
            #expect(status == 200, "ready again once the outcome is written")
            let (_, metrics) = try await f.get(worker, "/metrics")
            #expect(metrics.contains("push_outcome_write_failures_total"), "\(metrics.prefix(400))")
            #expect(metrics.contains("push_outcomes_unwritable_total"))
            #expect(metrics.contains("push_outcome_backlog"))
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(worker.output.contains("Postgres refused one job's outcome"), "one clear error line")
            try await FaultTests.assertInvariants(f, jobs: 500, diedWorkers: [])
        }
    }

    @Test(
        "drain past the grace period: requests never written are withdrawn and their jobs released uncounted; none stays running"
    )
    func shutdownReleases() async throws {
        try await DaemonFixture.run(simulator: { $0.authenticatedMaxStreams = 5 }) { f in
            let count = 60
            // The first answers at once (APNs then allows 5 streams on the connection); the rest hang 30 s.
            for n in 2...count { f.simulator.script(DaemonFixture.token(n), .latency(.seconds(30))) }
            let worker = try f.startWorker(
                "drainer",
                [
                    "--connections", "1", "--shutdown-grace", "1s", "--request-timeout-ms", "40000", "--lease", "60s",
                    "--log-level", "error",
                ]
            )
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(DaemonFixture.token(1))', '{\"aps\":{}}')"
            )
            try await f.waitUntil(.seconds(30), "the first delivered") { try await f.unfinished() == 0 }
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}' FROM generate_series(2, \(count)) AS g
                """
            )
            try await f.waitUntil(.seconds(30), "sends in flight and waiting") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'") == Int64(count - 1)
                    && f.simulator.requests.count >= 6
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output.suffix(1000))")
            let sent = f.simulator.requests.count
            #expect(sent <= 7, "only the streams APNs allowed went out: \(sent)")
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'pending' AND attempts = 0")
                    == Int64(count - 1),
                "every job not delivered is back in pending, no attempt used"
            )
            #expect(try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'running'") == 0)
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE transport_retries > 0") <= Int64(sent),
                "only the requests written have an unknown outcome"
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.workers WHERE worker_id = 'drainer' AND stopped_at IS NOT NULL"
                ) == 1,
                "a clean stop marks the worker stopped"
            )
            // Another worker finishes them (APNs answers at once now): across the stop, one apns-id per job
            // and no 200 twice, every job delivered, none running.
            for n in 2...count { f.simulator.script(DaemonFixture.token(n), .respond(status: 200, reason: nil)) }
            let finisher = try f.startWorker("finisher", ["--log-level", "error"])
            try await f.waitUntil(.seconds(60), "every job terminal") { try await f.unfinished() == 0 }
            finisher.signal(SIGTERM)
            #expect(finisher.wait() == 0)
            try await FaultTests.assertInvariants(f, jobs: count, diedWorkers: [])
        }
    }

    @Test(
        "Postgres stopped for 15 s (longer than the 8 s lease and the stale period) with 500 requests in flight and two workers: no apns-id answered 200 twice, every job delivered"
    )
    func postgresOutage() async throws {
        try await self.outage(
            .restart,
            Duration.seconds(Int64(ProcessInfo.processInfo.environment["PUSH_PG_OUTAGE_SECONDS"] ?? "") ?? 15)
        )
    }

    @Test(
        "Postgres frozen for 15 s (a network cut or failover: queries hang past the worker's statement deadline, half the 8 s lease, and past the lease, no restart) with two workers: no apns-id answered 200 twice"
    )
    func postgresFrozen() async throws {
        try await self.outage(.freeze, .seconds(15))
    }

    enum OutageKind { case restart, freeze }

    func outage(_ kind: OutageKind, _ outage: Duration) async throws {
        try await OwnClusterFixture.run(
            "pg-outage",
            expected: .seconds(25),
            mostlyWaiting: true,
            simulator: { configuration in
                configuration.faults.slowShare = 1
                configuration.faults.slowLatency = .seconds(2)
            }
        ) { f in
            let (cluster, simulator, directory) = (f.cluster, f.simulator, f.directory)
            func start(_ name: String) throws -> ChildProcess.Running {
                try f.startWorker(
                    name,
                    [
                        "--log-level", "error", "--concurrency", "250", "--batch-size", "250", "--lease", "8s",
                        "--request-timeout-ms", "5000",
                    ]
                )
            }
            @Sendable func psql(_ sql: String) throws -> String { try f.psql(sql) }
            func waitFor(_ what: String, _ condition: @escaping @Sendable () throws -> Bool) async throws {
                try await f.waitFor(what, .seconds(240), condition)
            }
            let a = try start("a")
            let b = try start("b")
            defer {
                a.signal(SIGKILL)
                a.reap()
                b.signal(SIGKILL)
                b.reap()
            }
            try await waitFor("the schema") {
                try psql("SELECT count(*) FROM push.schema_migrations") == "\(Migration.all.count)"
            }
            _ = try psql(
                "INSERT INTO push.jobs (topic, device_token, payload) SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{\"aps\":{}}' FROM generate_series(1, 500) g"
            )
            try await waitFor("500 running") {
                try psql("SELECT count(*) FROM push.jobs WHERE state = 'running'") == "500"
            }
            // The outage comes with the requests in flight, as the title says: each connection first sends one
            // request and widens to the peer's limit after its 200 (2 s here), so the claim alone is not enough.
            try await waitFor("most requests in flight") { simulator.requests.count >= 400 }
            // Longer than the lease (8 s) and than the stale period: every lease lapses meanwhile.
            switch kind {
            case .restart:
                cluster.stop()
                print("Postgres stopped for \(outage) with \(simulator.requests.count) requests in flight or answered")
                try await Task.sleep(for: outage)
                _ = try cluster.start()
            case .freeze:
                // Every server process stopped (SIGSTOP): connections stay open, queries hang, as behind
                // a network cut; the server's start time does not change.
                let postmaster = try String(contentsOfFile: directory + "/data/postmaster.pid", encoding: .utf8).split(
                    separator: "\n"
                )[0]
                let children = try ChildProcess.run("/usr/bin/env", ["pgrep", "-P", String(postmaster)]).output.split(
                    separator: "\n"
                ).map(String.init)
                let pids = [String(postmaster)] + children
                for pid in pids { kill(pid_t(pid)!, SIGSTOP) }
                print("Postgres frozen for \(outage) with \(simulator.requests.count) requests in flight or answered")
                try await Task.sleep(for: outage)
                for pid in pids.reversed() { kill(pid_t(pid)!, SIGCONT) }
            }
            do {
                try await waitFor("every job delivered after the outage") {
                    try psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "500"
                }
            } catch {
                let states = try? psql(
                    "SELECT string_agg(state || ':' || coalesce(locked_by, '-') || ':' || attempts || ':' || n, ', ') FROM (SELECT state, locked_by, attempts, count(*) AS n FROM push.jobs GROUP BY 1, 2, 3) x"
                )
                let workers = try? psql(
                    "SELECT string_agg(worker_id || ' ' || (now() - heartbeat_at)::text, ', ') FROM push.workers"
                )
                print("job states (state:locked_by:attempts:count): \(states ?? "?"); workers: \(workers ?? "?")")
                throw error
            }
            let twice = simulator.faultCounters.okAnswers.filter { $0.value > 1 }
            print(
                "after the outage: \(simulator.requests.count) requests for 500 jobs, \(twice.count) answered 200 twice"
            )
            #expect(twice.isEmpty, "no apns-id answered 200 twice because of the workers' own outage")
            #expect(try psql("SELECT count(*) FROM push.dead_jobs") == "0")
            a.signal(SIGTERM)
            b.signal(SIGTERM)
            #expect(a.wait() == 0 && b.wait() == 0)
            try await Invariants.assert(
                simulator: simulator,
                jobs: 500,
                diedWorkers: [],
                context: "after the outage",
                count: { Int64(try psql($0)) ?? -1 },
                texts: { try psql($0).split(separator: "\n").map(String.init) }
            )
        }
    }
}

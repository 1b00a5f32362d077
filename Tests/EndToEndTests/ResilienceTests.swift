import APNsSimulator
import Foundation
import Logging
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

@Suite("push-worker run survives GOAWAY, dropped connections and a Postgres restart")
struct ResilienceTests {
    @Test("GOAWAY and dropped connections mid-burst: every job ends terminal, none lost, one apns_id per job")
    func goAwayAndDrops() async throws {
        try await DaemonFixture.run(expected: .seconds(25)) { f in
            let count = 1_500
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}', 5 FROM generate_series(1, \(count)) AS g
                """
            )
            // A few tokens knock the connection over once each, then succeed.
            for n in stride(from: 100, through: count, by: 300) {
                f.simulator.script(
                    DaemonFixture.token(n),
                    .failThenSucceed(times: 1, status: 503, reason: "ServiceUnavailable")
                )
            }
            for n in [200, 700] { f.simulator.script(DaemonFixture.token(n), .times(1, .goAway)) }
            for n in [450, 1200] { f.simulator.script(DaemonFixture.token(n), .times(1, .dropConnection)) }
            let worker = try f.startWorker("w", ["--max-retries", "4"])
            try await f.waitUntil(.seconds(90), "every job terminal") { try await f.unfinished() == 0 }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            let delivered = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
            let dead = try await f.db.int64("SELECT count(*) FROM push.dead_jobs")
            #expect(delivered + dead == Int64(count), "nothing lost")
            #expect(dead == 0, "every request cut by a GOAWAY or a drop was resent or retried and delivered")
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE 'ConnectionReset' = ANY (SELECT jsonb_array_elements(history)->>'reason')"
                ) > 0,
                "the drops did cut requests in flight"
            )
            var perToken: [String: Set<String>] = [:]
            for request in f.simulator.requests {
                if let token = request.deviceToken {
                    perToken[token, default: []].insert(request.headers["apns-id"] ?? "")
                }
            }
            #expect(perToken.values.allSatisfy { $0.count == 1 }, "retries and resends reuse the job's apns-id")
            #expect(f.simulator.connectionsAccepted > 1, "connections were replaced")
            try await FaultTests.assertInvariants(f, jobs: count, diedWorkers: [])
        }
    }

    @Test("APNs unreachable: jobs wait without using their attempts, and go out once APNs is back")
    func apnsOutage() async throws {
        let port = try EmbeddedPostgres.freePort()
        try await DaemonFixture.run(simulator: { $0.port = port }) { f in
            // The fixture's simulator is on `port`; point the worker at a port where nothing listens first.
            let closed = try EmbeddedPostgres.freePort()
            let worker = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "run", "--worker-id", "o", "--apns-endpoint", "https://localhost:\(closed)", "--apns-ca-file",
                    f.caFile,
                    "--poll-interval-ms", "200", "--no-metrics", "--log-level", "error",
                ],
                environment: f.environment,
                outputPath: f.directory + "/outage.log"
            )
            f.children.add(worker)
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(DaemonFixture.token(9))', '{\"aps\":{}}')"
            )
            // Wait for the events, not for time: the failed connect is recorded, then the worker stops
            // claiming that pool (a second connect attempt would show as a second requeue in the history).
            try await f.waitUntil(.seconds(20), "the failed connect recorded") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE reason = 'ConnectFailed'") == 1
            }
            #expect(kill(worker.pid, 0) == 0, "the worker is still running")
            #expect(try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 0, "an outage dead-letters nothing")
            #expect(try await f.db.int64("SELECT attempts FROM push.jobs") == 0, "attempts are not used up")
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE first_attempt_at IS NULL") == 1,
                "nothing was sent: the expiry clock has not started"
            )
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            // APNs back (the simulator's port): the same job goes out.
            let again = try f.startWorker("o2")
            try await f.waitUntil(.seconds(30), "delivered once APNs is reachable") { try await f.unfinished() == 0 }
            again.signal(SIGTERM)
            #expect(again.wait() == 0)
            try await FaultTests.assertInvariants(f, jobs: 1, diedWorkers: [])
        }
    }

    @Test("Postgres restarted mid-run: the worker reconnects by itself and finishes the queue")
    func postgresRestart() async throws {
        // A cluster of its own: restarting the shared test cluster would disturb the other tests.
        try await OwnClusterFixture.run("pg-restart") { f in
            let worker = try f.startWorker("w", ["--log-level", "warning"])
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            let cluster = f.cluster
            @Sendable func psql(_ sql: String) throws -> String { try f.psql(sql) }
            func waitFor(_ what: String, _ condition: @escaping @Sendable () throws -> Bool) async throws {
                try await f.waitFor("\(what): \(worker.output.suffix(2000))", .seconds(60), condition)
            }
            try await waitFor("the schema") {
                try psql("SELECT count(*) FROM push.schema_migrations") == "\(Migration.all.count)"
            }
            _ = try psql(
                "INSERT INTO push.jobs (topic, device_token, payload) SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{\"aps\":{}}' FROM generate_series(1, 200) g"
            )
            try await waitFor("the first batch") {
                try psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "200"
            }

            cluster.stop()
            try await Task.sleep(for: .seconds(2))
            _ = try cluster.start()
            // Tokens distinct from the first batch's (the fault-test invariants count apns-ids per token).
            _ = try psql(
                "INSERT INTO push.jobs (topic, device_token, payload) SELECT 'com.example.app', lpad(to_hex(g + 1000), 64, '0'), '{\"aps\":{}}' FROM generate_series(1, 300) g"
            )
            try await waitFor("the jobs inserted after the restart") {
                try psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "500"
            }
            #expect(try psql("SELECT count(*) FROM push.jobs WHERE state <> 'delivered'") == "0")
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output.suffix(2000))")
            try await Invariants.assert(
                simulator: f.simulator,
                jobs: 500,
                diedWorkers: [],
                count: { Int64(try psql($0)) ?? -1 },
                texts: { try psql($0).split(separator: "\n").map(String.init) }
            )
        }
    }
}

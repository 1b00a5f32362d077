import APNsSimulator
import Foundation
import PushProcess
import PushQueueTesting
import Synchronization
import Testing

/// "Provider outages burn nothing", with the real binary: APNs answers 503 to every request for a while.
@Suite("push-worker run: a provider outage")
struct OutageDaemonTests {
    @Test(
        "APNs answers 503 to everything for 12 s: no job dead, every job delivered after it, at most a probe a second while down, the metric and the log say so"
    )
    func apnsOutageBurnsNothing() async throws {
        try await DaemonFixture.run(expected: .seconds(15), mostlyWaiting: true) { f in
            f.simulator.setOutage(503)
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, priority)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}',
                       CASE WHEN g % 2 = 0 THEN 10 ELSE 5 END
                  FROM generate_series(1, 1000) AS g
                """
            )
            let worker = try f.startWorker("outage", ["--log-level", "notice"])
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            try await f.waitUntil(.seconds(30), "the worker takes APNs for down") {
                worker.output.contains("is down:")
            }
            let port = try await f.metricsPort(worker)
            let downAt = Date()
            try await Task.sleep(for: .seconds(12))
            let (_, metrics) = try await f.get(worker, "/metrics")
            #expect(
                metrics.split(separator: "\n").contains {
                    $0.hasPrefix("push_provider_down{platform=\"apns\"") && ($0.hasSuffix(" 1") || $0.hasSuffix(" 1.0"))
                },
                "push_provider_down is 1 while down (port \(port)): \(metrics.split(separator: "\n").filter { $0.contains("provider") })"
            )
            let requestsWhileDown = f.simulator.requests.filter {
                $0.receivedAt > downAt.addingTimeInterval(1) && $0.receivedAt < downAt.addingTimeInterval(12)
            }
            #expect(
                requestsWhileDown.count <= 11 * 2,
                "at most a probe a second while down: \(requestsWhileDown.count) requests in 11 s"
            )
            #expect(try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 0, "no job burned by the outage")
            f.simulator.setOutage(nil)
            try await f.waitUntil(.seconds(60), "every job delivered after the outage") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == 1000
            }
            #expect(try await f.db.int64("SELECT count(*) FROM push.dead_jobs") == 0)
            // The requeues used no attempt: at most the few 5xx answered before the outage was seen did.
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE attempts > 2") == 0,
                "attempts burned by the outage"
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.jobs WHERE history::text LIKE '%ServiceUnavailable%'"
                ) >= 20,
                "the history records the 5xx answers"
            )
            #expect(worker.output.contains("answers again after"), "\(worker.output.suffix(2000))")
            let (_, after) = try await f.get(worker, "/metrics")
            // Every job in a named state, none running, one apns-id each, no 200 answered twice.
            _ = try await FaultTests.assertInvariants(f, jobs: 1000, diedWorkers: [])
            #expect(
                after.split(separator: "\n").contains {
                    $0.hasPrefix("push_provider_down{platform=\"apns\"") && ($0.hasSuffix(" 0") || $0.hasSuffix(" 0.0"))
                }
            )
        }
    }

    @Test(
        "one job's own 5xx while the others succeed is not an outage: it is retried with the stretch, its neighbours are delivered"
    )
    func oneJobsOwn5xx() async throws {
        try await DaemonFixture.run { f in
            let sick = DaemonFixture.token(77)
            f.simulator.script(sick, .respond(status: 500, reason: "InternalServerError"))
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, max_attempts)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{"alert":"hi"}}', 2
                  FROM generate_series(1, 300) AS g
                """
            )
            let worker = try f.startWorker("own", ["--log-level", "notice"])
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            // The others go on succeeding: a few more jobs every 100 ms until the sick one is dead. A 5xx is the
            // job's own when a request written after its previous one was answered (ProviderHealth.mayBeDown);
            // with all 300 written at once, none was written clearly after its first attempt, and on a loaded
            // machine the worker rightly doubted, sending the job back for 30 s uncounted (twice in a dozen full
            // runs, the test's 60 s then spent).
            let waves = Mutex(0)
            try await f.waitUntil(.seconds(90), "the sick job dead") {
                if try await f.db.int64("SELECT count(*) FROM push.dead_jobs") > 0 { return true }
                let wave = waves.withLock { count in
                    count += 1
                    return count
                }
                try await f.db.execute(
                    """
                    INSERT INTO push.jobs (topic, device_token, payload)
                    SELECT 'com.example.app', lpad(to_hex(1000000 + \(wave) * 10 + g), 64, '0'), '{"aps":{"alert":"hi"}}'
                      FROM generate_series(1, 3) AS g
                    """
                )
                return false
            }
            let more = waves.withLock { $0 }
            try await f.waitUntil(.seconds(60), "every job terminal") { try await f.unfinished() == 0 }
            #expect(
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
                    == Int64(299 + more * 3)
            )
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.dead_jobs WHERE device_token = '\(unescaped: sick)' AND attempts = 2"
                ) == 1,
                "its own 5xx used its attempts"
            )
            #expect(!worker.output.contains("is down:"))
            _ = try await FaultTests.assertInvariants(f, jobs: 300 + more * 3, diedWorkers: [])
        }
    }
}

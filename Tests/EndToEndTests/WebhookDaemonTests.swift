import Foundation
import PushProcess
import PushQueueTesting
import Testing

/// The tests' loopback receiver (Tests/Interop/webhook_receiver.py, written from CONTRACT.md 1c): it checks
/// every signature and logs every request, and misbehaves per path.
struct WebhookReceiver {
    let process: ChildProcess.Running
    let port: Int
    let log: String

    struct Request: Decodable {
        var delivery: String?
        var event: String?
        var attempt: String?
        var job_id: Int64?
        var signed: Bool
        var path: String
        var action: String
        var at: Double
        var keys: [String]
        var first: Bool
    }

    /// `tls`: a PEM certificate and key to serve https:// with.
    static func start(
        in directory: String,
        secretFile: String,
        seed: UInt64,
        delay: Double,
        tls: (certificate: String, key: String)? = nil
    ) async throws -> Self {
        let log = directory + "/receiver.jsonl"
        let (process, port) = try await InteropPeer.start(
            "webhook_receiver.py",
            ["--log", log, "--secret-file", secretFile, "--seed", "\(seed)", "--delay", "\(delay)"]
                + (tls.map { ["--tls-cert", $0.certificate, "--tls-key", $0.key] } ?? []),
            in: directory,
            name: "receiver"
        )
        return WebhookReceiver(process: process, port: port, log: log)
    }

    var requests: [Request] {
        guard let text = try? String(contentsOfFile: self.log, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { try? JSONDecoder().decode(Request.self, from: Data($0.utf8)) }
    }

    func stop() {
        self.process.signal(SIGKILL)
        self.process.reap()
    }
}

/// A Python peer from Tests/Interop that writes the port it listens on to `--port-file` once it listens.
enum InteropPeer {
    static func start(
        _ script: String,
        _ arguments: [String],
        in directory: String,
        name: String
    ) async throws -> (ChildProcess.Running, Int) {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Interop/\(script)").path
        let portFile = directory + "/\(name).port"
        let process = try ChildProcess.start(
            "/usr/bin/env",
            ["python3", path, "--port-file", portFile] + arguments,
            environment: ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"],
            outputPath: directory + "/\(name).out"
        )
        for _ in 0..<200 {
            if let text = try? String(contentsOfFile: portFile, encoding: .utf8), let port = Int(text) {
                return (process, port)
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        process.signal(SIGKILL)
        process.reap()
        Issue.record("\(script) did not start: \(process.output)")
        throw CancellationError()
    }
}

/// Webhooks end to end: the real binary, real Postgres, a receiver in another language over real sockets.
@Suite("Webhooks: signed, retried, never lost, never trusted")
struct WebhookDaemonTests {
    static func secret(in directory: String) throws -> String {
        let path = directory + "/hook.secret"
        try "  whsec_test-\(UUID().uuidString)\n".write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o600)
        return path
    }

    static var seed: UInt64 {
        ProcessInfo.processInfo.environment["PUSH_WEBHOOK_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...999_999)
    }

    @Test(
        "a receiver that drops, delays, answers 500, 503 with Retry-After, 410 and a redirect: every delivery signed and delivered once its receiver takes it, duplicates only where the worker's deadline passed, 410 disables, redirects are not followed, private addresses refused without the flag"
    )
    func droppingReceiver() async throws {
        let seed = Self.seed
        print("webhook receiver seed \(seed) (PUSH_WEBHOOK_SEED=\(seed) repeats it)")
        try await DaemonFixture.run(expected: .seconds(25)) { f in
            let secret = try Self.secret(in: f.directory)
            let receiver = try await WebhookReceiver.start(in: f.directory, secretFile: secret, seed: seed, delay: 3)
            defer { receiver.stop() }
            let base = "http://127.0.0.1:\(receiver.port)"
            for (path, events) in [
                ("/flaky", "delivered,dead,token_invalid"), ("/gone", "dead"), ("/redirect", "token_invalid"),
            ] {
                let added = try await f.cli([
                    "webhooks", "add", base + path, "--events", events, "--secret-file", secret,
                ])
                #expect(added.status == 0, "\(added.output)")
            }
            // 12 of the 240 tokens are unregistered: dead with token_invalid.
            for n in 1...12 {
                f.simulator.script(DaemonFixture.token(n * 20), .unregistered(timestampMs: 1_700_000_000_000))
            }
            try await f.insertAlerts(240)
            // First without --webhooks-allow-private: the loopback receiver is refused, nothing reaches it.
            let refusing = try f.startWorker("w0", ["--webhooks-timeout", "2s"])
            try await f.waitUntil(.seconds(60), "the refused tries recorded") {
                try await f.db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE last_error LIKE '%--webhooks-allow-private%'"
                ) >= 3
            }
            refusing.signal(SIGTERM)
            refusing.reap()
            #expect(receiver.requests.isEmpty, "a private address was refused: no request reached it")
            // Due again now, then the worker that may reach it.
            try await f.db.execute("UPDATE push.webhook_deliveries SET run_at = now() WHERE state = 'pending'")
            let worker = try f.startWorker("w1", ["--webhooks-allow-private", "--webhooks-timeout", "2s"])
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            try await f.waitUntil(.seconds(120), "every job ended and hook 1's deliveries all delivered") {
                let open = try await f.unfinished()
                let undelivered = try await f.db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = 1 AND state <> 'delivered'"
                )
                let untried = try await f.db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = 3 AND attempts = 0"
                )
                return open == 0 && undelivered == 0 && untried == 0
            }
            let requests = receiver.requests
            #expect(!requests.isEmpty && requests.allSatisfy { $0.signed }, "every request's Push-Signature verifies")
            let contract: Set = [
                "job_id", "apns_id", "platform", "topic", "state", "status", "reason", "trap_ids", "at",
            ]
            #expect(
                requests.allSatisfy { contract.isSubset(of: Set($0.keys)) },
                "every body carries the contract's fields"
            )
            // Hook 1: one delivery per outcome it takes (228 delivered, 12 dead, 12 token_invalid).
            let flaky = requests.filter { $0.path == "/flaky" }
            let rows = try await f.db.int64("SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = 1")
            #expect(rows == 252, "228 delivered + 12 dead + 12 token_invalid")
            let accepted = Dictionary(grouping: flaky.filter { $0.action == "ok" || $0.action == "delay" }) {
                $0.delivery ?? ""
            }
            let lost = try await f.db.int64s(
                "SELECT id FROM push.webhook_deliveries WHERE webhook_id = 1 ORDER BY id"
            ).filter { accepted["\($0)"] == nil }
            #expect(lost.isEmpty, "no delivery lost: each was taken by the receiver at least once (\(lost.prefix(5)))")
            let duplicates = accepted.filter { $0.value.count > 1 }
            let unexplained = duplicates.filter { $0.value.first?.action != "delay" }
            #expect(unexplained.isEmpty, "a delivery taken twice only after its first answer came past the deadline")
            let ids = Set(flaky.compactMap(\.delivery))
            #expect(
                flaky.allSatisfy { request in
                    flaky.filter { $0.delivery == request.delivery }.map(\.attempt).count
                        == Set(flaky.filter { $0.delivery == request.delivery }.compactMap(\.attempt)).count
                },
                "each try of a delivery carries its own Push-Attempt"
            )
            let actions = Dictionary(grouping: flaky.filter { $0.first }, by: { $0.action }).mapValues(\.count)
            print(
                "webhook figures (seed \(seed)): deliveries \(ids.count), requests \(flaky.count), first requests \(actions.sorted { $0.key < $1.key }), duplicates \(duplicates.count) (all after a deadline), lost \(lost.count)"
            )
            // The jobs themselves: the shared invariants (no worker died; w0 was stopped with SIGTERM).
            try await FaultTests.assertInvariants(f, jobs: 240, diedWorkers: [])
            // Hook 2: a 410 disabled it after the first answers (at most its in-flight share went out).
            let gone = requests.filter { $0.path == "/gone" }
            #expect(!gone.isEmpty && gone.count <= 4, "410 stops the hook: \(gone.count) requests")
            let disabled = try await f.cli(["webhooks"])
            #expect(disabled.output.contains("DISABLED: the receiver answered 410 Gone"), "\(disabled.output)")
            #expect(
                try await f.db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE webhook_id = 2 AND state = 'pending'"
                ) == 12 - Int64(gone.count),
                "the disabled hook's other deliveries wait, unsent"
            )
            // Hook 3: the redirect was an answer, not followed; the deliveries wait with a sentence saying so.
            #expect(requests.filter { $0.path == "/ok" }.isEmpty, "no redirect was followed")
            let shown = try await f.cli(["webhooks", "show", "3"])
            #expect(shown.output.contains("redirects are not followed"), "\(shown.output)")
            // Replay: a dead delivery goes out again with its id; --hook enables the disabled hook.
            try await f.db.execute(
                "UPDATE push.webhook_deliveries SET state = 'dead' WHERE webhook_id = 2 AND state = 'pending'"
            )
            let replay = try await f.cli(["webhooks", "replay", "--hook", "2"])
            #expect(replay.status == 0 && replay.output.contains("enabled webhook 2 again"), "\(replay.output)")
            let notDead = try await f.cli(["webhooks", "replay", "1"])
            #expect(notDead.status == 1 && notDead.output.contains("not dead"), "\(notDead.output)")
        }
    }

    @Test(
        "a hook's secret_file: a missing, a world-readable and a symlinked-out file in the secrets directory get the same delivery error (no existence or mode oracle), the log says which; a file outside the directory is never opened, and the worker says so at start"
    )
    func secretFileErrorsSayNothingOfTheFile() async throws {
        try await DaemonFixture.run { f in
            let open = f.directory + "/open.secret"
            try "whsec_open\n".write(toFile: open, atomically: true, encoding: .utf8)
            chmod(open, 0o644)
            // A private file outside the directory (it would pass every other check), reached by a symlink
            // inside it, and named directly.
            let elsewhere = FileManager.default.temporaryDirectory.appendingPathComponent(
                "elsewhere-\(UUID().uuidString)"
            )
            .path
            try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: elsewhere) }
            let outside = elsewhere + "/private.secret"
            try "whsec_private\n".write(toFile: outside, atomically: true, encoding: .utf8)
            chmod(outside, 0o600)
            let link = f.directory + "/link.secret"
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: outside)
            let missing = f.directory + "/missing.secret"
            try await f.db.execute(
                """
                INSERT INTO push.webhooks (url, events, secret_file) VALUES
                    ('https://hooks.example.com/a', '{dead}', '\(missing)'),
                    ('https://hooks.example.com/b', '{dead}', '\(open)'),
                    ('https://hooks.example.com/c', '{dead}', '\(link)'),
                    ('https://hooks.example.com/d', '{dead}', '\(outside)'),
                    ('https://hooks.example.com/e', '{dead}', '\(f.directory)/../\(URL(fileURLWithPath: elsewhere).lastPathComponent)/private.secret')
                """
            )
            let gone = DaemonFixture.token(0xdead)
            f.simulator.script(gone, .respond(status: 410, reason: "Unregistered"))
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(gone)', '{\"aps\":{\"alert\":\"hi\"}}')"
            )
            let worker = try f.startWorker("secrets", ["--log-level", "warning"])
            defer {
                worker.signal(SIGKILL)
                worker.reap()
            }
            try await f.waitUntil(.seconds(60), "every delivery tried") {
                try await f.db.int64("SELECT count(*) FROM push.webhook_deliveries WHERE last_error IS NOT NULL") == 5
            }
            let errors = try await f.db.client.query(
                "SELECT last_error FROM push.webhook_deliveries ORDER BY webhook_id"
            ).decode(String.self).collect()
            let inside = zip([missing, open, link], errors).map { $1.replacingOccurrences(of: $0, with: "F") }
            #expect(Set(inside).count == 1, "\(errors)")
            #expect(inside.allSatisfy { $0.contains("chmod 600") && !$0.contains("exist") }, "\(errors)")
            #expect(
                errors.suffix(2).allSatisfy { $0.contains("outside the webhook secrets directory") },
                "\(errors)"
            )
            #expect(worker.output.contains("webhook secret file"), "the log says which: \(worker.output.suffix(1500))")
            #expect(worker.output.contains("leads outside"), "the symlink: \(worker.output.suffix(1500))")
            #expect(
                worker.output.contains("webhook 4's secret file") && worker.output.contains("webhook 5's secret file")
                    && !worker.output.contains("webhook 3's secret file"),
                "named at start: \(worker.output.suffix(2500))"
            )
        }
    }

    @Test(
        "kill -9 with deliveries in flight: none lost, a delivery taken twice only when it was in flight at the death, with the same Push-Delivery-Id"
    )
    func killWithDeliveriesInFlight() async throws {
        try await DaemonFixture.run(expected: .seconds(20)) { f in
            let secret = try Self.secret(in: f.directory)
            let receiver = try await WebhookReceiver.start(in: f.directory, secretFile: secret, seed: 1, delay: 0.4)
            defer { receiver.stop() }
            let added = try await f.cli([
                "webhooks", "add", "http://127.0.0.1:\(receiver.port)/slow", "--events", "delivered", "--secret-file",
                secret,
            ])
            #expect(added.status == 0, "\(added.output)")
            let flags = ["--webhooks-allow-private", "--webhooks-timeout", "2s", "--webhooks-per-hook", "16"]
            try await f.insertAlerts(300)
            let victim = try f.startWorker("victim", flags)
            try await f.waitUntil(.seconds(60), "the receiver taking deliveries") { receiver.requests.count >= 40 }
            victim.signal(SIGKILL)
            victim.reap()
            let inFlight = Set(
                try await f.db.int64s(
                    "SELECT id FROM push.webhook_deliveries WHERE state = 'running' AND locked_by = 'victim'"
                ).map { "\($0)" }
            )
            #expect(!inFlight.isEmpty, "deliveries were in flight at the kill")
            let survivor = try f.startWorker("survivor", flags)
            defer {
                survivor.signal(SIGKILL)
                survivor.reap()
            }
            try await f.waitUntil(.seconds(120), "every job ended and every delivery delivered") {
                let open = try await f.unfinished()
                let undelivered = try await f.db.int64(
                    "SELECT count(*) FROM push.webhook_deliveries WHERE state <> 'delivered'"
                )
                return open == 0 && undelivered == 0
            }
            try await FaultTests.assertInvariants(f, jobs: 300, diedWorkers: ["victim"])
            let requests = receiver.requests
            #expect(requests.allSatisfy { $0.signed })
            let byDelivery = Dictionary(grouping: requests) { $0.delivery ?? "" }
            let rows = try await f.db.int64s("SELECT job_id FROM push.webhook_deliveries ORDER BY job_id")
            #expect(rows.count == 300, "one delivery per delivered job")
            let received = Set(requests.compactMap(\.job_id))
            let lost = rows.filter { !received.contains($0) }
            #expect(lost.isEmpty, "no delivery lost across the kill")
            let twice = byDelivery.filter { $0.value.count > 1 }
            #expect(
                Set(twice.keys).isSubset(of: inFlight),
                "a delivery is taken twice only when the victim held it at its death: \(Set(twice.keys).subtracting(inFlight))"
            )
            print(
                "webhook kill -9 figures: deliveries \(rows.count), running at the kill \(inFlight.count), requests \(requests.count), duplicates \(twice.count) (all in flight at the death), lost \(lost.count)"
            )
        }
    }
}

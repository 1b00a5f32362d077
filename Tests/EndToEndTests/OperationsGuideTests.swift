import Foundation
import PostgresNIO
import PushEmbeddedPostgres
import PushProcess
import PushQueueTesting
import Testing

@testable import PushQueue

/// docs/operations.md and docs/runbook.md show operators commands and queries; each one must exist and run. Every
/// `$ push-worker …` line of a `console` block runs against a real database with dead letters, a
/// running worker and the simulator (daemon verbs, `run` and `simulator`, are parsed by
/// `check-arguments` instead: the other end-to-end suites start them). Every `sql` block runs against
/// the real schema.
@Suite("docs/operations.md and docs/runbook.md: every command and query runs", .serialized)
struct OperationsGuideTests {
    static let guide = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("docs/operations.md").path
    static let runbook = URL(fileURLWithPath: Self.guide).deletingLastPathComponent().appendingPathComponent(
        "runbook.md"
    ).path

    /// Both guides' text, the operations guide first.
    static func text() throws -> String {
        try String(contentsOfFile: Self.guide, encoding: .utf8) + "\n"
            + String(contentsOfFile: Self.runbook, encoding: .utf8)
    }

    /// The fenced blocks of a Markdown file with their info string.
    static func blocks(of text: String) -> [(language: String, body: [String])] {
        var blocks: [(String, [String])] = []
        var current: (String, [String])?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            if line.hasPrefix("```") {
                if let open = current {
                    blocks.append(open)
                    current = nil
                } else {
                    current = (String(line.dropFirst(3)).trimmingCharacters(in: .whitespaces), [])
                }
            } else if current != nil {
                current!.1.append(line)
            }
        }
        return blocks
    }

    @Test("sh blocks (systemctl, docker, kubectl: not runnable here) are valid shell and name files that exist")
    func shellBlocks() throws {
        let root = URL(fileURLWithPath: Self.guide).deletingLastPathComponent().deletingLastPathComponent().path
        let scripts = Self.blocks(of: try Self.text()).filter {
            $0.language == "sh"
        }.map { $0.body.joined(separator: "\n") }
        #expect(scripts.count >= 3)
        for script in scripts {
            let syntax = try ChildProcess.run("/bin/bash", ["-n", "-c", script])
            #expect(syntax.status == 0, "bash -n: \(syntax.output)\n\(script)")
            for match in script.matches(of: /(?:deploy|docs)\/[A-Za-z0-9_.\/-]+/) {
                let path = String(match.output)
                #expect(
                    FileManager.default.fileExists(atPath: root + "/" + path),
                    "the guide names \(path), which is not in the repository"
                )
            }
        }
    }

    @Test("every push-worker command in a console block runs and exits 0; every sql block runs")
    func commandsAndQueries() async throws {
        let text = try Self.text()
        let blocks = Self.blocks(of: text)
        let commands = blocks.filter { $0.language == "console" }.flatMap(\.body).filter {
            $0.hasPrefix("$ push-worker ")
        }
        .map { String($0.dropFirst("$ push-worker ".count)) }
        let queries = blocks.filter { $0.language == "sql" }.map { $0.body.joined(separator: "\n") }
        #expect(commands.count >= 12, "the guide's commands were found: \(commands)")
        #expect(queries.count >= 3)

        try await DaemonFixture.run { f in
            let (ok, gone) = (DaemonFixture.token(1), DaemonFixture.token(2))
            f.simulator.script(gone, .unregistered(timestampMs: 1_700_000_000_000))
            let big = String(repeating: "x", count: 4_200)
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, expires_at) VALUES
                ('com.example.app', '\(ok)', '{"aps":{"alert":"hi"}}', NULL),
                ('com.example.app', '\(gone)', '{"aps":{"alert":"hi"}}', NULL),
                ('com.example.app', '\(DaemonFixture.token(3))', '{"aps":{"alert":"\(big)"}}', NULL),
                ('com.example.app', '\(DaemonFixture.token(4))', '{"aps":{"alert":"hi"}}', now() - interval '1 minute')
                """
            )
            let worker = try f.startWorker("guide")
            try await f.waitUntil(.seconds(60), "three dead letters and one delivered job") {
                let dead = try await f.db.int64("SELECT count(*) FROM push.dead_jobs")
                let delivered = try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered'")
                return dead == 3 && delivered == 1
            }
            // The guide's Live Activity, for its `activities` commands (its own INSERT, later, is idempotent).
            try await f.db.execute(
                "INSERT INTO push.activities (topic, activity_id, recipient) VALUES ('com.example.app', 'order-42', 'user:42')"
            )
            let deadID = try await f.db.int64("SELECT id FROM push.dead_jobs WHERE reason = 'PayloadTooLarge'")
            let jobID = try await f.db.int64("SELECT id FROM push.jobs WHERE state = 'delivered'")
            let port = try await f.metricsPort(worker)
            // The guide's config.json: a token key and a provider certificate from the simulator's CA.
            let certificate = try f.simulator.issueProviderCertificate(bundleID: "com.example.app")
            try certificate.certificatePEM.write(toFile: f.directory + "/apns.pem", atomically: true, encoding: .utf8)
            try certificate.keyPEM.write(toFile: f.directory + "/apns.key", atomically: true, encoding: .utf8)
            chmod(f.directory + "/apns.key", 0o600)
            let config = f.directory + "/config.json"
            try """
            {"credentials": {
              "default": {"team_id": "\(f.credentials.teamID)", "key_id": "\(f.credentials.keyID)", "key_path": "\(f.keyPath)"},
              "legacy": {"type": "certificate", "cert_path": "\(f.directory)/apns.pem", "key_path": "\(f.directory)/apns.key"}
            }}
            """.write(toFile: config, atomically: true, encoding: .utf8)

            for line in commands {
                // `$ push-worker verb …   # exit N: why` documents a non-zero exit status.
                let parts = line.components(separatedBy: " #")
                let command = parts[0].trimmingCharacters(in: .whitespaces)
                let expected =
                    parts.dropFirst().first.flatMap { comment in
                        comment.firstMatch(of: /exit (\d+)/).map { Int32($0.1)! }
                    } ?? 0
                var arguments = command.split(separator: " ").map(String.init).map {
                    $0.replacingOccurrences(of: "<dead-id>", with: "\(deadID)").replacingOccurrences(
                        of: "<job-id>",
                        with: "\(jobID)"
                    ).replacingOccurrences(of: "/etc/push-worker/config.json", with: config)
                        // The workers' secrets directory is the fixture's (PUSH_WEBHOOKS_SECRETS_DIR).
                        .replacingOccurrences(of: "/etc/push-worker/webhooks/", with: f.directory + "/")
                }
                #expect(!arguments.contains { $0.hasPrefix("<") }, "a placeholder the test does not fill: \(command)")
                if ["run", "simulator"].contains(arguments[0]) {
                    arguments = ["check-arguments"] + arguments
                }
                // The guide's health checks use the default port; this worker listens on a free one.
                if arguments[0] == "healthcheck" { arguments += ["--port", "\(port)"] }
                let result = try await f.cli(arguments)
                #expect(
                    result.status == expected,
                    "push-worker \(command) exited \(result.status), not \(expected): \(result.output.suffix(800))"
                )
            }
            // Roles are cluster-wide: the guide's role gets a name of this run's, dropped afterwards.
            let role = "app_producer_\(UInt32.random(in: 0...UInt32.max))"
            for query in queries {
                for statement in SQLScript.statements(in: query.replacingOccurrences(of: "app_producer", with: role)) {
                    do {
                        try await f.db.execute(statement)
                    } catch {
                        Issue.record("the guide's query fails: \(QueueError.summary(of: error))\n\(statement)")
                    }
                }
            }
            if try await f.db.int64("SELECT count(*) FROM pg_roles WHERE rolname = '\(unescaped: role)'") == 1 {
                try await f.db.execute("DROP OWNED BY \(role)")
                try await f.db.execute("DROP ROLE \(role)")
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
        }
    }
}

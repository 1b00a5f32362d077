import Foundation
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushQueueTesting
import Testing

/// What deploy/ relies on: systemd's notify protocol, the schema check a fleet starts with.
@Suite("operations: systemd notify, migrations check")
struct OperationsTests {
    @Test("Type=notify: READY=1 once the schema is checked, WATCHDOG=1 pings, STOPPING=1 on SIGTERM")
    func systemdNotify() async throws {
        try await DaemonFixture.run { f in
            // A stand-in for systemd's notify socket: a real Unix datagram socket, each message logged.
            let socket = f.directory + "/notify.sock"
            let received = f.directory + "/notify.log"
            let listener = try ChildProcess.start(
                "/usr/bin/env",
                [
                    "python3", "-u", "-c",
                    """
                    import socket, sys
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    s.bind(sys.argv[1])
                    with open(sys.argv[2], "a") as log:
                        while True:
                            message = s.recv(4096).decode()
                            log.write(message.replace("\\n", " ") + "\\n"); log.flush()
                    """, socket, received,
                ],
                environment: [:],
                outputPath: f.directory + "/listener.log"
            )
            f.children.add(listener)
            defer {
                listener.signal(SIGKILL)
                listener.reap()
            }
            try await f.waitUntil(.seconds(10), "the notify socket exists") {
                FileManager.default.fileExists(atPath: socket)
            }
            let messages: @Sendable () -> [String] = {
                ((try? String(contentsOfFile: received, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
            }
            let worker = try f.startWorker("notify", environment: ["NOTIFY_SOCKET": socket, "WATCHDOG_USEC": "400000"])
            try await f.waitUntil(.seconds(30), "READY=1") { messages().contains { $0.contains("READY=1") } }
            let ready = try #require(messages().first { $0.contains("READY=1") })
            #expect(ready.contains("STATUS=claiming and sending as notify"))
            #expect(ready.contains("MAINPID=\(worker.pid)"))
            let beforeReady = messages().prefix { !$0.contains("READY=1") }
            #expect(
                beforeReady.contains { $0.contains("STATUS=checking the push schema") },
                "status before ready: \(messages())"
            )
            try await f.waitUntil(.seconds(10), "two watchdog pings") {
                messages().filter { $0 == "WATCHDOG=1" }.count >= 2
            }
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(DaemonFixture.token(1))', '{\"aps\":{}}')"
            )
            try await f.waitUntil(.seconds(30), "delivered while notifying") { try await f.unfinished() == 0 }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(messages().contains { $0.hasPrefix("STOPPING=1") }, "\(messages())")
        }
    }

    @Test(
        "migrate --check exits 3 while migrations are pending; run --migrations check refuses to start, naming push-worker migrate"
    )
    func migrationsCheck() async throws {
        try await DaemonFixture.run { f in
            try await f.db.execute("DROP SCHEMA push CASCADE")
            let pending = try await f.cli(["migrate", "--check"])
            #expect(pending.status == 3, "\(pending.output)")
            #expect(pending.output.contains("pending: 0001_schema.sql, 0002_provider_tokens.sql"), "\(pending.output)")

            let refused = try f.startWorker("checked", ["--migrations", "check"])
            #expect(refused.wait() != 0)
            #expect(
                refused.output.contains("lacks 0001_schema.sql, 0002_provider_tokens.sql, 0003_failure_paths.sql"),
                "\(refused.output)"
            )
            #expect(refused.output.contains("push-worker migrate"))
            #expect(
                try await f.db.int64("SELECT count(*) FROM pg_namespace WHERE nspname = 'push'") == 0,
                "check changed nothing"
            )

            #expect(try await f.cli(["migrate"]).status == 0)
            let current = try await f.cli(["migrate", "--check", "--json"])
            #expect(current.status == 0, "\(current.output)")
            let answer = try JSONSerialization.jsonObject(with: Data(current.output.utf8)) as? [String: [String]]
            #expect(
                answer?["pending"] == [] && answer?["schema_versions"] == Migration.all.map { String($0.version) },
                "\(current.output)"
            )

            let worker = try f.startWorker("checked", ["--migrations", "check"])
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', '\(DaemonFixture.token(2))', '{\"aps\":{}}')"
            )
            try await f.waitUntil(.seconds(30), "delivered by a worker that only checked the schema") {
                try await f.unfinished() == 0
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
        }
    }

    @Test(
        "compose's wiring without Docker: the standalone simulator's key and CA, a worker with --migrations check, a TLS name"
    )
    func composeWiring() async throws {
        try await DaemonFixture.run { f in
            let state = f.directory + "/standalone"
            let simulator = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "simulator", "--port", "0", "--tls-name", "simulator", "--state-dir", state,
                ],
                environment: [:],
                outputPath: f.directory + "/simulator.log"
            )
            f.children.add(simulator)
            defer {
                simulator.signal(SIGTERM)
                simulator.reap()
            }
            // As compose's health check does: ca.pem appears once the key and CA are in place.
            try await f.waitUntil(.seconds(30), "the simulator wrote ca.pem and printed its address") {
                FileManager.default.fileExists(atPath: state + "/ca.pem")
                    && simulator.output.contains("APNs simulator listening on https://")
            }
            let line = try #require(
                simulator.output.split(separator: "\n").first { $0.hasPrefix("APNs simulator listening on https://") }
            )
            let port = try #require(line.split(separator: " ")[4].split(separator: ":").last.flatMap { Int($0) })

            // Its certificate is valid for the service name compose gives it.
            let verify = try ChildProcess.run(
                "/usr/bin/env",
                [
                    "sh", "-c",
                    "openssl s_client -connect 127.0.0.1:\(port) -servername simulator -verify_hostname simulator -CAfile \(state)/ca.pem -alpn h2 </dev/null",
                ]
            )
            #expect(
                verify.output.contains("Verification: OK") || verify.output.contains("Verify return code: 0 (ok)"),
                "\(verify.output.suffix(600))"
            )
            let wrongName = try ChildProcess.run(
                "/usr/bin/env",
                [
                    "sh", "-c",
                    "openssl s_client -connect 127.0.0.1:\(port) -verify_hostname other.example -CAfile \(state)/ca.pem </dev/null",
                ]
            )
            #expect(
                !wrongName.output.contains("Verify return code: 0 (ok)"),
                "a name not asked for is not in the certificate"
            )

            // A worker configured as compose configures one, with the simulator's throwaway key.
            let worker = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "run", "--worker-id", "compose", "--migrations", "check", "--log-format", "json", "--metrics-port",
                    "0",
                    "--apns-endpoint", "https://localhost:\(port)", "--apns-ca-file", state + "/ca.pem",
                ],
                environment: [
                    "DATABASE_URL": f.db.url.connectionString,
                    "APNS_KEY_PATH": state + "/AuthKey_SIMKEY0001.p8", "APNS_KEY_ID": "SIMKEY0001",
                    "APNS_TEAM_ID": "SIMTEAM001",
                ],
                outputPath: f.directory + "/compose-worker.log"
            )
            f.children.add(worker)
            try await f.db.execute(
                "INSERT INTO push.jobs (topic, device_token, payload) VALUES ('com.example.app', repeat('ab', 32), '{\"aps\":{\"alert\":\"hi\"}}')"
            )
            try await f.waitUntil(.seconds(30), "delivered through the standalone simulator") {
                try await f.db.int64("SELECT count(*) FROM push.jobs WHERE state = 'delivered' AND status = 200") == 1
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output.suffix(800))")
        }
    }
}

import Foundation
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import Testing

/// libpq's multi-host DATABASE_URL against a real primary and a real streaming standby (pg_basebackup).
@Suite(.serialized) struct MultiHostTests {
    static let bin = "/usr/lib/postgresql/15/bin"

    /// Runs a server binary, as `postgres` when the test runs as root.
    static func asPostgres(_ command: [String], environment: [String: String] = [:]) throws -> ChildProcess.Result {
        let env = environment.map { "\($0.key)=\($0.value)" }
        if geteuid() == 0 {
            return try ChildProcess.run("/usr/sbin/runuser", ["-u", "postgres", "--", "/usr/bin/env"] + env + command)
        }
        return try ChildProcess.run("/usr/bin/env", env + command)
    }

    @Test(
        "a multi-host URL whose first host is a read-only standby: the worker skips it, works on the primary, and names the durability; with target any it lands on the standby and says why nothing can be written"
    )
    func standbyFirst() async throws {
        try await OwnClusterFixture.run("multi-host") { f in
            let standby = f.directory + "/standby"
            let port = try EmbeddedPostgres.freePort()
            let password = f.url.password ?? ""
            try FileManager.default.createDirectory(atPath: standby, withIntermediateDirectories: true)
            chmod(standby, 0o700)
            if geteuid() == 0 {
                _ = try ChildProcess.run("/bin/chmod", ["755", f.directory])
                _ = try ChildProcess.run("/bin/chown", ["postgres", standby])
            }
            let backup = try Self.asPostgres(
                [
                    Self.bin + "/pg_basebackup", "-h", "127.0.0.1", "-p", "\(f.url.port)", "-U", f.url.username, "-D",
                    standby, "-R", "-X", "stream",
                ],
                environment: ["PGPASSWORD": password]
            )
            try #require(backup.status == 0, "pg_basebackup: \(backup.output)")
            let started = try Self.asPostgres([
                Self.bin + "/pg_ctl", "-D", standby, "-o", "-p \(port) -c listen_addresses=127.0.0.1", "-l",
                standby + "/startup.log", "-w", "start",
            ])
            try #require(started.status == 0, "the standby did not start: \(started.output)")
            defer { _ = try? Self.asPostgres([Self.bin + "/pg_ctl", "-D", standby, "-m", "fast", "stop"]) }

            let hosts = "127.0.0.1:\(port),127.0.0.1:\(f.url.port)"
            let base = "postgres://\(f.url.username):\(password)@\(hosts)/\(f.url.database)"
            // target any: the first host answers, a standby: migrate cannot write there, and says so.
            var environment = f.environment
            environment["DATABASE_URL"] = base + "?sslmode=disable"
            let anyHost = try ChildProcess.run(
                "/usr/bin/env",
                environment.map { "\($0.key)=\($0.value)" } + [DaemonFixture.binary, "migrate"]
            )
            #expect(anyHost.status != 0, "\(anyHost.output)")
            #expect(anyHost.output.contains("read-only"), "\(anyHost.output)")

            // read-write: the standby is skipped.
            environment["DATABASE_URL"] = base + "?sslmode=disable&target_session_attrs=read-write&connect_timeout=3"
            let migrate = try ChildProcess.run(
                "/usr/bin/env",
                environment.map { "\($0.key)=\($0.value)" } + [DaemonFixture.binary, "migrate"]
            )
            #expect(migrate.status == 0, "\(migrate.output)")
            let worker = try ChildProcess.start(
                DaemonFixture.binary,
                [
                    "run", "--worker-id", "multi", "--apns-endpoint", "https://localhost:\(f.simulator.port)",
                    "--apns-ca-file", f.caFile, "--poll-interval-ms", "200", "--no-metrics", "--log-level", "notice",
                ],
                environment: environment,
                outputPath: f.directory + "/multi.log"
            )
            f.children.add(worker)
            _ = try f.psql(
                """
                INSERT INTO push.jobs (topic, device_token, payload)
                SELECT 'com.example.app', lpad(to_hex(g), 64, '0'), '{"aps":{}}' FROM generate_series(1, 200) g
                """
            )
            try await f.waitFor("200 delivered through the multi-host URL") {
                try f.psql("SELECT count(*) FROM push.jobs WHERE state = 'delivered'") == "200"
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0)
            #expect(worker.output.contains("database host chosen"), "\(worker.output)")
            #expect(worker.output.contains("127.0.0.1:\(f.url.port)"), "the primary was chosen: \(worker.output)")
            #expect(worker.output.contains("durability: asynchronous replication"), "\(worker.output)")
            print(worker.output.split(separator: "\n").filter { $0.contains("durability") }.joined(separator: "\n"))
        }
    }
}

import Foundation
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import Testing

/// The daemon through a real PgBouncer (Debian's) in transaction mode, as many users run Postgres.
@Suite struct PoolerTests {
    static var pgbouncer: String? {
        ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// PgBouncer in transaction mode on a free loopback port in front of `url`'s server; it runs as the
    /// `postgres` user when the test runs as root (PgBouncer refuses root).
    static func start(in directory: String, for url: DatabaseURL) async throws -> (ChildProcess.Running, Int) {
        let binary = try #require(
            Self.pgbouncer,
            "pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)"
        )
        let port = try EmbeddedPostgres.freePort()
        let home = directory + "/pgbouncer"
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        try "\"\(url.username)\" \"\(url.password ?? "")\"\n".write(
            toFile: home + "/userlist.txt",
            atomically: true,
            encoding: .utf8
        )
        try """
        [databases]
        * = host=\(url.host) port=\(url.port)
        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = \(port)
        unix_socket_dir =
        auth_type = plain
        auth_file = \(home)/userlist.txt
        pool_mode = transaction
        max_client_conn = 200
        default_pool_size = 20
        ignore_startup_parameters = extra_float_digits
        logfile = \(home)/pgbouncer.log
        pidfile = \(home)/pgbouncer.pid
        """.write(toFile: home + "/pgbouncer.ini", atomically: true, encoding: .utf8)
        let asRoot = geteuid() == 0
        if asRoot {
            chmod(directory, 0o755)
            _ = try ChildProcess.run("/bin/chown", ["-R", "postgres", home])
        }
        let command = asRoot ? ["/usr/sbin/runuser", "-u", "postgres", "--", binary] : [binary]
        let bouncer = try ChildProcess.start(
            command[0],
            Array(command.dropFirst()) + [home + "/pgbouncer.ini"],
            environment: [:],
            outputPath: directory + "/pgbouncer.out"
        )
        for _ in 0..<100 {
            let connected = try ChildProcess.run(
                "/usr/bin/env",
                ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', \(port)), 1)"]
            )
            if connected.status == 0 { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        return (bouncer, port)
    }

    @Test(
        "through PgBouncer in transaction mode: without --no-session-settings the worker stops at once naming the pooler and the fix; with it, every job is delivered",
        .enabled(if: pgbouncer != nil, "no pgbouncer: apt-get install -y pgbouncer (bash .ci/run installs it)")
    )
    func throughPgBouncer() async throws {
        try await DaemonFixture.run { f in
            let (bouncer, port) = try await Self.start(in: f.directory, for: f.db.url)
            f.children.add(bouncer)
            defer {
                bouncer.signal(SIGTERM)
                _ = bouncer.wait(limit: .seconds(10))
            }
            var pooled = f.db.url
            pooled.host = "127.0.0.1"
            pooled.port = port
            let environment = ["DATABASE_URL": pooled.connectionString]
            // With session settings: one line, with the fix, within seconds (it used to retry in silence).
            let started = ContinuousClock.now
            let refused = try f.startWorker("pooled-settings", ["--log-level", "error"], environment: environment)
            let status = refused.wait(limit: .seconds(30))
            #expect(status != 0)
            #expect(ContinuousClock.now - started < .seconds(15))
            #expect(refused.output.contains("--no-session-settings"), "\(refused.output)")
            #expect(refused.output.contains("pooler"), "\(refused.output)")

            // Without: 2,000 jobs delivered through the pooler, none left running, one apns-id per job. A 30 s
            // request deadline (the lease is 60 s): this test is about the pooler, and in the suite's first minute
            // on a slow machine the in-process stand-in answered 14 s late, so a 10 s deadline sent jobs again as
            // unknown outcomes, answered 200 twice (2026-11-29).
            try await f.insertAlerts(2_000)
            let worker = try f.startWorker(
                "pooled",
                [
                    "--log-level", "error", "--no-session-settings", "--migrations", "check", "--request-timeout-ms",
                    "30000",
                ],
                environment: environment
            )
            try await f.waitUntil(.seconds(120), "every job delivered through PgBouncer") {
                try await f.unfinished() == 0
            }
            worker.signal(SIGTERM)
            #expect(worker.wait() == 0, "\(worker.output)")
            try await FaultTests.assertInvariants(f, jobs: 2_000, diedWorkers: [])
        }
    }

    @Test(
        "the first signal stops a worker that has not started: one waiting for another process's migration exits at once"
    )
    func firstSignalBeforeStart() async throws {
        try await DaemonFixture.run { f in
            // Another process holds the migration lock (a migration in progress elsewhere).
            let holder = try await f.session(id: 3)
            _ = try await holder.query(
                "SELECT pg_advisory_lock(\(Migrator.advisoryLockKey))",
                logger: f.db.logger
            ).collect()
            let worker = try f.startWorker("waiting", ["--log-level", "notice"])
            try await f.waitUntil(.seconds(30), "the worker waiting for the schema") {
                worker.output.contains("metrics and health on")
            }
            try await Task.sleep(for: .seconds(1))
            let signalled = ContinuousClock.now
            worker.signal(SIGINT)
            #expect(worker.wait(limit: .seconds(20)) == 0, "\(worker.output)")
            #expect(ContinuousClock.now - signalled < .seconds(5), "the first signal did not stop it at once")
            #expect(worker.output.contains("stopped before starting"), "\(worker.output)")
            try await holder.close()
        }
    }
}

import Foundation
import Logging
import PushEmbeddedPostgres
import PushProcess
import PushQueueTesting
import Testing

/// The newcomer's first five minutes: README's block run as written (each `swift run push-worker` is the
/// built binary, the same program), in an empty directory, with nothing configured: no DATABASE_URL, no
/// APNs key, no PG* variables. Every command must exit 0 and the pushes must be delivered.
@Suite(.serialized) struct NewcomerTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The README's "Five minutes" shell block.
    static func fiveMinutesBlock() throws -> String {
        let readme = try String(contentsOf: Self.repository.appendingPathComponent("README.md"), encoding: .utf8)
        let section = try #require(readme.range(of: "## Five minutes"), "README has no Five minutes section")
        let rest = readme[section.upperBound...]
        let open = try #require(rest.range(of: "```sh\n"))
        let close = try #require(rest[open.upperBound...].range(of: "\n```"))
        return String(rest[open.upperBound..<close.lowerBound])
    }

    @Test(
        "README's five minutes, as written, from an empty directory with nothing configured: every command exits 0, the pushes are delivered, the Android one through FCM"
    )
    func fiveMinutes() async throws {
        // A worker and its embedded cluster: at most a few heavy tests at once (HeavyTestGate).
        try await HeavyTestGate.run { try await self.fiveMinutesNow() }
    }

    private func fiveMinutesNow() async throws {
        let block = try Self.fiveMinutesBlock()
        #expect(
            !block.contains("PGPASSWORD") && !block.contains(".pushworker/"),
            "no file to read, no password to type"
        )
        let binary = DaemonFixture.binary
        let directory = "/tmp/pw-newcomer-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        // The embedded cluster runs as postgres when the test runs as root: let it into the directory.
        chmod(directory, 0o777)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let unset = [
            "DATABASE_URL", "APNS_KEY_PATH", "APNS_KEY_ID", "APNS_TEAM_ID", "APNS_ENVIRONMENT", "PGHOST",
            "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "HTTPS_PROXY",
        ].map { "-u \($0)" }.joined(separator: " ")
        let clean = "cd '\(directory)' && exec env \(unset)"
        // The first terminal.
        let worker = try ChildProcess.start(
            "/bin/sh",
            ["-c", "\(clean) '\(binary)' run"],
            environment: [:],
            outputPath: directory + "/worker.log"
        )
        defer {
            worker.signal(SIGKILL)
            _ = worker.wait(limit: .seconds(10))
            EmbeddedPostgres(
                configuration: .init(dataDirectory: directory + "/.pushworker/postgres"),
                logger: Logger(label: "newcomer")
            ).stop()
        }
        // Ready once it says it runs (printed after the schema is migrated; the simulator's line comes before
        // the migration, and a loaded machine once ran the INSERT between the two).
        for _ in 0..<600 where !worker.output.contains("running against") {
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(worker.output.contains("sending to the built-in APNs simulator"), "\(worker.output)")
        #expect(worker.output.contains("running against"), "\(worker.output)")
        // The second terminal: the block as written, stopping at the first command that fails.
        let script = block.replacingOccurrences(of: "swift run push-worker", with: "'\(binary)'")
        try script.write(toFile: directory + "/five-minutes.sh", atomically: true, encoding: .utf8)
        let result = try ChildProcess.run("/bin/sh", ["-c", "\(clean) /bin/sh -e -x five-minutes.sh"])
        print(result.output)
        #expect(result.status == 0, "a command of README's five minutes failed:\n\(result.output)")
        #expect(result.output.contains("job 1  delivered"), "\(result.output)")
        #expect(result.output.contains("job 2  delivered"), "\(result.output)")
        // The Android job: delivered by the built-in simulator's FCM side, with FCM's message name.
        #expect(result.output.contains("job 3  delivered"), "\(result.output)")
        #expect(result.output.contains("platform    fcm (Android)"), "\(result.output)")
        #expect(result.output.contains("message     projects/push-simulator/messages/"), "\(result.output)")
        #expect(result.output.contains("/v1/projects/<project_id>/messages:send"), "\(result.output)")
        #expect(result.output.contains("MS018"))
        worker.signal(SIGTERM)
        #expect(worker.wait(limit: .seconds(30)) == 0, "\(worker.output)")
    }
}

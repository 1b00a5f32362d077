import APNsSimulator
import Crypto
import Foundation
import PushProcess
import PushQueueTesting
import PushTransport
import Testing

@Suite("An independent client agrees with the simulator")
struct InteropTests {
    @Test("Python httpx over HTTP/2 gets 200 for a valid alert and 410 Unregistered with its timestamp")
    func httpxClient() async throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Interop/httpx_apns_client.py").path
        let probe = try ChildProcess.run("/usr/bin/env", ["python3", "-c", "import httpx, h2, cryptography"])
        try #require(
            probe.status == 0,
            "python3 with httpx[http2] and cryptography is needed: pip install 'httpx[http2]' cryptography (.ci/run installs them)"
        )

        try await Fixture.run { f in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "interop-\(UUID().uuidString)"
            )
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let ca = try f.simulator.writeCACertificate(to: directory.appendingPathComponent("ca.pem").path)
            let keyPath = directory.appendingPathComponent("key.p8").path
            _ = FileManager.default.createFile(
                atPath: keyPath,
                contents: Data(f.key.privateKey.pemRepresentation.utf8),
                attributes: [.posixPermissions: 0o600]
            )

            let gone = Fixture.token()
            f.simulator.script(gone, .unregistered(timestampMs: 1_700_000_000_123))
            // Waited for on a Dispatch thread: the in-process simulator answering it needs the concurrency pool.
            let arguments = [
                "python3", script, "--url", "https://localhost:\(f.simulator.port)", "--ca", ca, "--key", keyPath,
                "--team", Fixture.teamID, "--key-id", Fixture.keyID, "--token", Fixture.token(), "--token", gone,
            ]
            let result = try await offPool { try ChildProcess.run("/usr/bin/env", arguments) }
            try #require(result.status == 0, "httpx client failed: \(result.output)")
            let lines = try result.output.split(separator: "\n").filter { $0.hasPrefix("{") }.map {
                try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
            }
            try #require(lines.count == 2)
            let (ok, unregistered) = (lines[0], lines[1])
            #expect(ok["http_version"] as? String == "HTTP/2")
            #expect(ok["status"] as? Int == 200)
            #expect(ok["apns_id_echoed"] as? Bool == true)
            #expect(unregistered["status"] as? Int == 410)
            #expect(unregistered["reason"] as? String == "Unregistered")
            #expect((unregistered["timestamp"] as? NSNumber)?.int64Value == 1_700_000_000_123)
        }
    }
}

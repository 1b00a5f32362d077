import APNsSimulator
import Foundation
import PushCore
import PushProcess
import PushQueueTesting
import Testing

@testable import PushTransport

/// The simulator judges what APNs judges, on its own side (not PushCore's rules), so a run against it finds
/// what a run against Apple would.
@Suite("The simulator is as strict as Apple")
struct SimulatorStrictnessTests {
    @Test("a request without apns-push-type is 400 MissingPushType")
    func missingPushType() async throws {
        try await Fixture.run { f in
            var request = try Fixture.alert(Fixture.token())
            request.headers.removeAll { $0.name == "apns-push-type" }
            let response = try await f.send(request)
            #expect(response.status == 400 && response.reason == "MissingPushType")
        }
    }

    @Test("a rejected provider token sends the connection back to one stream; the next success raises it again")
    func rejectedTokenDropsToOneStream() async throws {
        try await Fixture.run { f in
            #expect(try await f.send(try Fixture.alert(Fixture.token())).status == 200)
            f.simulator.refuseKey(Fixture.keyID, reason: "InvalidProviderToken")
            let refused = try await f.send(try Fixture.alert(Fixture.token()))
            #expect(refused.status == 403 && refused.reason == "InvalidProviderToken")
            #expect(f.simulator.faultCounters.streamLimitDrops == 1)
            f.simulator.refuseKey(Fixture.keyID, reason: nil)
            // Back to one stream: 20 sends in parallel still all succeed (the client waits for its slot).
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<20 { group.addTask { try await f.send(try Fixture.alert(Fixture.token())).status } }
                for try await status in group { #expect(status == 200) }
            }
        }
    }

    @Test(
        "iOS's Live Activity budget: priority-10 updates to one token past the budget get 429; priority 5 is not counted"
    )
    func liveActivityBudget() async throws {
        try await Fixture.run(simulator: { $0.liveActivityBudget = .init(count: 3, window: 3600) }) { f in
            let token = Fixture.token()
            let update = #"{"aps":{"timestamp":1800000000,"event":"update","content-state":{}}}"#
            var statuses: [Int] = []
            for _ in 0..<4 {
                statuses.append(
                    try await f.send(try Fixture.alert(token, pushType: "liveactivity", priority: 10, payload: update))
                        .status
                )
            }
            #expect(statuses == [200, 200, 200, 429])
            let low = try await f.send(try Fixture.alert(token, pushType: "liveactivity", priority: 5, payload: update))
            #expect(low.status == 200)
            let other = try await f.send(
                try Fixture.alert(Fixture.token(), pushType: "liveactivity", priority: 10, payload: update)
            )
            #expect(other.status == 200, "the budget is per token")
        }
    }

    @Test("connect/disconnect churn: past the limit of connections closed without a request, a new one is refused")
    func connectionChurnIsRefused() async throws {
        try await Fixture.run(simulator: { $0.idleConnectionLimit = .init(count: 5, window: 60) }) { f in
            // Six TLS connections that speak HTTP/2's preface and leave without a request.
            let script = """
                import socket, ssl, sys
                context = ssl.create_default_context(cafile=sys.argv[2])
                context.set_alpn_protocols(["h2"])
                for _ in range(6):
                    raw = socket.create_connection(("localhost", int(sys.argv[1])), 5)
                    tls = context.wrap_socket(raw, server_hostname="localhost")
                    tls.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + b"\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x00\\x00")
                    tls.close()
                """
            let ca = FileManager.default.temporaryDirectory.appendingPathComponent("churn-ca-\(UUID().uuidString).pem")
                .path
            try f.simulator.writeCACertificate(to: ca)
            defer { try? FileManager.default.removeItem(atPath: ca) }
            // Off the concurrency pool: the in-process simulator it talks to needs it.
            let port = f.simulator.port
            let churn = try await offPool {
                try ChildProcess.run("/usr/bin/env", ["python3", "-c", script, "\(port)", ca])
            }
            #expect(churn.status == 0, "\(churn.output)")
            try await Task.sleep(for: .milliseconds(300))
            // The client's first connection now is refused.
            await #expect(throws: (any Error).self) { _ = try await f.send(try Fixture.alert(Fixture.token())) }
            #expect(f.simulator.faultCounters.churnRefusals >= 1)
        }
    }
}

import APNsSimulator
import ArgumentParser
import Crypto
import Foundation
import Logging
import PushCore
import PushEmbeddedPostgres
import PushProcess
import PushQueue
import PushTransport
import Synchronization

/// `push-bench transport`: APNsClient requests/s against the simulator's fast mode, with 1 and 4
/// connections, next to h2load against the same simulator.
struct TransportBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transport",
        abstract: "APNsClient requests/s against the simulator's fast mode vs h2load against the same simulator."
    )

    @Option(help: "Connection counts to measure.") var connections: [Int] = [1, 4]
    @Option(help: "Requests per measurement.") var requests: Int = 40_000
    @Option(help: "Requests in flight at once (client tasks).") var concurrency: Int = 256
    @Option(help: "Streams per connection for h2load (-m).") var h2loadStreams: Int = 100

    func run() async throws {
        let logger = benchLogger()
        let key = SigningKey(teamID: "BENCHTEAM1", keyID: "BENCHKEY01", privateKey: P256.Signing.PrivateKey())
        let simulator = try APNsSimulator(
            configuration: .init(
                keys: ["BENCHKEY01": .init(teamID: "BENCHTEAM1", publicKey: key.privateKey.publicKey)],
                fastMode: true,
                recordRequests: false
            ),
            logger: logger
        )
        let (requests, concurrency, streams, connectionCounts) = (
            self.requests, self.concurrency, self.h2loadStreams, self.connections
        )
        try await simulator.run { simulator in
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "push-bench-transport-\(getpid())"
            )
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let caFile = try simulator.writeCACertificate(to: directory.appendingPathComponent("ca.pem").path)
            let token = String(repeating: "ab", count: 32)
            let payload = #"{"aps":{"alert":{"title":"Order shipped","body":"Arrives Tuesday"}}}"#
            let request = try RequestBuilder.describe(
                PushJob(
                    id: 1,
                    apnsID: UUID(),
                    topic: "com.example.app",
                    deviceToken: token,
                    payload: payload,
                    runAt: Date(),
                    createdAt: Date()
                ),
                now: Date()
            )
            let payloadFile = directory.appendingPathComponent("payload.json").path
            try payload.write(toFile: payloadFile, atomically: true, encoding: .utf8)

            print(
                "simulator: \(simulator.endpointURL) (fast mode), \(requests) requests per run, \(concurrency) in flight"
            )
            print("conns  push-worker req/s  h2load req/s  push-worker/h2load")
            for count in connectionCounts {
                let client = try APNsClient(
                    configuration: .init(
                        endpointOverride: APNsEndpoint(host: "localhost", port: simulator.port),
                        caFile: caFile,
                        connectionsPerPool: count
                    ),
                    credentials: ["default": key],
                    logger: logger
                )
                // Warm up: open every connection and pass the one-stream-until-authenticated phase.
                try await Self.drive(client, request: request, total: 2_000, concurrency: concurrency)
                let seconds = try await Self.drive(client, request: request, total: requests, concurrency: concurrency)
                await client.shutdown()
                let ours = Double(requests) / seconds
                let theirs = try await Self.h2load(
                    port: simulator.port,
                    token: token,
                    payloadFile: payloadFile,
                    requests: requests,
                    connections: count,
                    streams: streams,
                    headers: request.headers
                )
                print(String(format: "%5d  %17.0f  %12.0f  %18.2f", count, ours, theirs, ours / theirs))
            }
        }
    }

    /// Sends `total` copies of `request` with `concurrency` tasks; returns the seconds it took.
    @discardableResult
    static func drive(_ client: APNsClient, request: APNsRequest, total: Int, concurrency: Int) async throws -> Double {
        let next = Counter()
        let clock = ContinuousClock()
        let start = clock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<concurrency {
                group.addTask {
                    while next.value.add(1, ordering: .relaxed).oldValue < total {
                        let response = try await client.send(request, credential: "default")
                        guard response.status == 200 else {
                            throw ValidationError("simulator answered \(response.status)")
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        return (clock.now - start).seconds
    }

    /// Runs h2load on its own thread (it blocks) and returns its req/s.
    static func h2load(
        port: Int,
        token: String,
        payloadFile: String,
        requests: Int,
        connections: Int,
        streams: Int,
        headers: [(name: String, value: String)]
    ) async throws -> Double {
        var arguments = [
            "h2load", "-n", String(requests), "-c", String(connections), "-m", String(streams), "-d", payloadFile,
        ]
        for header in headers where header.name != "apns-id" { arguments += ["-H", "\(header.name): \(header.value)"] }
        arguments.append("https://localhost:\(port)/3/device/\(token)")
        let command = arguments
        let result: ChildProcess.Result = try await withCheckedThrowingContinuation { continuation in
            let thread = Thread {
                continuation.resume(
                    with: Result { try ChildProcess.run("/usr/bin/env", command, limit: .seconds(3_600)) }
                )
            }
            thread.start()
        }
        guard result.status == 0,
            let line = result.output.split(separator: "\n").first(where: { $0.hasPrefix("finished in") }),
            let range = line.range(of: #"[0-9.]+ req/s"#, options: .regularExpression),
            let rate = Double(line[range].dropLast(" req/s".count))
        else {
            throw ValidationError("h2load failed (apt-get install -y nghttp2-client): \(result.output.suffix(500))")
        }
        return rate
    }
}

/// A shared counter the driving tasks take request numbers from.
final class Counter: Sendable {
    let value = Atomic<Int>(0)
}

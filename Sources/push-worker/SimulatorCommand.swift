import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import UnixSignals

struct SimulatorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulator",
        abstract: "Run the built-in APNs simulator on its own (staging, load tests, trying a client).",
        discussion: """
            Serves HTTP/2 over TLS like APNs: Apple's validation and reasons, ES256 provider-token checks, one \
            stream per connection until a request with a valid token succeeds. It writes a fresh CA \
            certificate and a throwaway signing key into --state-dir and prints how to use them. Stop it \
            with Ctrl-C.
            """
    )

    @Option(help: "Address to listen on.") var host: String = "127.0.0.1"
    @Option(help: "Port to listen on (0 picks a free one).") var port: Int = 2197
    @Option(
        name: .customLong("state-dir"),
        help: ArgumentHelp("Where the CA certificate and the signing key are written.", valueName: "path")
    )
    var stateDirectory: String = ".pushworker/simulator"
    @Option(
        name: .customLong("tls-name"),
        help: ArgumentHelp(
            "A host name clients use to reach it (besides localhost), added to its TLS certificate; repeatable.",
            valueName: "name"
        )
    )
    var tlsNames: [String] = []
    @Flag(help: "Answer every request 200 at once, with no checks (benchmarks).") var fast = false
    @Flag(
        help:
            "Serve FCM too: a token endpoint that verifies a throwaway service account's RS256 JWT (its key file is written into --state-dir) and FCM's v1 send endpoint, with FCM's error JSON and the same fault mix."
    )
    var fcm = false
    @Option(
        name: .customLong("goaway-every"),
        help: ArgumentHelp(
            "Every Nth request, send GOAWAY with a last-stream-id below most streams in flight; answer the lower ones, never the higher, close after 2 s (as Apple may).",
            valueName: "n"
        )
    )
    var goAwayEvery: Int?
    @Option(
        name: .customLong("drop-every"),
        help: ArgumentHelp("Every Nth request, drop the TCP connection without GOAWAY.", valueName: "n")
    )
    var dropEvery: Int?
    @Option(
        name: .customLong("reset-share"),
        help: ArgumentHelp(
            "Share of first attempts (by apns-id) answered RST_STREAM INTERNAL_ERROR, 0 to 1.",
            valueName: "share"
        )
    )
    var resetShare: Double = 0
    @Option(
        name: .customLong("throttle-share"),
        help: ArgumentHelp("Share of requests answered 429 TooManyRequests, 0 to 1.", valueName: "share")
    )
    var throttleShare: Double = 0
    @Option(
        name: .customLong("error-share"),
        help: ArgumentHelp("Share of requests answered 500 or 503, 0 to 1.", valueName: "share")
    )
    var errorShare: Double = 0
    @Option(
        name: .customLong("latency-ms"),
        help: ArgumentHelp("Add this much latency to a share of answers (--slow-share).", valueName: "ms")
    )
    var latencyMs: Int = 300
    @Option(
        name: .customLong("slow-share"),
        help: ArgumentHelp("Share of requests answered after --latency-ms, 0 to 1.", valueName: "share")
    )
    var slowShare: Double = 0
    @Option(
        help: ArgumentHelp(
            "Seed of the fault mix, printed at start: the same seed replays the same schedule.",
            valueName: "n"
        )
    )
    var seed: UInt64?
    @Option(name: .customLong("log-level"), help: "How much to log.")
    var logLevel: LogLevelOption = .info

    func run() async throws {
        var logger = Logger(label: "push-worker.simulator")
        logger.logLevel = self.logLevel.level
        let directory = URL(fileURLWithPath: self.stateDirectory).standardizedFileURL.path
        let caPath = (directory as NSString).appendingPathComponent("ca.pem")
        // ca.pem appears once this run's key and CA are in place: a health check can wait for it.
        try? FileManager.default.removeItem(atPath: caPath)
        let credentials = try SimulatorCredentials.generate(in: directory)
        var configuration = APNsSimulator.Configuration(
            host: self.host,
            port: self.port,
            keys: [credentials.keyID: credentials.trustedKey],
            fastMode: self.fast,
            recordRequests: false
        )
        for (name, share) in [
            ("--reset-share", self.resetShare), ("--throttle-share", self.throttleShare),
            ("--error-share", self.errorShare), ("--slow-share", self.slowShare),
        ] {
            guard (0...1).contains(share) else {
                throw ValidationError("\(name) must be between 0 and 1 (a share of requests), not \(share)")
            }
        }
        configuration.faults.goAwayEvery = self.goAwayEvery
        configuration.faults.dropEvery = self.dropEvery
        configuration.faults.resetFirstAttempts = self.resetShare
        configuration.faults.throttleShare = self.throttleShare
        configuration.faults.serverErrorShare = self.errorShare
        configuration.faults.slowShare = self.slowShare
        configuration.faults.slowLatency = .milliseconds(self.latencyMs)
        let seed = self.seed ?? UInt64.random(in: 1...UInt64(Int64.max))
        configuration.faults.seed = seed
        if configuration.faults.isActive {
            printError("simulator fault mix on, seed \(seed) (--seed \(seed) replays it)")
        }
        configuration.tlsNames = self.tlsNames
        let account = self.fcm ? try SimulatorFCMAccount.make() : nil
        if let account { configuration.fcmAccounts = account.trusted }
        let simulator = try APNsSimulator(configuration: configuration, logger: logger)
        let fast = self.fast
        let tlsName = self.tlsNames.first ?? "localhost"
        try await simulator.run { simulator in
            // Written before ca.pem: a health check waiting for ca.pem finds the key file too.
            let accountPath = try account?.write(in: directory, host: tlsName, port: simulator.port)
            try simulator.writeCACertificate(to: caPath)
            writeLine(
                """
                APNs simulator listening on \(simulator.endpointURL) (\(fast ? "fast mode: every request 200, no checks" : "faithful mode"))
                  CA certificate  \(caPath)
                  signing key     \(credentials.keyPath)   team \(credentials.teamID)   key \(credentials.keyID)

                Point a worker at it:
                  APNS_KEY_PATH=\(credentials.keyPath) APNS_TEAM_ID=\(credentials.teamID) APNS_KEY_ID=\(credentials.keyID) \\
                    push-worker run --apns-endpoint \(simulator.endpointURL) --apns-ca-file \(caPath)
                """
            )
            if let accountPath {
                writeLine(
                    """
                    FCM on the same port: token endpoint https://\(tlsName):\(simulator.port)/token, sends to /v1/projects/push-simulator/messages:send
                      service account \(accountPath)
                    Point a worker at it:
                      FCM_SERVICE_ACCOUNT_PATH=\(accountPath) \\
                        push-worker run --fcm-endpoint https://\(tlsName):\(simulator.port) --fcm-ca-file \(caPath)
                    """
                )
            }
            writeLine("Stop with Ctrl-C.")
            await waitForTerminationSignal()
            print("simulator stopping")
        }
    }
}

/// SIGINT and SIGTERM as an async sequence (swift-service-lifecycle's `UnixSignalsSequence`: it ignores their
/// default action and hands each one over). Made once and kept for as long as signals are awaited: making it
/// again between two signals could miss the second.
func terminationSignals() async -> UnixSignalsSequence {
    await UnixSignalsSequence(trapping: .sigint, .sigterm)
}

/// Returns when the process receives SIGINT or SIGTERM.
func waitForTerminationSignal() async {
    for await _ in await terminationSignals() { break }
}

/// Writes a line to standard output at once (print() buffers when stdout is not a terminal).
func writeLine(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

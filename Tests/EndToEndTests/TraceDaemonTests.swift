import Foundation
import PushProcess
import PushQueueTesting
import Testing

/// The tests' collector (Tests/Interop/otlp_collector.py): the real binary's swift-otel exporter sends it
/// OTLP/HTTP JSON, it keeps every span.
struct SpanCollector {
    let process: ChildProcess.Running
    let port: Int
    let log: String

    struct Link: Decodable {
        var trace_id: String
        var span_id: String
    }

    struct Span: Decodable {
        var trace_id: String
        var span_id: String
        var parent_span_id: String
        var name: String
        var start: Int64
        var end: Int64
        var attributes: [String: AttributeValue]
        var links: [Link]
        var service: String?

        var attempt: Int { self.attributes["push.attempt"]?.int ?? 0 }
        var outcome: String { self.attributes["push.outcome"]?.string ?? "" }
    }

    enum AttributeValue: Decodable, CustomStringConvertible {
        case string(String)
        case int(Int)
        case bool(Bool)
        case double(Double)
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let value = try? container.decode(Int.self) {
                self = .int(value)
            } else if let value = try? container.decode(Bool.self) {
                self = .bool(value)
            } else if let value = try? container.decode(Double.self) {
                self = .double(value)
            } else {
                self = .string(try container.decode(String.self))
            }
        }
        var int: Int? { if case .int(let value) = self { value } else { nil } }
        var string: String? { if case .string(let value) = self { value } else { nil } }
        var description: String {
            switch self {
            case .string(let value): value
            case .int(let value): "\(value)"
            case .bool(let value): "\(value)"
            case .double(let value): "\(value)"
            }
        }
    }

    static func start(in directory: String) async throws -> Self {
        let log = directory + "/spans.jsonl"
        let (process, port) = try await InteropPeer.start(
            "otlp_collector.py",
            ["--log", log],
            in: directory,
            name: "collector"
        )
        return SpanCollector(process: process, port: port, log: log)
    }

    var lines: [String] {
        guard let text = try? String(contentsOfFile: self.log, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").map(String.init)
    }

    var spans: [Span] {
        self.lines.compactMap { try? JSONDecoder().decode(Span.self, from: Data($0.utf8)) }
    }

    func spans(ofTrace trace: String) -> [Span] {
        self.spans.filter { $0.trace_id == trace }.sorted { $0.start < $1.start }
    }

    func stop() {
        self.process.signal(SIGKILL)
        self.process.reap()
    }
}

@Suite("Traces: each attempt of a traced job is a span in the producer's trace")
struct TraceDaemonTests {
    static func hex(_ count: Int) -> String {
        String((0..<count).map { _ in "0123456789abcdef".randomElement()! })
    }

    @Test(
        "a job retried once makes two spans, the first a child of the producer's span, the retry a child linked to it; across a kill -9 the survivor's retry links to the dead worker's first attempt, an attempt in flight at the death leaves no span, and an untraced job none"
    )
    func spansAcrossRetryAndKill() async throws {
        try await DaemonFixture.run(expected: .seconds(12)) { f in
            let collector = try await SpanCollector.start(in: f.directory)
            defer { collector.stop() }
            let (retried, hanging, untraced) = (DaemonFixture.token(1), DaemonFixture.token(2), DaemonFixture.token(4))
            // The retried job's first attempt fails (the victim's span); its retry is due 12 s later (an alert's
            // priority 10 doubles the 6 s base delay), after the kill: the survivor's span must link to the
            // victim's. The hanging job is in flight at the kill.
            f.simulator.script(retried, .failThenSucceed(times: 1, status: 500, reason: "InternalServerError"))
            f.simulator.script(hanging, .times(1, .latency(.seconds(30))))
            let traces = (0..<2).map { _ in (trace: Self.hex(32), parent: Self.hex(16)) }
            try await f.db.execute(
                """
                INSERT INTO push.jobs (topic, device_token, payload, traceparent) VALUES
                ('com.example.app', '\(retried)', '{"aps":{"alert":"a"}}', '00-\(traces[0].trace)-\(traces[0].parent)-01'),
                ('com.example.app', '\(hanging)', '{"aps":{"alert":"b"}}', '00-\(traces[1].trace)-\(traces[1].parent)-01'),
                ('com.example.app', '\(untraced)', '{"aps":{"alert":"d"}}', NULL)
                """
            )
            let flags = [
                "--otlp-endpoint", "http://127.0.0.1:\(collector.port)", "--base-delay-ms", "6000", "--max-delay-ms",
                "6000", "--no-jitter", "--request-timeout-ms", "40000", "--lease", "60s",
            ]
            let environment = ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json", "OTEL_BSP_SCHEDULE_DELAY": "100"]
            let victim = try f.startWorker("victim", flags, environment: environment)
            try await f.waitUntil(.seconds(60), "the victim's first span exported and a request in flight") {
                collector.spans(ofTrace: traces[0].trace).count == 1
                    && f.simulator.requests.contains { $0.deviceToken == hanging }
            }
            victim.signal(SIGKILL)
            victim.reap()
            let retriedState = try await f.db.int64(
                "SELECT count(*) FROM push.jobs WHERE device_token = \(retried) AND state = 'pending' AND attempts = 1"
            )
            try #require(retriedState == 1, "the retried job waits for its retry at the kill")
            let survivor = try f.startWorker("survivor", flags, environment: environment)
            defer {
                survivor.signal(SIGKILL)
                survivor.reap()
            }
            try await f.waitUntil(.seconds(90), "every job delivered and its spans exported") {
                let open = try await f.unfinished()
                return open == 0 && collector.spans(ofTrace: traces[0].trace).count == 2
                    && collector.spans(ofTrace: traces[1].trace).count == 1
            }
            survivor.signal(SIGTERM)
            survivor.reap()
            try await FaultTests.assertInvariants(f, jobs: 3, diedWorkers: ["victim"])
            let all = collector.spans
            #expect(!collector.lines.contains { $0.contains("\"error\"") }, "the collector took every export")
            #expect(all.count == 3, "two spans and one; none for the untraced job: \(collector.lines)")
            #expect(all.allSatisfy { $0.service == "push-worker" && $0.name == "process push.jobs" })
            #expect(
                !collector.lines.contains { $0.contains(retried) || $0.contains(hanging) },
                "no device token in any span"
            )
            let a = collector.spans(ofTrace: traces[0].trace)
            print("spans of the job retried once (trace \(traces[0].trace), producer span \(traces[0].parent)):")
            for span in a {
                print(
                    "  span \(span.span_id) parent \(span.parent_span_id) links \(span.links.map(\.span_id)) \(span.name) attempt \(span.attempt) outcome \(span.outcome) status \(span.attributes["http.response.status_code"]?.description ?? "-") worker \(span.attributes["push.worker"]?.description ?? "-") \((span.end - span.start) / 1_000_000) ms"
                )
                print(
                    "    "
                        + span.attributes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(
                            separator: " "
                        )
                )
            }
            try #require(a.count == 2)
            do {
                #expect(a[0].attempt == 1 && a[0].outcome == "retry" && a[0].parent_span_id == traces[0].parent)
                #expect(a[0].attributes["push.worker"]?.description == "victim")
                #expect(a[0].links.isEmpty, "the first attempt is a child, unlinked")
                #expect(a[1].attempt == 2 && a[1].outcome == "delivered" && a[1].parent_span_id == traces[0].parent)
                #expect(a[1].attributes["push.worker"]?.description == "survivor")
                #expect(
                    a[1].links.map(\.span_id) == [a[0].span_id],
                    "the survivor's retry links to the victim's first attempt"
                )
                #expect(a[1].links.first?.trace_id == traces[0].trace)
            }
            let b = collector.spans(ofTrace: traces[1].trace)
            #expect(
                b.count == 1 && b.first?.attempt == 2 && b.first?.outcome == "delivered"
                    && b.first?.attributes["push.worker"]?.description == "survivor",
                "\(b.map { "\($0.attributes["push.worker"]?.description ?? "?") attempt \($0.attempt) \($0.outcome)" })"
            )
            #expect(
                b.first?.parent_span_id == traces[1].parent && b.first?.links.isEmpty == true,
                "the attempt in flight at the death left no span: the survivor's is the first recorded, a child"
            )
        }
    }
}

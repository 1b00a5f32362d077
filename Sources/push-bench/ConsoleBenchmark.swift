import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import PushConsole
import PushQueue
import PushQueueTesting

/// `push-bench console`: the operator console's page render times with a big queue: 1,000,000 delivered
/// rows over the last day, 1,000,000 dead letters over 30 days, and thousands pending; pages read as a signed-in
/// viewer. Each page is fetched
/// over HTTP from a console in this process, 3 times to warm up and then `--requests` times; the median,
/// p95 and max are printed next to the 100 ms target.
struct ConsoleBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "console",
        abstract: "Console page render times with 1,000,000 delivered rows and 1,000,000 dead letters."
    )

    @Option(help: "Delivered rows (over the last 24 hours).") var delivered: Int = 1_000_000
    @Option(help: "Dead letters (over the last 30 days).") var dead: Int = 1_000_000
    @Option(help: "Timed requests per page.") var requests: Int = 20

    func run() async throws {
        let logger = benchLogger()
        let (delivered, dead, requests) = (self.delivered, self.dead, self.requests)
        try await withBenchDatabase(named: "push_console", logger: logger) { url, _ in
            try await withClient(url, logger: logger) { client in
                try await Migrator(client: client, logger: logger).migrate()
                let clock = ContinuousClock()
                let loadStart = clock.now
                try await ConsoleFixture.load(
                    on: client,
                    logger: logger,
                    due: 5_000,
                    scheduled: 2_000,
                    running: 500,
                    delivered: delivered,
                    deliveredHours: 24,
                    superseded: 1_000,
                    dead: dead,
                    deadHours: 24 * 30
                )
                try await client.query("VACUUM ANALYZE push.jobs", logger: logger)
                try await client.query("VACUUM ANALYZE push.dead_jobs", logger: logger)
                print("loaded \(delivered) delivered rows and \(dead) dead letters in \(clock.now - loadStart)")
                let queue = JobQueue(client: client, logger: logger, clock: ContinuousClock())
                var ids: [Int64] = []
                for try await id in try await client.query(
                    """
                    SELECT (SELECT min(id) FROM push.dead_jobs WHERE reason = 'Unregistered'),
                           (SELECT max(id) FROM push.jobs WHERE state = 'delivered')
                    """,
                    logger: logger
                ).decode((Int64, Int64).self) {
                    ids = [id.0, id.1]
                }
                var deep = ""
                for try await (micros, id) in try await client.query(
                    "SELECT (extract(epoch FROM dead_at) * 1000000)::int8, id FROM push.dead_jobs ORDER BY dead_at DESC, id DESC OFFSET \(Int64(max(dead - 60, 0))) LIMIT 1",
                    logger: logger
                ).decode((Int64, Int64).self) {
                    deep = "\(micros)-\(id)"
                }
                let pages: [(String, String)] = [
                    ("overview", "/"),
                    ("dead letters", "/dead"),
                    ("dead letters, trap filter", "/dead?trap=MS020"),
                    ("dead letters, topic filter", "/dead?topic=com.example.app"),
                    ("dead letters, reason filter", "/dead?reason=Unregistered"),
                    ("dead letters, last page", "/dead?after=\(deep)"),
                    ("a dead letter", "/dead/\(ids[0])"),
                    ("a delivered job", "/jobs/\(ids[1])"),
                    ("replay preview (1,000 of one reason)", "/dead/replay?reason=Expired"),
                    ("purge preview (older than 7 days)", "/dead/purge?older_than=7d"),
                ]
                // The server logs its own cancellation at the end as an error: not a figure.
                var quiet = logger
                quiet.logLevel = .critical
                let server = try ConsoleServer(
                    configuration: .init(
                        host: "127.0.0.1",
                        port: 0,
                        token: "bench-token-0123456789",
                        viewerToken: "bench-viewer-0123456789"
                    ),
                    queue: queue,
                    logger: quiet
                )
                let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { try await server.run(handlingSignals: false) { continuation.yield($0) } }
                    var iterator = ports.makeAsyncIterator()
                    guard let port = await iterator.next() else { throw ValidationError("the console did not start") }
                    let cookie = try await consoleSession(port: port, token: "bench-viewer-0123456789")
                    let heading = "page".padding(toLength: 38, withPad: " ", startingAt: 0)
                    print(heading + "   median      p95      max    bytes   (target: under 100 ms)")
                    var over = 0
                    for (name, path) in pages {
                        var times: [Double] = []
                        var bytes = 0
                        for n in 0..<(requests + 3) {
                            let start = clock.now
                            let (status, size) = try await fetch(port: port, path: path, cookie: cookie)
                            let elapsed = clock.now - start
                            guard status == 200 else { throw ValidationError("\(path) answered \(status)") }
                            bytes = size
                            if n >= 3 {
                                times.append(
                                    Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds)
                                        / 1e15
                                )
                            }
                        }
                        times.sort()
                        if times[times.count / 2] >= 100 { over += 1 }
                        let median = times[times.count / 2]
                        let p95 = times[min(Int(Double(times.count) * 0.95), times.count - 1)]
                        print(
                            String(
                                format: "%@ %7.1f ms %7.1f ms %7.1f ms %8d   %@",
                                name.padding(toLength: 38, withPad: " ", startingAt: 0),
                                median,
                                p95,
                                times.last ?? 0,
                                bytes,
                                median < 100 ? "ok" : "OVER"
                            )
                        )
                    }
                    group.cancelAll()
                    if over > 0 { throw ValidationError("\(over) page(s) took 100 ms or more (median)") }
                }
            }
        }
    }
}

/// GET `path` from 127.0.0.1:`port` (HTTP/1.1, connection closed) with `cookie`: status and response size.
func fetch(port: Int, path: String, cookie: String = "") async throws -> (Int, Int) {
    let extra = cookie.isEmpty ? "" : "Cookie: \(cookie)\r\n"
    let response = try await exchange(
        port: port,
        "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\(extra)Connection: close\r\n\r\n"
    )
    let head = String(decoding: response.prefix(64), as: UTF8.self)
    let status = head.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return (status, response.count)
}

/// Signs in to the console with `token` and returns the session cookie (`name=value`).
func consoleSession(port: Int, token: String) async throws -> String {
    let body = "operator=bench&token=\(token)"
    let response = try await exchange(
        port: port,
        "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
    )
    let text = String(decoding: response, as: UTF8.self)
    guard let line = text.split(separator: "\r\n").first(where: { $0.lowercased().hasPrefix("set-cookie:") }),
        let pair = line.dropFirst("set-cookie:".count).split(separator: ";").first
    else { throw ValidationError("the console did not sign the benchmark in: \(text.prefix(200))") }
    return pair.trimmingCharacters(in: .whitespaces)
}

/// One request over a fresh connection to 127.0.0.1:`port`, the whole response read. On a Dispatch thread, so
/// the console in this process keeps the concurrency pool.
func exchange(port: Int, _ request: String) async throws -> [UInt8] {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
                }
            }
            guard connected else {
                continuation.resume(throwing: ValidationError("cannot connect to the console"))
                return
            }
            let bytes = Array(request.utf8)
            _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
            var response: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = recv(fd, &buffer, buffer.count, 0)
                if n <= 0 { break }
                response += buffer[0..<n]
            }
            continuation.resume(returning: response)
        }
    }
}

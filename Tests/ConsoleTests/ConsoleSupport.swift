import Foundation
import Logging
import PostgresNIO
import PushConsole
import PushQueue
import PushQueueTesting
import Testing

/// One HTTP/1.1 exchange over a plain socket: the test sees exactly what a browser would get (status,
/// headers, body), with no redirect followed and no cookie kept.
struct HTTPResult {
    var status: Int
    var headers: [(name: String, value: String)]
    var body: String

    func header(_ name: String) -> String? {
        self.headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    /// The session cookie's `name=value`, from Set-Cookie.
    var sessionCookie: String? {
        self.header("Set-Cookie")?.split(separator: ";").first.map(String.init)
    }

    /// The CSRF token the page's forms carry.
    var csrf: String? {
        guard let range = self.body.range(of: #"name="csrf" value="([0-9a-f]+)""#, options: .regularExpression)
        else { return nil }
        return String(self.body[range].split(separator: "\"")[3])
    }
}

func http(
    _ method: String,
    port: Int,
    _ path: String,
    headers: [String: String] = [:],
    form: [String: String]? = nil
) async throws -> HTTPResult {
    try await offPool { try blockingHTTP(method, port: port, path, headers: headers, form: form) }
}

private func blockingHTTP(
    _ method: String,
    port: Int,
    _ path: String,
    headers: [String: String],
    form: [String: String]?
) throws -> HTTPResult {
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
    guard connected else { throw ConsoleTestError("cannot connect to 127.0.0.1:\(port)") }
    let body =
        form.map { fields in
            fields.sorted { $0.key < $1.key }.map {
                "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0.value)"
            }.joined(separator: "&")
        } ?? ""
    var request = "\(method) \(path) HTTP/1.1\r\nConnection: close\r\n"
    if headers["Host"] == nil { request += "Host: 127.0.0.1:\(port)\r\n" }
    for (name, value) in headers { request += "\(name): \(value)\r\n" }
    if form != nil {
        request += "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: \(body.utf8.count)\r\n"
    }
    request += "\r\n" + body
    let bytes = Array(request.utf8)
    var sent = 0
    while sent < bytes.count {
        let n = bytes[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        guard n > 0 else { throw ConsoleTestError("send failed") }
        sent += n
    }
    var response: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = recv(fd, &buffer, buffer.count, 0)
        if n <= 0 { break }
        response += buffer[0..<n]
    }
    let text = String(decoding: response, as: UTF8.self)
    guard let split = text.range(of: "\r\n\r\n") else { throw ConsoleTestError("no HTTP response: \(text)") }
    let head = text[..<split.lowerBound].split(separator: "\r\n")
    guard let statusLine = head.first, let status = Int(statusLine.split(separator: " ")[1]) else {
        throw ConsoleTestError("bad status line: \(text.prefix(100))")
    }
    let parsed = head.dropFirst().map { line -> (name: String, value: String) in
        let parts = line.split(separator: ":", maxSplits: 1)
        return (String(parts[0]), parts.count > 1 ? parts[1].trimmingCharacters(in: .whitespaces) : "")
    }
    var content = String(text[split.upperBound...])
    if parsed.contains(where: { $0.name.lowercased() == "transfer-encoding" && $0.value == "chunked" }) {
        content = dechunk(content)
    }
    return HTTPResult(status: status, headers: parsed, body: content)
}

private func dechunk(_ text: String) -> String {
    var out = ""
    var rest = Substring(text)
    while let line = rest.range(of: "\r\n") {
        guard let size = Int(rest[..<line.lowerBound], radix: 16), size > 0 else { break }
        let start = line.upperBound
        let bytes = Array(rest[start...].utf8)
        out += String(decoding: bytes.prefix(size), as: UTF8.self)
        rest = Substring(String(decoding: bytes.dropFirst(size + 2), as: UTF8.self))
    }
    return out
}

struct ConsoleTestError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Runs a console on a free port over `db` for `body`, then stops it.
func withConsole<T: Sendable>(
    _ db: TestDatabase,
    token: String? = nil,
    viewerToken: String? = consoleViewerToken,
    basePath: String = "",
    publicHosts: [String] = [],
    logs: LogCapture = LogCapture(),
    _ body: @Sendable (Int) async throws -> T
) async throws -> T {
    let server = try ConsoleServer(
        configuration: .init(
            host: "127.0.0.1",
            port: 0,
            basePath: basePath,
            token: token,
            viewerToken: viewerToken,
            publicHosts: publicHosts
        ),
        queue: db.queue,
        logger: logs.logger
    )
    let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
    return try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask {
            try await server.run(handlingSignals: false) { port in continuation.yield(port) }
            return nil
        }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else { throw ConsoleTestError("the console did not start") }
        let result = try await body(port)
        group.cancelAll()
        return result
    }
}

/// The operator token of the console in tests.
let consoleToken = "test-token-0123456789abcdef"
/// The viewer (read-only) token of the console in tests.
let consoleViewerToken = "viewer-token-0123456789abcdef"

/// Signs in as `name` with `token` and returns the cookie and the CSRF token of the overview.
func signIn(
    port: Int,
    name: String = "alice",
    token: String = consoleToken,
    base: String = ""
) async throws -> (cookie: String, csrf: String) {
    let login = try await http("POST", port: port, base + "/login", form: ["operator": name, "token": token])
    #expect(login.status == 303)
    let cookie = try #require(login.sessionCookie)
    let page = try await http("GET", port: port, base + "/", headers: ["Cookie": cookie])
    return (cookie, try #require(page.csrf))
}

/// The headers of a viewer's session: what a read of jobs and dead letters needs.
func viewer(port: Int, base: String = "") async throws -> [String: String] {
    ["Cookie": try await signIn(port: port, name: "vera", token: consoleViewerToken, base: base).cookie]
}

/// The console's log lines, kept for assertions (and not printed).
final class LogCapture: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [(level: Logger.Level, message: String, metadata: Logger.Metadata)] = []

    var logger: Logger {
        var logger = Logger(label: "console.test") { _ in CapturingHandler(capture: self) }
        logger.logLevel = .notice
        return logger
    }

    func append(_ level: Logger.Level, _ message: String, _ metadata: Logger.Metadata) {
        self.lock.withLock { self.lines.append((level, message, metadata)) }
    }

    var entries: [(level: Logger.Level, message: String, metadata: Logger.Metadata)] {
        self.lock.withLock { self.lines }
    }

    /// Every line and its metadata as text, for "nothing secret was logged".
    var text: String {
        self.entries.map { "\($0.message) \($0.metadata.map { "\($0.key)=\($0.value)" }.joined(separator: " "))" }
            .joined(separator: "\n")
    }
}

struct CapturingHandler: LogHandler {
    let capture: LogCapture
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .notice

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var merged = self.metadata
        for (key, value) in event.metadata ?? [:] { merged[key] = value }
        self.capture.append(event.level, "\(event.message)", merged)
    }
}

import Foundation
import HTTPTypes
import Hummingbird
public import Logging
import Mustache
import NIOCore
public import PushQueue

/// `push-worker console`: a small server-rendered web app over the queue's Postgres for the person on call.
///
/// Every query goes through ``JobQueue``. Read-only unless given a token (``ConsoleAuth``). Responses carry a
/// strict Content-Security-Policy (no script at all, styles from the console's own stylesheet only), are
/// never cached, and may not be framed.
public struct ConsoleServer: Sendable {
    public struct Configuration: Sendable {
        /// Where to listen; 127.0.0.1 unless told otherwise.
        public var host: String
        public var port: Int
        /// The path prefix a reverse proxy serves the console under (`/push`), or empty.
        public var basePath: String
        /// The operator token: reads and changes (`--token-file`); `nil`: nothing can be changed here.
        public var token: String?
        /// The viewer token: reads only (`--viewer-token-file`). With neither token the console shows counts
        /// and charts only.
        public var viewerToken: String?
        /// Host names the console answers to besides loopback (a reverse proxy's public name). A request
        /// naming any other host is refused: a web page that rebinds its own name to 127.0.0.1 cannot read
        /// the console from a browser on this machine. A name given as `https://name` marks the proxy as
        /// serving https: the session cookie is then `Secure` (as it is for any request the proxy marks
        /// `X-Forwarded-Proto: https`).
        public var publicHosts: [String]

        public init(
            host: String = "127.0.0.1",
            port: Int = 8080,
            basePath: String = "",
            token: String? = nil,
            viewerToken: String? = nil,
            publicHosts: [String] = []
        ) {
            self.host = host
            self.port = port
            self.basePath = basePath
            self.token = token
            self.viewerToken = viewerToken
            self.publicHosts = publicHosts
        }

        /// `https://ops.example.com:8443/push` → `ops.example.com`; a bare name stays (the port goes: the
        /// Host check compares names).
        static func hostName(_ publicHost: String) -> String {
            var name = publicHost.lowercased()
            for scheme in ["https://", "http://"] where name.hasPrefix(scheme) { name.removeFirst(scheme.count) }
            let authority = String(name.split(separator: "/").first ?? Substring(name))
            return ConsoleMiddleware<ConsoleRequestContext>.hostName(authority)
        }

        /// The public hosts declared as served over https.
        var httpsHosts: Set<String> {
            Set(self.publicHosts.filter { $0.lowercased().hasPrefix("https://") }.map(Self.hostName))
        }

        /// The Host header values (without port) accepted.
        var allowedHosts: Set<String> {
            var hosts: Set<String> = ["127.0.0.1", "localhost", "::1", "[::1]"]
            for host in self.publicHosts { hosts.insert(Self.hostName(host)) }
            if !["0.0.0.0", "::", "[::]"].contains(self.host) { hosts.insert(self.host.lowercased()) }
            return hosts
        }
    }

    let configuration: Configuration
    let queue: JobQueue
    let logger: Logger
    let pages: ConsolePages

    public init(configuration: Configuration, queue: JobQueue, logger: Logger) throws {
        self.configuration = configuration
        self.queue = queue
        self.logger = logger
        self.pages = ConsolePages(
            queue: queue,
            auth: ConsoleAuth(token: configuration.token, viewerToken: configuration.viewerToken),
            httpsHosts: configuration.httpsHosts,
            base: Self.normalized(basePath: configuration.basePath),
            library: try ConsoleTemplates.library(),
            logger: logger
        )
    }

    /// `push/` → `/push`; `/` or empty → empty.
    static func normalized(basePath: String) -> String {
        let trimmed = basePath.trimmingCharacters(in: CharacterSet(charactersIn: "/ "))
        return trimmed.isEmpty ? "" : "/" + trimmed
    }

    /// Serves until cancelled, or SIGTERM/SIGINT. `onListening` gets the bound port (useful with port 0).
    /// With `handlingSignals` (the command) SIGTERM and SIGINT stop it gracefully; tests cancel it instead.
    public func run(
        handlingSignals: Bool = true,
        onListening: @escaping @Sendable (Int) async -> Void = { _ in }
    ) async throws {
        let router = Router(context: ConsoleRequestContext.self)
        router.add(middleware: ConsoleMiddleware(allowedHosts: self.configuration.allowedHosts, logger: self.logger))
        let group = router.group(RouterPath(self.pages.base.isEmpty ? "" : String(self.pages.base.dropFirst())))
        let pages = self.pages
        group.get("") { request, _ in try await pages.overview(request) }
        group.get("assets/console.css") { _, _ in
            Response(
                status: .ok,
                headers: [.contentType: "text/css; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: ConsoleTemplates.css))
            )
        }
        group.get("assets/favicon.svg") { _, _ in
            Response(
                status: .ok,
                headers: [.contentType: "image/svg+xml"],
                body: .init(byteBuffer: ByteBuffer(string: ConsoleTemplates.favicon))
            )
        }
        group.get("dead") { request, _ in try await pages.deadLetters(request) }
        group.get("dead/replay") { request, _ in try await pages.replayPreview(request) }
        group.post("dead/replay") { request, _ in try await pages.replay(request) }
        group.get("dead/purge") { request, _ in try await pages.purgePreview(request) }
        group.post("dead/purge") { request, _ in try await pages.purge(request) }
        group.get("dead/:id") { request, context in
            try await pages.deadLetter(request, id: context.parameters.get("id", as: Int64.self))
        }
        group.get("activities/:id") { request, context in
            try await pages.activity(request, id: context.parameters.get("id", as: Int64.self))
        }
        group.get("jobs") { request, _ in try await pages.findJob(request) }
        group.get("jobs/:id") { request, context in
            try await pages.job(request, id: context.parameters.get("id", as: Int64.self))
        }
        group.post("pause") { request, _ in try await pages.pause(request) }
        group.post("resume") { request, _ in try await pages.resume(request) }
        group.get("login") { request, _ in try await pages.loginPage(request) }
        // X-Forwarded-For counts only behind a declared reverse proxy (--public-host): without one, any client
        // could name a new address in each attempt and never be throttled.
        let behindProxy = !self.configuration.publicHosts.isEmpty
        group.post("login") { request, context in
            try await pages.login(request, client: context.client(of: request, behindProxy: behindProxy))
        }
        group.post("logout") { request, _ in try await pages.logout(request) }

        var logger = self.logger
        logger[metadataKey: "component"] = "console"
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(self.configuration.host, port: self.configuration.port)),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? 0) },
            logger: logger
        )
        if handlingSignals { try await app.runService() } else { try await app.run() }
    }
}

/// Every request: the Host must be one the console answers to; every response, an error page included,
/// carries the security headers; an unexpected error is a short page (details in the log), never a crash.
struct ConsoleMiddleware<Context: RequestContext>: RouterMiddleware {
    let allowedHosts: Set<String>
    let logger: Logger

    static var policy: String {
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    }

    func handle(
        _ request: Request,
        context: Context,
        next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        var response: Response
        let host = Self.hostName(request.head.authority ?? "")
        if !self.allowedHosts.contains(host) {
            response = Self.text(
                .misdirectedRequest,
                "This console does not answer to the host \"\(host)\". Behind a reverse proxy, start it with --public-host \(host.isEmpty ? "NAME" : host).\n"
            )
        } else {
            do {
                response = try await next(request, context)
            } catch let error as HTTPError {
                response = Self.text(error.status, (error.body ?? error.status.reasonPhrase) + "\n")
            } catch {
                self.logger.error(
                    "console request failed",
                    metadata: ["path": "\(request.uri.path)", "error": "\(String(reflecting: error))"]
                )
                response = Self.text(
                    .internalServerError,
                    "The console could not answer: \(QueueError.summary(of: error)). Its log has the details.\n"
                )
            }
        }
        response.headers[.contentSecurityPolicy] = Self.policy
        response.headers[.xContentTypeOptions] = "nosniff"
        response.headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        response.headers[.cacheControl] = "no-store"
        response.headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        response.headers[HTTPField.Name("Cross-Origin-Opener-Policy")!] = "same-origin"
        return response
    }

    /// `Host: example.com:8080` → `example.com`; `[::1]:8080` → `[::1]`.
    static func hostName(_ authority: String) -> String {
        let lower = authority.lowercased()
        if lower.hasPrefix("[") { return lower.split(separator: "]").first.map { $0 + "]" } ?? lower }
        return lower.split(separator: ":").first.map(String.init) ?? lower
    }

    static func text(_ status: HTTPResponse.Status, _ message: String) -> Response {
        Response(
            status: status,
            headers: [.contentType: "text/plain; charset=utf-8"],
            body: .init(byteBuffer: ByteBuffer(string: message))
        )
    }
}

/// The console's request context: the client's address, for the sign-in throttle.
struct ConsoleRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    /// The peer's IP address (a reverse proxy's, behind one).
    let peer: String?

    init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.peer = source.channel.remoteAddress?.ipAddress
    }

    /// Who is signing in, for the throttle: the peer; behind a declared proxy on this machine (`--public-host`,
    /// a loopback peer that sends `X-Forwarded-For`), the address the proxy saw (the list's last entry: the one
    /// it added). Without a declared proxy the header is the client's own word and is ignored.
    func client(of request: Request, behindProxy: Bool) -> String {
        let peer = self.peer ?? "unknown"
        guard behindProxy, ["127.0.0.1", "::1"].contains(peer),
            let forwarded = request.headers[HTTPField.Name("X-Forwarded-For")!],
            let last = forwarded.split(separator: ",").last?.trimmingCharacters(in: .whitespaces), !last.isEmpty
        else { return peer }
        return last
    }
}

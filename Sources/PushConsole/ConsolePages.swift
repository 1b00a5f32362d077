import Foundation
import HTTPTypes
import Hummingbird
import Logging
import Mustache
import NIOCore
import PushCore
import PushQueue

/// A refused request: the status and a sentence saying why and what to do.
struct ConsoleRefusal: Error {
    var status: HTTPResponse.Status
    var message: String
}

/// The console's pages: each reads through ``JobQueue`` and renders a template.
struct ConsolePages: Sendable {
    let queue: JobQueue
    let auth: ConsoleAuth
    /// Public host names served over https (the session cookie is `Secure` for them).
    let httpsHosts: Set<String>
    /// The path prefix, `""` or `/push`.
    let base: String
    let library: MustacheLibrary
    let logger: Logger

    /// What every page's frame needs: who is signed in, and the CSRF token their forms carry.
    struct Frame {
        var session: ConsoleAuth.Session?
        var csrf: String
    }

    func frame(_ request: Request) -> Frame {
        let session = self.auth.session(
            fromCookie: request.cookies[ConsoleAuth.cookieName]?.value,
            now: self.queue.clock.wallNow
        )
        return Frame(session: session, csrf: session.map { self.auth.csrfToken(for: $0) } ?? "")
    }

    // MARK: rendering

    func render<Page>(
        _ template: String,
        title: String,
        page: Page,
        frame: Frame,
        status: HTTPResponse.Status = .ok
    ) -> Response {
        var layout = LayoutView(
            base: self.base,
            writable: self.auth.isWritable,
            canSignIn: self.auth.canSignIn,
            title: title,
            signedIn: frame.session != nil,
            operator: frame.session?.operatorName ?? "",
            viewer: frame.session?.role == .viewer,
            canChange: frame.session?.canChange ?? false,
            csrf: frame.csrf,
            page: page
        )
        let body = self.library.render(layout, withTemplate: template) ?? ""
        layout.body = body
        let html = self.library.render(layout, withTemplate: "layout") ?? body
        return Response(
            status: status,
            headers: [.contentType: "text/html; charset=utf-8"],
            body: .init(byteBuffer: ByteBuffer(string: html))
        )
    }

    func message(
        _ text: String,
        title: String,
        status: HTTPResponse.Status,
        frame: Frame,
        links: [(href: String, label: String)] = []
    ) -> Response {
        self.render(
            "message",
            title: title,
            page: MessageView(
                text: text,
                kind: status.code >= 400 ? "alert-text" : "",
                links: links.map { MessageView.Link(href: $0.href, label: $0.label) }
            ),
            frame: frame,
            status: status
        )
    }

    func redirect(_ path: String) -> Response {
        Response(status: .seeOther, headers: [.location: self.base + path])
    }

    /// Runs a page, turning a refusal into its page.
    func page(_ request: Request, _ body: (Frame) async throws -> Response) async throws -> Response {
        let frame = self.frame(request)
        do {
            return try await body(frame)
        } catch let refusal as ConsoleRefusal {
            return self.message(refusal.message, title: "Refused", status: refusal.status, frame: frame)
        }
    }

    // MARK: reads: a session

    /// The session of a page that shows more than counts: jobs, dead letters, topics, sentences, payloads.
    @discardableResult
    func requireReader(_ frame: Frame) throws -> ConsoleAuth.Session {
        if let session = frame.session { return session }
        throw ConsoleRefusal(
            status: .forbidden,
            message: self.auth.canSignIn
                ? "Sign in to read jobs and dead letters: without a session the console shows counts and charts only."
                : "This console was started without a token, so it shows counts and charts only. Start it with --viewer-token-file FILE (read-only) or --token-file FILE (changes too) and sign in to read jobs and dead letters."
        )
    }

    /// Logs that `session` read a payload: payloads are users' data.
    func logPayloadRead(_ session: ConsoleAuth.Session, _ what: String) {
        self.logger.notice(
            "console payload read",
            metadata: [
                "operator": "\(session.operatorName)", "session": "\(session.nonce.prefix(8))", "of": "\(what)",
                "role": "\(session.role.rawValue)",
            ]
        )
    }

    // MARK: changes: token, session, CSRF, same origin

    /// The form of a change request, once it has passed every check; throws the refusal otherwise.
    func authorizeChange(
        _ request: Request,
        frame: Frame,
        signOut: Bool = false
    ) async throws -> (ConsoleAuth.Session, [String: String]) {
        guard self.auth.isWritable || signOut else {
            throw ConsoleRefusal(
                status: .forbidden,
                message:
                    "This console is read-only: it was started without --token-file. Restart it with `push-worker console --token-file FILE` to make changes here, or use the CLI."
            )
        }
        try self.checkSameOrigin(request)
        guard let session = frame.session else {
            throw ConsoleRefusal(
                status: .forbidden,
                message: "Changes need the console token: sign in first (the token is in the console's --token-file)."
            )
        }
        guard session.canChange || signOut else {
            throw ConsoleRefusal(
                status: .forbidden,
                message:
                    "You are signed in with the viewer token, which reads only. Sign out and sign in with the operator token (the console's --token-file) to make changes."
            )
        }
        let form = try await Self.form(request)
        guard self.auth.csrfMatches(form["csrf"], session: session) else {
            throw ConsoleRefusal(
                status: .forbidden,
                message:
                    "The form's CSRF token is missing or wrong (a form from another site, or from before a console restart). Reload the page and submit it again."
            )
        }
        return (session, form)
    }

    /// A browser says where a form came from; one from another origin is refused even with a valid cookie.
    func checkSameOrigin(_ request: Request) throws {
        if request.headers[HTTPField.Name("Sec-Fetch-Site")!] == "cross-site" {
            throw ConsoleRefusal(status: .forbidden, message: "A form from another site cannot change anything here.")
        }
        if let origin = request.headers[HTTPField.Name("Origin")!], origin != "null",
            let host = request.head.authority,
            URL(string: origin)?.host.map({ host == $0 || host.hasPrefix($0 + ":") }) != true
        {
            throw ConsoleRefusal(
                status: .forbidden,
                message: "A form from \(origin) cannot change anything here (the console is at \(host))."
            )
        }
    }

    static func form(_ request: Request) async throws -> [String: String] {
        let buffer = try await request.body.collect(upTo: 64 * 1024)
        return parseForm(String(buffer: buffer))
    }

    static func parseForm(_ text: String) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ s: Substring) -> String {
                s.replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String(s)
            }
            guard let name = parts.first else { continue }
            fields[decode(name)] = parts.count > 1 ? decode(parts[1]) : ""
        }
        return fields
    }

    func logChange(_ session: ConsoleAuth.Session, _ what: String, _ metadata: [String: String] = [:]) {
        // Free text (a pause's reason, a filter) goes in escaped: a newline in it cannot start a forged line.
        var metadata = metadata.mapValues { Logger.MetadataValue.string(HumanText.escaped($0, for: .logLine)) }
        metadata["operator"] = "\(session.operatorName)"
        metadata["session"] = "\(session.nonce.prefix(8))"
        self.logger.notice("console change: \(HumanText.escaped(what, for: .logLine))", metadata: metadata)
    }

    // MARK: sign in and out

    func loginPage(_ request: Request) async throws -> Response {
        let frame = self.frame(request)
        return self.render("login", title: "Sign in", page: LoginView(), frame: frame)
    }

    func login(_ request: Request, client: String = "unknown") async throws -> Response {
        try await self.page(request) { frame in
            guard self.auth.canSignIn else {
                throw ConsoleRefusal(
                    status: .forbidden,
                    message:
                        "This console was started without a token, so there is nothing to sign in to: start it with --viewer-token-file or --token-file."
                )
            }
            try self.checkSameOrigin(request)
            let form = try await Self.form(request)
            // Counted as a failure until it succeeds, in one step: parallel attempts cannot all slip past.
            if let wait = self.auth.throttle.attempt(client: client, now: self.queue.clock.wallNow) {
                throw ConsoleRefusal(
                    status: .tooManyRequests,
                    message:
                        "Too many failed sign-ins from this address in the last minute: try again in \(Int(wait.rounded(.up))) s. The console's log names the attempts."
                )
            }
            let name = (form["operator"] ?? "").trimmingCharacters(in: .whitespaces)
            guard ConsoleAuth.isValidOperatorName(name) else {
                throw ConsoleRefusal(
                    status: .badRequest,
                    message:
                        "Give your name (1–40 letters, digits, spaces or ._@-): it goes into the log with every change you make."
                )
            }
            guard let role = self.auth.role(forToken: form["token"] ?? "") else {
                self.logger.warning(
                    "console sign-in refused: wrong token",
                    metadata: ["operator": "\(name)", "client": "\(client)"]
                )
                throw ConsoleRefusal(
                    status: .forbidden,
                    message:
                        "Wrong token. It is the contents of a file the console was started with (--token-file, or --viewer-token-file to read only)."
                )
            }
            self.auth.throttle.succeeded(client: client)
            let (session, cookie) = self.auth.newSession(operatorName: name, role: role, now: self.queue.clock.wallNow)
            self.logger.notice(
                "console sign-in",
                metadata: [
                    "operator": "\(name)", "session": "\(session.nonce.prefix(8))", "role": "\(role.rawValue)",
                ]
            )
            var response = self.redirect("/")
            response.setCookie(
                Cookie(
                    name: ConsoleAuth.cookieName,
                    value: cookie,
                    maxAge: Int(ConsoleAuth.sessionLifetime),
                    path: self.base.isEmpty ? "/" : self.base,
                    secure: self.isHTTPS(request),
                    httpOnly: true,
                    sameSite: .strict
                )
            )
            return response
        }
    }

    /// Whether the browser reached the console over https: through a public host declared `https://`, or a
    /// proxy that says so (`X-Forwarded-Proto: https`). The console itself serves plain HTTP on loopback.
    func isHTTPS(_ request: Request) -> Bool {
        if request.headers[HTTPField.Name("X-Forwarded-Proto")!]?.lowercased() == "https" { return true }
        return self.httpsHosts.contains(ConsoleMiddleware<ConsoleRequestContext>.hostName(request.head.authority ?? ""))
    }

    func logout(_ request: Request) async throws -> Response {
        try await self.page(request) { frame in
            let (session, _) = try await self.authorizeChange(request, frame: frame, signOut: true)
            self.auth.revoke(session, now: self.queue.clock.wallNow)
            self.logger.notice(
                "console sign-out",
                metadata: ["operator": "\(session.operatorName)", "session": "\(session.nonce.prefix(8))"]
            )
            var response = self.redirect("/")
            response.setCookie(
                Cookie(
                    name: ConsoleAuth.cookieName,
                    value: "",
                    maxAge: 0,
                    path: self.base.isEmpty ? "/" : self.base,
                    secure: self.isHTTPS(request),
                    httpOnly: true,
                    sameSite: .strict
                )
            )
            return response
        }
    }
}

// MARK: formatting

/// `2026-11-23 19:04:05 UTC`.
func timestamp(_ date: Date?) -> String {
    guard let date else { return "" }
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "UTC")
    formatter.dateFormat = "yyyy-MM-dd HH:mm:ss 'UTC'"
    return formatter.string(from: date)
}

/// The longest duration a form may give: ten years.
let maxDuration: Double = 3650 * 86400

/// `90s`, `30m`, `24h`, `7d` as seconds, more than zero and up to ten years; `nil` otherwise.
func parseDuration(_ text: String) -> Double? {
    // At most ten years: a date further back is not one Postgres' binding (or anyone) needs.
    HumanText.seconds(from: text, maximum: maxDuration).flatMap { $0 > 0 ? $0 : nil }
}

extension BoundedCount {
    var shown: String { self.exact ? grouped(self.value) : "≈ " + grouped(self.value) }
}

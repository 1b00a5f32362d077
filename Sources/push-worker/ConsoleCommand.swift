import ArgumentParser
import Foundation
import PushConsole
import PushQueue
import PushTransport

/// `push-worker console`: the operator console in a browser.
struct ConsoleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "console",
        abstract: "The operator console in a browser: queue, dead letters, job detail, replay, purge, pause.",
        discussion: """
            Serves a small web app over the same Postgres as the workers, for the person on call: counts by \
            state and the last hour's outcomes, dead letters grouped by trap id and reason with the runbook's \
            advice, a job's or dead letter's history and the exact request a send would issue, replay and \
            purge with a dry-run preview first, and fleet-wide pause and resume.

            Without a signed-in session it shows counts and charts only. Give it --viewer-token-file (reads: \
            jobs, dead letters, payloads) and/or --token-file (reads and changes: replay, purge, pause, resume); \
            a person signs in with a token and their name, and every change and every payload read is logged \
            with the name. After ten failed sign-ins within a minute, sign-in is refused until the minute has passed. Device \
            tokens are shown only as fingerprints, payloads only when asked for. Listens on 127.0.0.1:8080 by \
            default; behind a reverse proxy under a path, pass --base-path, and --public-host https://NAME so \
            the session cookie is marked Secure.

            Examples:
              push-worker console
              openssl rand -hex 32 > console.token && chmod 600 console.token
              push-worker console --token-file console.token --base-path /push --public-host https://ops.example.com
            """
    )

    @OptionGroup var database: DatabaseOptions
    @Option(
        help: "The address to listen on. Anything other than loopback makes the console reachable from the network."
    )
    var host: String = "127.0.0.1"
    @Option(help: "The port to listen on.") var port: Int = 8080
    @Option(
        name: .customLong("token-file"),
        help:
            "A file holding the token that allows changes (at least 16 characters; mode 0600). Without it the console is read-only."
    ) var tokenFile: String?
    @Option(
        name: .customLong("viewer-token-file"),
        help:
            "A file holding a read-only token (at least 16 characters; mode 0600): signed in with it, a person reads jobs, dead letters and payloads but changes nothing."
    ) var viewerTokenFile: String?
    @Option(
        name: .customLong("public-host"),
        help:
            "A host name the console answers to besides 127.0.0.1 and localhost: a reverse proxy's public name (repeat for several). Requests for any other host are refused. Write https://NAME when the proxy serves https: the session cookie is then Secure."
    ) var publicHosts: [String] = []
    @Option(
        name: .customLong("base-path"),
        help: "The path prefix a reverse proxy serves the console under, e.g. /push."
    ) var basePath: String = ""

    func validate() throws {
        guard (0...65535).contains(self.port) else {
            throw ValidationError("--port \(self.port) is not a TCP port: use 1 to 65535 (8080 by default)")
        }
        guard self.basePath.isEmpty || self.basePath.hasPrefix("/"),
            self.basePath.allSatisfy({ $0.isLetter || $0.isNumber || "/-_.".contains($0) })
        else {
            throw ValidationError(
                "--base-path \(self.basePath) is not a path prefix: use something like /push (letters, digits, / - _ .)"
            )
        }
    }

    func run() async throws {
        let token = try self.tokenFile.map(Self.readToken)
        let viewerToken = try self.viewerTokenFile.map(Self.readToken)
        if let token, token == viewerToken {
            throw CLIError(
                "--viewer-token-file and --token-file hold the same token: a viewer could then make changes. Make a separate one with `openssl rand -hex 32`."
            )
        }
        let logger = try self.database.makeLoggerDefaultingTo(.notice)
        if !["127.0.0.1", "::1", "localhost"].contains(self.host) {
            printError(
                "warning: the console listens on \(self.host): anyone who can reach it can read the queue's metadata. Put it behind a reverse proxy with authentication, or listen on 127.0.0.1."
            )
        }
        let configuration = ConsoleServer.Configuration(
            host: self.host,
            port: self.port,
            basePath: self.basePath,
            token: token,
            viewerToken: viewerToken,
            publicHosts: self.publicHosts
        )
        let base = configuration.basePath
        try await self.database.withQueue { queue, _, _ in
            let server = try ConsoleServer(configuration: configuration, queue: queue, logger: logger)
            try await server.run { port in
                printError(
                    "console on http://\(configuration.host):\(port)\(base)/ (\(Self.access(operator: token != nil, viewer: viewerToken != nil)))"
                )
            }
        }
    }

    /// What the startup line says about who can do what.
    static func access(operator: Bool, viewer: Bool) -> String {
        switch (`operator`, viewer) {
        case (false, false):
            return
                "counts and charts only: start with --viewer-token-file or --token-file to sign in and read jobs and dead letters"
        case (false, true): return "sign in with the viewer token to read; nothing can be changed from it"
        case (true, false): return "sign in with the token from --token-file to read and make changes"
        case (true, true): return "sign in with the viewer token to read, the operator token to make changes too"
        }
    }

    static func readToken(_ path: String) throws -> String {
        let bytes: [UInt8]
        switch SecretFile.read(path, policy: .privateKey, maxBytes: 4096) {
        case .success(let read): bytes = read
        case .failure(let failure): throw CLIError("--token-file \(path) \(failure.sentence)")
        }
        let token = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard token.count >= 16, !token.contains(where: \.isNewline) else {
            throw CLIError(
                "--token-file \(path) must hold one line of at least 16 characters: make one with `openssl rand -hex 32 > \(path) && chmod 600 \(path)`"
            )
        }
        return token
    }
}

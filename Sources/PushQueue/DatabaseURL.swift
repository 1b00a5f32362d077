public import Foundation
import NIOSSL
public import PostgresNIO

/// A parsed `DATABASE_URL` (`postgres://user:password@host:port/database?sslmode=…`).
///
/// `sslmode` follows libpq: `disable`; `prefer` (the default) and `require` encrypt without checking
/// the server's certificate; `verify-ca` and `verify-full` check it against `sslrootcert` (a PEM file)
/// or, without one, the system's trust roots. As in libpq, `require` with an `sslrootcert` verifies the
/// CA too. Other `ssl*` settings (client certificates, CRLs) are refused rather than ignored.
public struct DatabaseURL: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: String
    /// The CA certificate file (PEM) that verifies the server; `nil`: the system's trust roots.
    public var sslRootCert: String?

    /// Parses a URL; the error names what is wrong and shows the expected form.
    public init(_ string: String) throws {
        func fail(_ what: String) -> QueueError {
            QueueError(
                code: .invalidDatabaseURL,
                message:
                    "DATABASE_URL \(what); expected postgres://USER:PASSWORD@HOST:PORT/DATABASE (password and port optional)"
            )
        }
        guard let components = URLComponents(string: string) else { throw fail("is not a URL") }
        guard let scheme = components.scheme, ["postgres", "postgresql"].contains(scheme.lowercased()) else {
            throw fail("must start with postgres:// or postgresql://")
        }
        guard let host = components.host, !host.isEmpty else { throw fail("has no host") }
        self.host = host
        self.port = components.port ?? 5432
        self.username = components.user.flatMap { $0.removingPercentEncoding } ?? "postgres"
        self.password = components.password.flatMap { $0.removingPercentEncoding }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        self.database = path.isEmpty ? self.username : path
        let mode = components.queryItems?.first { $0.name == "sslmode" }?.value ?? "prefer"
        guard ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"].contains(mode) else {
            throw fail("has sslmode=\(mode); use disable, prefer, require, verify-ca or verify-full")
        }
        self.sslMode = mode
        let root = components.queryItems?.first { $0.name == "sslrootcert" }?.value
        self.sslRootCert = root == "system" ? nil : root
        if root == "system" && mode != "verify-full" {
            throw fail("has sslrootcert=system with sslmode=\(mode): as libpq, that needs sslmode=verify-full")
        }
        if let root = self.sslRootCert, !FileManager.default.isReadableFile(atPath: root) {
            throw fail(
                "has sslrootcert=\(root), which cannot be read: give the path of the server's CA certificate (PEM)"
            )
        }
        if root != nil && ["disable", "allow", "prefer"].contains(mode) {
            throw fail("has sslrootcert with sslmode=\(mode), which never verifies: use sslmode=verify-full")
        }
        for item in components.queryItems ?? []
        where item.name.hasPrefix("ssl") && !["sslmode", "sslrootcert"].contains(item.name) {
            throw fail(
                "has \(item.name), which push-worker does not support: remove it (sslmode and sslrootcert are honoured)"
            )
        }
    }

    /// Builds a URL from parts (the embedded cluster uses this).
    public init(
        host: String,
        port: Int,
        username: String,
        password: String? = nil,
        database: String,
        sslMode: String = "disable"
    ) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.sslMode = sslMode
    }

    /// The same server and user, another database.
    public func with(database: String) -> DatabaseURL {
        var copy = self
        copy.database = database
        return copy
    }

    /// The URL with the password masked, safe to print.
    public var description: String {
        let credentials = self.password == nil ? self.username : "\(self.username):***"
        return "postgres://\(credentials)@\(self.host):\(self.port)/\(self.database)?sslmode=\(self.sslMode)"
    }

    /// The URL with its password, for handing to psql or another process.
    public var connectionString: String {
        var components = URLComponents()
        components.scheme = "postgres"
        components.host = self.host
        components.port = self.port
        components.user = self.username
        components.password = self.password
        components.path = "/" + self.database
        components.queryItems =
            [URLQueryItem(name: "sslmode", value: self.sslMode)]
            + (self.sslRootCert.map { [URLQueryItem(name: "sslrootcert", value: $0)] } ?? [])
        return components.string ?? self.description
    }

    var tlsConfiguration: TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        let verifies = ["verify-ca", "verify-full"].contains(self.sslMode) || self.sslRootCert != nil
        if !verifies { tls.certificateVerification = .none }
        if self.sslMode != "verify-full" && verifies { tls.certificateVerification = .noHostnameVerification }
        if let root = self.sslRootCert { tls.trustRoots = .file(root) }
        return tls
    }

    /// Configuration for a pooled `PostgresClient`.
    public var clientConfiguration: PostgresClient.Configuration {
        let tls: PostgresClient.Configuration.TLS
        switch self.sslMode {
        case "disable": tls = .disable
        case "allow", "prefer": tls = .prefer(self.tlsConfiguration)
        default: tls = .require(self.tlsConfiguration)
        }
        return PostgresClient.Configuration(
            host: self.host,
            port: self.port,
            username: self.username,
            password: self.password,
            database: self.database,
            tls: tls
        )
    }

    /// Configuration for a single `PostgresConnection` (the LISTEN connection).
    public func connectionConfiguration() throws -> PostgresConnection.Configuration {
        let tls: PostgresConnection.Configuration.TLS
        switch self.sslMode {
        case "disable": tls = .disable
        case "allow", "prefer": tls = .prefer(try NIOSSLContext(configuration: self.tlsConfiguration))
        default: tls = .require(try NIOSSLContext(configuration: self.tlsConfiguration))
        }
        return PostgresConnection.Configuration(
            host: self.host,
            port: self.port,
            username: self.username,
            password: self.password,
            database: self.database,
            tls: tls
        )
    }

    /// Opens one connection and closes it, so a command fails at once with a sentence naming the server
    /// and what to check, rather than with a connection pool's circuit-breaker error later.
    public func probe(logger: Logger) async throws {
        do {
            let connection = try await PostgresConnection.connect(
                configuration: try self.connectionConfiguration(),
                id: 0,
                logger: logger
            )
            try? await connection.close()
        } catch {
            throw QueueError(
                code: .databaseUnreachable,
                message:
                    "cannot connect to Postgres at \(self.host):\(self.port) as \(self.username) (database \(self.database)): \(QueueError.summary(of: error)). Check that the server is running and accepts connections, and DATABASE_URL (or --database-url)"
            )
        }
    }

    /// Opens one connection with the startup parameters the worker's sessions carry (its session settings
    /// and `application_name`), so a server or pooler that refuses them is named at start, with the fix,
    /// instead of a pool retrying in silence. A pooler in transaction mode (PgBouncer) refuses parameters it
    /// does not know ("unsupported startup parameter"), and could not keep them per session anyway.
    public func probeSessionSettings(_ parameters: [(String, String)], logger: Logger) async throws {
        var configuration = try self.connectionConfiguration()
        configuration.options.additionalStartupParameters = parameters
        do {
            let connection = try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
            try? await connection.close()
        } catch {
            let summary = QueueError.summary(of: error)
            if summary.contains("unsupported startup parameter") || summary.contains("startup parameter") {
                throw QueueError(
                    code: .databaseUnreachable,
                    message:
                        "\(self.host):\(self.port) refused the worker's session settings (\(summary)): a connection pooler in transaction mode (PgBouncer) is in the way. Start the worker with --no-session-settings (it then sets nothing per session), or point DATABASE_URL at Postgres itself"
                )
            }
            throw QueueError(
                code: .databaseUnreachable,
                message:
                    "cannot connect to Postgres at \(self.host):\(self.port) as \(self.username) (database \(self.database)): \(QueueError.summary(of: error)). Check that the server is running and accepts connections, and DATABASE_URL (or --database-url)"
            )
        }
    }
}

import Foundation
import NIOSSL
public import PostgresNIO

/// A parsed `DATABASE_URL` (`postgres://user:password@host:port/database?sslmode=…`), or libpq's multi-host
/// form (`postgres://user@db1:5432,db2:5432/app?target_session_attrs=read-write&connect_timeout=5`): the hosts
/// are tried in order and the first that suits `target_session_attrs` (`any`, `read-write`, `primary`) is
/// used (``DatabaseProbe/primary(patience:excluding:)``); `connect_timeout` bounds each try. This type only
/// parses and configures; ``DatabaseProbe`` connects.
///
/// `sslmode` follows libpq: `disable`; `prefer` (the default) and `require` encrypt without checking
/// the server's certificate; `verify-ca` and `verify-full` check it against `sslrootcert` (a PEM file)
/// or, without one, the system's trust roots. As in libpq, `require` with an `sslrootcert` verifies the
/// CA too. Other `ssl*` settings (client certificates, CRLs) are refused rather than ignored.
public struct DatabaseURL: Sendable, Hashable, CustomStringConvertible {
    /// The host in use: the first of ``hosts`` until ``DatabaseProbe/primary(patience:excluding:)`` picks one.
    public var host: String
    public var port: Int
    /// Every host of the URL, in order (one for a single-host URL).
    public var hosts: [Endpoint]
    /// libpq's `target_session_attrs`: `any`, `read-write` or `primary`.
    public var targetSessionAttrs: String = "any"
    /// libpq's `connect_timeout`, in seconds, for each host tried; `nil`: the driver's default.
    public var connectTimeout: Int?

    /// One host of a URL.
    public struct Endpoint: Sendable, Hashable, CustomStringConvertible {
        public var host: String
        public var port: Int
        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }
        public var description: String {
            self.host.contains(":") ? "[\(self.host)]:\(self.port)" : "\(self.host):\(self.port)"
        }
    }
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
        // libpq's multi-host form puts a comma-separated host list where one host goes; URLComponents takes
        // one. The list is cut out here and parsed on its own, and the URL parsed with its first host.
        var text = string
        var listed: [Endpoint] = []
        if let schemeEnd = string.range(of: "://") {
            let afterScheme = string[schemeEnd.upperBound...]
            let authorityEnd = afterScheme.firstIndex { "/?#".contains($0) } ?? afterScheme.endIndex
            let authority = afterScheme[..<authorityEnd]
            let at = authority.lastIndex(of: "@")
            let hostList = at.map { authority[authority.index(after: $0)...] } ?? authority
            if hostList.contains(",") {
                for item in hostList.split(separator: ",", omittingEmptySubsequences: false) {
                    guard let endpoint = Self.endpoint(String(item)) else {
                        throw fail("has a host list with \"\(item)\", which is not HOST or HOST:PORT")
                    }
                    listed.append(endpoint)
                }
                text.replaceSubrange(hostList.startIndex..<hostList.endIndex, with: listed[0].description)
            }
        }
        guard let components = URLComponents(string: text) else { throw fail("is not a URL") }
        guard let scheme = components.scheme, ["postgres", "postgresql"].contains(scheme.lowercased()) else {
            throw fail("must start with postgres:// or postgresql://")
        }
        guard let host = components.host, !host.isEmpty else { throw fail("has no host") }
        self.host = host.trimmingCharacters(in: ["[", "]"])
        self.port = components.port ?? 5432
        self.hosts = listed.isEmpty ? [Endpoint(host: self.host, port: self.port)] : listed
        let items = components.queryItems ?? []
        if let target = items.first(where: { $0.name == "target_session_attrs" })?.value {
            guard ["any", "read-write", "primary"].contains(target) else {
                throw fail(
                    "has target_session_attrs=\(target): the worker writes, so use read-write or primary (or any); standby, read-only and prefer-standby are not supported"
                )
            }
            self.targetSessionAttrs = target
        }
        if let timeout = items.first(where: { $0.name == "connect_timeout" })?.value {
            guard let seconds = Int(timeout), seconds >= 0 else {
                throw fail("has connect_timeout=\(timeout): give whole seconds, e.g. connect_timeout=5")
            }
            // libpq: 0 waits for ever, and 1 counts as 2.
            self.connectTimeout = seconds == 0 ? nil : max(seconds, 2)
        }
        for item in items
        where !["sslmode", "sslrootcert", "target_session_attrs", "connect_timeout"].contains(item.name)
            && !item.name.hasPrefix("ssl")
        {
            throw fail(
                "has \(item.name), which push-worker does not support: remove it (sslmode, sslrootcert, target_session_attrs and connect_timeout are honoured)"
            )
        }
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
        self.hosts = [Endpoint(host: host, port: port)]
        self.username = username
        self.password = password
        self.database = database
        self.sslMode = sslMode
    }

    /// `db1:5432`, `[::1]:5433`, `db2` (port 5432).
    static func endpoint(_ text: String) -> Endpoint? {
        guard !text.isEmpty else { return nil }
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            let host = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            if rest.isEmpty { return Endpoint(host: host, port: 5432) }
            guard rest.hasPrefix(":"), let port = Int(rest.dropFirst()), (1...65535).contains(port) else { return nil }
            return Endpoint(host: host, port: port)
        }
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count <= 2, !parts[0].isEmpty else { return nil }
        if parts.count == 1 { return Endpoint(host: String(parts[0]), port: 5432) }
        guard let port = Int(parts[1]), (1...65535).contains(port) else { return nil }
        return Endpoint(host: String(parts[0]), port: port)
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
        let hosts =
            self.hosts.count > 1 ? self.hosts.map(\.description).joined(separator: ",") : "\(self.host):\(self.port)"
        let target = self.targetSessionAttrs == "any" ? "" : "&target_session_attrs=\(self.targetSessionAttrs)"
        return "postgres://\(credentials)@\(hosts)/\(self.database)?sslmode=\(self.sslMode)\(target)"
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
            + (self.targetSessionAttrs == "any"
                ? [] : [URLQueryItem(name: "target_session_attrs", value: self.targetSessionAttrs)])
            + (self.connectTimeout.map { [URLQueryItem(name: "connect_timeout", value: String($0))] } ?? [])
        guard var text = components.string else { return self.description }
        if self.hosts.count > 1, let single = text.range(of: "@" + components.percentEncodedHost!) {
            // libpq's multi-host form: psql tries the hosts as the worker does.
            var hostPart = single.lowerBound..<single.upperBound
            if let portRange = text.range(of: ":\(self.port)", range: single.upperBound..<text.endIndex),
                portRange.lowerBound == single.upperBound
            {
                hostPart = single.lowerBound..<portRange.upperBound
            }
            text.replaceSubrange(hostPart, with: "@" + self.hosts.map(\.description).joined(separator: ","))
        }
        return text
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
        var configuration = PostgresClient.Configuration(
            host: self.host,
            port: self.port,
            username: self.username,
            password: self.password,
            database: self.database,
            tls: tls
        )
        if let timeout = self.connectTimeout { configuration.options.connectTimeout = .seconds(Int64(timeout)) }
        return configuration
    }

    /// Configuration for a single `PostgresConnection` (the LISTEN connection).
    public func connectionConfiguration() throws -> PostgresConnection.Configuration {
        let tls: PostgresConnection.Configuration.TLS
        switch self.sslMode {
        case "disable": tls = .disable
        case "allow", "prefer": tls = .prefer(try NIOSSLContext(configuration: self.tlsConfiguration))
        default: tls = .require(try NIOSSLContext(configuration: self.tlsConfiguration))
        }
        var configuration = PostgresConnection.Configuration(
            host: self.host,
            port: self.port,
            username: self.username,
            password: self.password,
            database: self.database,
            tls: tls
        )
        if let timeout = self.connectTimeout { configuration.options.connectTimeout = .seconds(Int64(timeout)) }
        return configuration
    }
}

import Foundation
import NIOCore
import NIOPosix
import PostgresNIO

/// An error from the queue: what went wrong, in a sentence that says what to do, and never a token,
/// payload or password.
public struct QueueError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is; compare with the static members.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: Sendable, Hashable {
            case migrationFailed, schemaMissing, invalidDatabaseURL, databaseUnreachable, postgresNotInstalled,
                embeddedPostgresFailed
            case invalidArgument
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A migration could not be applied; nothing of it was kept.
        public static let migrationFailed = Code(.migrationFailed)
        /// The `push` schema is missing or older than this build.
        public static let schemaMissing = Code(.schemaMissing)
        /// `DATABASE_URL` could not be parsed.
        public static let invalidDatabaseURL = Code(.invalidDatabaseURL)
        /// No connection to the server could be made (down, wrong host or port, refused credentials).
        public static let databaseUnreachable = Code(.databaseUnreachable)
        /// The Postgres server binaries needed for the embedded cluster are not on this machine.
        public static let postgresNotInstalled = Code(.postgresNotInstalled)
        /// The embedded cluster could not be created or started.
        public static let embeddedPostgresFailed = Code(.embeddedPostgresFailed)
        /// A caller passed a value the queue cannot use.
        public static let invalidArgument = Code(.invalidArgument)

        public var description: String { "\(self.base)" }
    }

    /// The kind of failure.
    public var code: Code
    /// A sentence saying what went wrong and what to do.
    public var message: String
    /// The error underneath, if any (a `PSQLError` prints no binds in its `description`).
    public var underlying: (any Error)?

    /// Creates an error with its sentence.
    public init(code: Code, message: String, underlying: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public var description: String {
        guard let underlying else { return self.message }
        return "\(self.message) (\(Self.summary(of: underlying)))"
    }

    /// A one-line summary of a database error: Postgres' own message and hint, no SQL, no binds.
    public static func summary(of error: any Error) -> String {
        if let psql = error as? PSQLError {
            if let server = psql.serverInfo {
                var text = server[.message] ?? "server error"
                if let constraint = server[.constraintName] { text += " [constraint \(constraint)]" }
                if let hint = server[.hint] { text += "; hint: \(hint)" }
                return text
            }
            if let underlying = psql.underlying { return summary(of: underlying) }
            return "\(psql.code)"
        }
        if let connection = error as? NIOConnectionError, let first = connection.connectionErrors.first {
            return summary(of: first.error)
        }
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)).lowercased() }
        if let transaction = error as? PostgresTransactionError {
            return summary(of: transaction.closureError ?? transaction.commitError ?? transaction.beginError ?? error)
        }
        return "\(error)"
    }

    /// Whether Postgres itself refused the statement (a constraint, a value out of range, a row too
    /// large): the same statement will fail again, so retrying it as it is would wedge. `false` for a
    /// lost connection or a timeout, which a retry can fix.
    /// Whether Postgres refused a write because the server is read-only (SQLSTATE 25006): a standby, or a
    /// primary demoted by a failover.
    public static func isReadOnlyServer(_ error: any Error) -> Bool {
        if let psql = error as? PSQLError { return psql.serverInfo?[.sqlState] == "25006" }
        if let transaction = error as? PostgresTransactionError, let inner = transaction.closureError {
            return isReadOnlyServer(inner)
        }
        return false
    }

    /// Whether Postgres refused the statement for what a row holds (``isRefusedByServer(_:)`` but for class
    /// 42, syntax or access rule: a missing grant or a broken statement refuses every row alike).
    public static func isRefusedForTheRows(_ error: any Error) -> Bool {
        guard self.isRefusedByServer(error) else { return false }
        if let psql = error as? PSQLError { return !(psql.serverInfo?[.sqlState] ?? "").hasPrefix("42") }
        if let transaction = error as? PostgresTransactionError, let inner = transaction.closureError {
            return isRefusedForTheRows(inner)
        }
        return true
    }

    public static func isRefusedByServer(_ error: any Error) -> Bool {
        if let psql = error as? PSQLError {
            if let server = psql.serverInfo {
                // Only the classes that fail the same way every time: 22 data exception (a value out of
                // range), 23 integrity constraint, 42 syntax or access rule, 54 program limit (a row too
                // large for an index), P0 a PL/pgSQL RAISE. Anything else (read-only during a switchover,
                // lock timeouts, deadlocks, shutdown) is retried as it is.
                let state = server[.sqlState] ?? ""
                // One 23 is not the row's fault: a delivery's hook removed (`webhooks remove`) between the
                // outcome statement's snapshot and its insert. Written again, the statement no longer sees it.
                if state == "23503", server[.constraintName] == "webhook_deliveries_webhook_id_fkey" {
                    return false
                }
                return ["22", "23", "42", "54", "P0"].contains(where: { state.hasPrefix($0) })
            }
            return false
        }
        if let transaction = error as? PostgresTransactionError, let inner = transaction.closureError {
            return isRefusedByServer(inner)
        }
        return false
    }

    static func migrationFailed(underlying: any Error) -> QueueError {
        QueueError(
            code: .migrationFailed,
            message:
                "could not apply the push schema migrations; nothing was changed. Check that the database user may create schemas, tables and functions",
            underlying: underlying
        )
    }
}

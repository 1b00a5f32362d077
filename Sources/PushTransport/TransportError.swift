public import PushCore

/// A request that got no APNs answer: what happened, as the job's `reason`, and whether APNs may have
/// processed it. The description never contains a token, JWT or key.
public struct TransportError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure; compare with the static members.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable, Hashable {
            case timeout = "Timeout"
            case connectionReset = "ConnectionReset"
            case goAway = "GoAway"
            case streamReset = "StreamReset"
            case connectFailed = "ConnectFailed"
            case protocolNotNegotiated = "ALPNNotH2"
            case credentialsMissing = "CredentialsMissing"
            case invalidKey = "InvalidKey"
            case shutdown = "Shutdown"
            case invalidProxy = "InvalidProxy"
            case credentialRefused = "CredentialRefused"
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The request's deadline passed.
        public static let timeout = Code(.timeout)
        /// The connection closed with the request in flight.
        public static let connectionReset = Code(.connectionReset)
        /// APNs sent GOAWAY.
        public static let goAway = Code(.goAway)
        /// The stream was reset (RST_STREAM) before a response.
        public static let streamReset = Code(.streamReset)
        /// No connection could be made (DNS, TCP, TLS).
        public static let connectFailed = Code(.connectFailed)
        /// TLS did not negotiate ALPN `h2`.
        public static let protocolNotNegotiated = Code(.protocolNotNegotiated)
        /// No signing key is configured for the job's credential (trap MS028).
        public static let credentialsMissing = Code(.credentialsMissing)
        /// The signing key file is missing, unreadable, world-readable or not a P-256 key.
        public static let invalidKey = Code(.invalidKey)
        /// The `--https-proxy` setting cannot be used (not an http:// URL with host and port, unreadable
        /// credentials file).
        public static let invalidProxy = Code(.invalidProxy)
        /// The provider's token endpoint refused the credential (FCM: the service account's key or grant).
        public static let credentialRefused = Code(.credentialRefused)
        /// The client is shutting down, or the caller withdrew the request before it was written (its
        /// lease lapsed, the worker is stopping): nothing was sent.
        public static let shutdown = Code(.shutdown)

        /// The word stored as the job's `reason`.
        public var description: String { self.base.rawValue }
    }

    /// The kind of failure.
    public var code: Code
    /// `false` when APNs certainly did not process the request (refused before it was sent, or above a
    /// GOAWAY's last stream id): it may be resent at once. `true` when the outcome is unknown.
    public var mayHaveBeenProcessed: Bool
    /// A sentence with context (host, file, what to do).
    public var message: String

    /// Creates an error.
    public init(code: Code, mayHaveBeenProcessed: Bool, message: String) {
        self.code = code
        self.mayHaveBeenProcessed = mayHaveBeenProcessed
        self.message = message
    }

    /// What the failure means for the job: not processed, unreachable, unknown outcome, …
    public var fault: TransportFault {
        switch self.code {
        case .connectFailed, .protocolNotNegotiated, .invalidProxy: return .unreachable
        case .credentialsMissing, .invalidKey: return .credentialMissing
        case .credentialRefused: return .credentialRefused
        case .shutdown: return .cancelled
        default: return self.mayHaveBeenProcessed ? .unknownOutcome : .notProcessed
        }
    }

    /// The job's `reason` column for this failure.
    public var reason: String { self.code.description }

    public var description: String { "\(self.code): \(self.message)" }
}

extension TransportError {
    /// The caller withdrew the request before it was written (its lease lapsed, its credential was paused,
    /// the worker is stopping): nothing was sent.
    static var withdrawn: TransportError {
        TransportError(code: .shutdown, mayHaveBeenProcessed: false, message: "withdrawn before it was sent")
    }

    /// The connection had been told to go away before the request was written: not sent on it.
    static var notSentGoingAway: TransportError {
        TransportError(
            code: .goAway,
            mayHaveBeenProcessed: false,
            message: "the connection is going away; not sent on it"
        )
    }
}

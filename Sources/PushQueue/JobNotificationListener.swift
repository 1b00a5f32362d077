public import Logging
public import PostgresNIO

/// Holds one connection that `LISTEN`s on `push_jobs` and turns each NOTIFY (one per INSERT statement
/// into `push.jobs`) into a ``WakeSignal`` signal. Reconnects with backoff when the connection drops,
/// and signals once after every (re)connect, because NOTIFYs sent while not listening are lost.
public struct JobNotificationListener: Sendable {
    /// The channel the schema's statement trigger notifies.
    public static let channel = "push_jobs"

    let configuration: PostgresConnection.Configuration
    let signal: WakeSignal
    let logger: Logger
    let onListening: @Sendable () -> Void

    /// - Parameters:
    ///   - configuration: how to open the dedicated connection (not a pooled one: LISTEN pins it).
    ///   - signal: what to wake.
    ///   - onListening: called each time LISTEN is registered (tests wait on it).
    public init(
        configuration: PostgresConnection.Configuration,
        signal: WakeSignal,
        logger: Logger,
        onListening: @escaping @Sendable () -> Void = {}
    ) {
        self.configuration = configuration
        self.signal = signal
        self.logger = logger
        self.onListening = onListening
    }

    /// Listens until the task is cancelled.
    public func run() async {
        var backoff = Duration.milliseconds(250)
        var connectionID = 0
        while !Task.isCancelled {
            connectionID += 1
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: self.configuration,
                    id: connectionID,
                    logger: self.logger
                )
                do {
                    try await connection.listen(on: Self.channel) { notifications in
                        // LISTEN is registered: catch up on anything inserted while we were not listening.
                        self.onListening()
                        self.signal.signal()
                        backoff = .milliseconds(250)
                        for try await _ in notifications {
                            self.signal.signal()
                        }
                    }
                } catch {
                    try? await connection.close()
                    throw error
                }
                try? await connection.close()
            } catch {
                if Task.isCancelled { return }
                self.logger.warning(
                    "LISTEN connection lost; polling until it is back",
                    metadata: ["push.error": "\(QueueError.summary(of: error))", "push.retry_in": "\(backoff)"]
                )
            }
            if Task.isCancelled { return }
            try? await Task.sleep(for: backoff)
            backoff = min(backoff * 2, .seconds(30))
        }
    }
}

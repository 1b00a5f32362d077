public import Logging
public import PostgresNIO

/// Holds one connection that `LISTEN`s on `push_jobs` and turns each NOTIFY (one per INSERT statement
/// into `push.jobs`) into a call of `onNotification`. Reconnects with backoff when the connection drops,
/// and calls it once after every (re)connect, because NOTIFYs sent while not listening are lost.
public struct JobNotificationListener: Sendable {
    /// The channel the schema's statement trigger notifies.
    public static let channel = "push_jobs"

    let configuration: PostgresConnection.Configuration
    let logger: Logger
    let onListening: @Sendable () -> Void

    /// - Parameters:
    ///   - configuration: how to open the dedicated connection (not a pooled one: LISTEN pins it).
    ///   - onListening: called each time LISTEN is registered (tests wait on it).
    public init(
        configuration: PostgresConnection.Configuration,
        logger: Logger,
        onListening: @escaping @Sendable () -> Void = {}
    ) {
        self.configuration = configuration
        self.logger = logger
        self.onListening = onListening
    }

    /// Listens until the task is cancelled, calling `onNotification` for each NOTIFY.
    public func run(onNotification: @escaping @Sendable () -> Void) async {
        await self.run(onPayload: { _ in onNotification() })
    }

    /// Listens until the task is cancelled, calling `onPayload` with each NOTIFY's payload (`""` for an
    /// INSERT's, and once after each (re)connect; `cancel:1,2,3` names jobs an operator cancelled).
    public func run(onPayload onNotification: @escaping @Sendable (String) -> Void) async {
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
                        onNotification("")
                        backoff = .milliseconds(250)
                        for try await notification in notifications {
                            onNotification(notification.payload)
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

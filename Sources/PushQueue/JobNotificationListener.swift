public import Logging
public import PostgresNIO
public import PushCore
import Synchronization

/// Holds one connection that `LISTEN`s on `push_jobs` and turns each NOTIFY (one per INSERT statement
/// into `push.jobs`) into a call of `onNotification`. Reconnects with backoff when the connection drops,
/// and calls it once after every (re)connect, because NOTIFYs sent while not listening are lost.
public struct JobNotificationListener: Sendable {
    /// The channel the schema's statement trigger notifies.
    public static let channel = "push_jobs"

    /// How to open the connection, asked at each (re)connect: a failover may have switched the host.
    let configuration: @Sendable () -> PostgresConnection.Configuration
    let logger: Logger
    /// The process's clock: the reconnect's backoff.
    let clock: any PushClock
    let onListening: @Sendable () -> Void
    /// The connection listening now, closed when ``PrimaryClient`` switches hosts (so it reconnects there).
    let current = ListeningConnection()
    /// How many times the host was switched: a switch ends the backoff at once.
    let switches: @Sendable () -> Int

    /// - Parameters:
    ///   - configuration: how to open the dedicated connection (not a pooled one: LISTEN pins it).
    ///   - onListening: called each time LISTEN is registered (tests wait on it).
    public init(
        configuration: PostgresConnection.Configuration,
        logger: Logger,
        clock: any PushClock,
        onListening: @escaping @Sendable () -> Void = {}
    ) {
        self.configuration = { configuration }
        self.switches = { 0 }
        self.logger = logger
        self.clock = clock
        self.onListening = onListening
    }

    /// Listens to the host `primary` is on, and moves with it when it switches.
    public init(
        primary: PrimaryClient,
        logger: Logger,
        clock: any PushClock,
        onListening: @escaping @Sendable () -> Void = {}
    ) {
        self.configuration = { primary.listenerConfiguration! }
        self.switches = { primary.switches }
        self.logger = logger
        self.clock = clock
        self.onListening = onListening
        primary.onSwitch { [current] in
            if let connection = current.value.withLock({ $0 }) { Task { try? await connection.close() } }
        }
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
            // Read before connecting: a switch during the connect to the old host ends the backoff after it.
            let switches = self.switches()
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: self.configuration(),
                    id: connectionID,
                    logger: self.logger
                )
                self.current.value.withLock { $0 = connection }
                defer { self.current.value.withLock { $0 = nil } }
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
            // The backoff, cut short by a switch to another host (which is up: it was just chosen).
            let until = self.clock.now + backoff
            while self.clock.now < until && self.switches() == switches && !Task.isCancelled {
                try? await Task.sleep(for: min(.milliseconds(250), until - self.clock.now))
            }
            backoff = self.switches() == switches ? min(backoff * 2, .seconds(30)) : .milliseconds(250)
        }
    }
}

/// The LISTEN connection open now, shared by the copies of a listener.
final class ListeningConnection: Sendable {
    let value = Mutex<PostgresConnection?>(nil)
}

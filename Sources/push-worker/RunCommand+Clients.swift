import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import Metrics
import PostgresNIO
import Prometheus
import PushCore
import PushQueue
import PushTransport
import PushWorker
import ServiceLifecycle
import Synchronization
import UnixSignals

/// The provider clients `run` makes from its options: APNs' (or the built-in simulator's) and FCM's pool
/// sizes and deadlines.
extension RunCommand {
    /// FCM's pool size and request deadline, as APNs'.
    var fcmConfiguration: FCMClient.Configuration {
        var configuration = FCMClient.Configuration()
        configuration.clock = processClock
        configuration.connectionsPerPool = self.connections
        configuration.requestTimeout = .milliseconds(self.requestTimeoutMs)
        return configuration
    }

    func makeClient(
        logger: Logger,
        simulator: (APNsEndpoint, String, SigningKey)?,
        tokenStore: (any ProviderTokenStore)?
    ) throws -> APNsClient {
        var configuration = APNsClient.Configuration(
            connectionsPerPool: self.connections,
            requestTimeout: .milliseconds(self.requestTimeoutMs)
        )
        configuration.clock = processClock
        if let (endpoint, caFile, key) = simulator {
            configuration.endpointOverride = endpoint
            configuration.caFile = caFile
            return try APNsClient(
                configuration: configuration,
                credentials: ["default": key],
                tokenStore: tokenStore,
                logger: logger
            )
        }
        return try self.apns.makeClient(logger: logger, base: configuration, tokenStore: tokenStore)
    }
}

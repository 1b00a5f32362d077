import ArgumentParser
import Foundation
import Logging
import PushCore
import PushQueue
import PushTransport

struct ChannelsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channels",
        abstract: "iOS 18 broadcast channel management (create, list, delete).",
        subcommands: [Create.self, List.self, Show.self, Delete.self]
    )

    enum Storage: String, ExpressibleByArgument, CaseIterable {
        case none
        case mostRecent = "most-recent"
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a channel and print its id.")
        @OptionGroup var target: ChannelTarget
        @Option(
            help: "Message storage: none (only connected devices get updates; send with expiration 0) or most-recent."
        ) var storage: Storage = .none
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let storage: APNsClient.MessageStoragePolicy = self.storage == .none ? .noStorage : .mostRecentMessageStored
            let id = try await self.target.run { client, scope in
                try await client.createChannel(
                    bundleID: scope.bundleID,
                    environment: scope.environment,
                    credential: scope.credential,
                    storage: storage
                )
            }
            if self.json { printJSON(["channel_id": id]) } else { print(id) }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the channel ids of a bundle.")
        @OptionGroup var target: ChannelTarget
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let ids = try await self.target.run { client, scope in
                try await client.listChannels(
                    bundleID: scope.bundleID,
                    environment: scope.environment,
                    credential: scope.credential
                )
            }
            if self.json {
                printJSON(ids)
            } else if ids.isEmpty {
                print("no channels")
            } else {
                for id in ids { print(id) }
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show one channel: its message-storage policy.")
        @OptionGroup var target: ChannelTarget
        @Argument(help: "The channel id (base64).") var channelID: String
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let channelID = self.channelID
            let storage = try await self.target.run { client, scope in
                try await client.channelStorage(
                    channelID,
                    bundleID: scope.bundleID,
                    environment: scope.environment,
                    credential: scope.credential
                )
            }
            let name = storage == .noStorage ? "none" : "most-recent"
            if self.json {
                printJSON(["channel_id": channelID, "storage": name])
            } else {
                print(
                    "channel \(channelID)  storage \(name)\(storage == .noStorage ? " (broadcasts must carry apns-expiration 0)" : "")"
                )
            }
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a channel.")
        @OptionGroup var target: ChannelTarget
        @Argument(help: "The channel id (base64).") var channelID: String

        func run() async throws {
            let channelID = self.channelID
            try await self.target.run { client, scope in
                try await client.deleteChannel(
                    channelID,
                    bundleID: scope.bundleID,
                    environment: scope.environment,
                    credential: scope.credential
                )
            }
            print("deleted \(channelID)")
        }
    }
}

/// What every `channels` verb names: the bundle, the credential that owns its channels, and where APNs
/// and the database are.
struct ChannelTarget: ParsableArguments {
    @OptionGroup var apns: APNsOptions
    @OptionGroup var database: DatabaseOptions
    @Option(help: "The credential (signing key) whose team owns the channels: a name from --config, or default.")
    var credential: String = "default"
    @Option(name: .customLong("bundle-id"), help: "The app's bundle id.") var bundleID: String

    /// The request's bundle, environment and credential.
    struct Scope: Sendable {
        var bundleID: String
        var environment: APNsEnvironment
        var credential: String
    }

    /// Runs `body` with a client for this target (see ``ChannelsCommand/withAPNsClient(_:_:_:)``).
    func run<T: Sendable>(_ body: @escaping @Sendable (APNsClient, Scope) async throws -> T) async throws -> T {
        let scope = Scope(bundleID: self.bundleID, environment: try self.apns.environment, credential: self.credential)
        return try await ChannelsCommand.withAPNsClient(self.apns, self.database) { client in
            try await body(client, scope)
        }
    }
}

extension ChannelsCommand {
    /// Runs `body` with an APNs client that signs with the fleet's shared provider token (Postgres'
    /// `push.provider_tokens`) when a database is configured: a verb that minted a token of its own would
    /// make APNs refuse the workers' token (TooManyProviderTokenUpdates, then up to 20 minutes of
    /// ExpiredProviderToken churn). Without DATABASE_URL it mints its own, as a one-off tool may.
    static func withAPNsClient<T: Sendable>(
        _ apns: APNsOptions,
        _ database: DatabaseOptions,
        _ body: @escaping @Sendable (APNsClient) async throws -> T
    ) async throws -> T {
        let logger = Logger(label: "push-worker")
        guard try database.configuredURL != nil else {
            return try await Self.using(try apns.makeClient(logger: logger), body)
        }
        return try await database.withQueue { _, postgres, queueLogger in
            let store = ProviderTokenTable(client: postgres, logger: queueLogger)
            return try await Self.using(try apns.makeClient(logger: logger, tokenStore: store), body)
        }
    }

    private static func using<T: Sendable>(
        _ client: APNsClient,
        _ body: @Sendable (APNsClient) async throws -> T
    ) async throws -> T {
        do {
            let result = try await body(client)
            await client.shutdown()
            return result
        } catch {
            await client.shutdown()
            throw error
        }
    }
}

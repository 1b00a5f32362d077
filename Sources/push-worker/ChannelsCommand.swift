import APNsTransport
import ArgumentParser
import Foundation
import Logging

struct ChannelsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channels",
        abstract: "iOS 18 broadcast channel management (create, list, delete).",
        subcommands: [Create.self, List.self, Delete.self]
    )

    enum Storage: String, ExpressibleByArgument, CaseIterable {
        case none
        case mostRecent = "most-recent"
    }

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a channel and print its id.")
        @OptionGroup var apns: APNsOptions
        @Option(name: .customLong("bundle-id"), help: "The app's bundle id.") var bundleID: String
        @Option(
            help: "Message storage: none (only connected devices get updates; send with expiration 0) or most-recent."
        ) var storage: Storage = .none
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let client = try self.apns.makeClient(logger: Logger(label: "push-worker"))
            let environment = try self.apns.environment
            let result: Result<String, any Error>
            do {
                result = .success(
                    try await client.createChannel(
                        bundleID: self.bundleID,
                        environment: environment,
                        credential: "default",
                        storage: self.storage == .none ? .noStorage : .mostRecentMessageStored
                    )
                )
            } catch { result = .failure(error) }
            await client.shutdown()
            let id = try result.get()
            if self.json { printJSON(["channel_id": id]) } else { print(id) }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the channel ids of a bundle.")
        @OptionGroup var apns: APNsOptions
        @Option(name: .customLong("bundle-id"), help: "The app's bundle id.") var bundleID: String
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let client = try self.apns.makeClient(logger: Logger(label: "push-worker"))
            let environment = try self.apns.environment
            let result: Result<[String], any Error>
            do {
                result = .success(
                    try await client.listChannels(
                        bundleID: self.bundleID,
                        environment: environment,
                        credential: "default"
                    )
                )
            } catch { result = .failure(error) }
            await client.shutdown()
            let ids = try result.get()
            if self.json {
                printJSON(ids)
            } else if ids.isEmpty {
                print("no channels")
            } else {
                for id in ids { print(id) }
            }
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a channel.")
        @OptionGroup var apns: APNsOptions
        @Option(name: .customLong("bundle-id"), help: "The app's bundle id.") var bundleID: String
        @Argument(help: "The channel id (base64).") var channelID: String

        func run() async throws {
            let client = try self.apns.makeClient(logger: Logger(label: "push-worker"))
            let environment = try self.apns.environment
            let result: Result<Void, any Error>
            do {
                result = .success(
                    try await client.deleteChannel(
                        self.channelID,
                        bundleID: self.bundleID,
                        environment: environment,
                        credential: "default"
                    )
                )
            } catch { result = .failure(error) }
            await client.shutdown()
            try result.get()
            print("deleted \(self.channelID)")
        }
    }
}

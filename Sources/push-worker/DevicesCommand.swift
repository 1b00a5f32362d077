import ArgumentParser
import Foundation
import PushQueue

struct DevicesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "devices",
        abstract: "The device registry (push.devices): your users' tokens, which are live, which a provider refused.",
        discussion: """
            Producers keep push.devices with a plain upsert, one row per token (docs/operations.md, "The device \
            registry"); the worker marks a token invalid when its provider says so (APNs 410, BadDeviceToken, \
            DeviceTokenNotForTopic; FCM UNREGISTERED, a token-invalid INVALID_ARGUMENT), and the next upsert of \
            the token (the app registered again) clears the mark. Tokens are shown as fingerprints, never whole.
              push-worker devices                                  # the newest registrations, with counts
              push-worker devices --recipient user:42 --topic com.example.app
              push-worker devices show user:42                     # every device of one recipient
            """,
        subcommands: [ListDevices.self, ShowRecipient.self],
        defaultSubcommand: ListDevices.self
    )

    struct ListDevices: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "List devices, the newest registration first, with the registry's counts."
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this recipient's devices (the producer's key, e.g. user:42).") var recipient: String?
        @Option(help: "Only this topic's (bundle id or package name).") var topic: String?
        @Option(help: "At most this many rows.") var limit = 50
        @Flag(help: "Print the result as JSON.") var json = false

        func validate() throws {
            guard (1...10_000).contains(self.limit) else {
                throw ValidationError("--limit must be 1 to 10000, not \(self.limit)")
            }
        }

        func run() async throws {
            let (devices, counts) = try await self.database.withQueue { queue, _, _ in
                (
                    try await queue.operations.devices(recipient: self.recipient, topic: self.topic, limit: self.limit),
                    try await queue.operations.deviceCounts(topic: self.topic)
                )
            }
            if self.json {
                printJSON(devices)
                return
            }
            print(
                "devices \(counts.devices) (\(counts.live) live, \(counts.devices - counts.live) invalidated); recipients reachable \(counts.recipientsReachable)\(self.topic.map { " for topic \($0)" } ?? "")"
            )
            DevicesCommand.printDevices(devices)
        }
    }

    struct ShowRecipient: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "show",
            abstract: "Every device of one recipient, live or not, and why a dead one is."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The recipient (the producer's key, e.g. user:42).") var recipient: String
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let devices = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.devices(recipient: self.recipient, limit: 10_000)
            }
            if self.json {
                printJSON(devices)
                return
            }
            guard !devices.isEmpty else {
                throw CLIError(
                    "no device is registered for recipient \(self.recipient): register the app's token with the upsert in docs/operations.md (\"The device registry\"), or check the recipient's spelling"
                )
            }
            let live = devices.filter(\.isLive).count
            print(
                "recipient \(self.recipient): \(devices.count) devices, \(live) live\(live == 0 ? " (no token of it can be reached until the app registers again)" : "")"
            )
            DevicesCommand.printDevices(devices)
        }
    }

    /// The devices as a table: token fingerprints, never tokens.
    static func printDevices(_ devices: [Device]) {
        guard !devices.isEmpty else { return }
        printTable(
            ["ID", "RECIPIENT", "PLATFORM", "TOPIC", "TOKEN", "KIND", "ENVIRONMENT", "REGISTERED", "STATE"],
            devices.map { device in
                [
                    String(device.id), truncate(device.recipient, 32), device.platform, truncate(device.topic, 40),
                    "fp " + device.tokenFingerprint,
                    device.kind + (device.activityID.map { " (\(truncate($0, 24)))" } ?? ""), device.environment,
                    formatDate(device.registeredAt),
                    device.invalidatedAt.map {
                        "invalidated \(formatDate($0)) (\(device.invalidatedReason ?? "-"))"
                    } ?? "live",
                ]
            }
        )
    }
}

import APNsTransport
import ArgumentParser
import Foundation
import PushQueue

struct WebhooksCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "webhooks",
        abstract:
            "Outcomes pushed to your services (push.webhooks): list the hooks with their outbox, add or remove one.",
        discussion: """
            Every outcome a hook takes (delivered, dead, superseded, token_invalid; optionally one topic) becomes a \
            row of push.webhook_deliveries in the same statement that writes the outcome, so a crash loses \
            neither. Each is POSTed as JSON signed in Push-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of \
            "<t>.<body>"> keyed with the secret file's content (surrounding whitespace removed).
              push-worker webhooks add https://hooks.example.com/push --events delivered,dead --secret-file /etc/push-worker/hook.secret
              push-worker webhooks
              push-worker webhooks remove 3
            """,
        subcommands: [ListHooks.self, AddHook.self, RemoveHook.self],
        defaultSubcommand: ListHooks.self
    )

    struct ListHooks: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "List the hooks, with their deliveries waiting, failing and dead."
        )
        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let hooks = try await self.database.withQueue { queue, _, _ in try await queue.operations.webhooks() }
            if self.json {
                printJSON(hooks)
                return
            }
            if hooks.isEmpty { print("no webhooks") }
            for hook in hooks {
                print(
                    "\(hook.id)  \(hook.url)  events \(hook.events.joined(separator: ","))  topic \(hook.topic ?? "*")  waiting \(hook.waiting) (failing \(hook.failing))  dead \(hook.dead)\(hook.disabledReason.map { "  DISABLED: \($0)" } ?? "")"
                )
            }
        }
    }

    struct AddHook: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "add", abstract: "Add a hook.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Where outcomes are POSTed: an http:// or https:// URL.") var url: String
        @Option(
            help: ArgumentHelp(
                "Which outcomes, comma-separated: delivered, dead, superseded, token_invalid.",
                valueName: "events"
            )
        )
        var events: String
        @Option(help: ArgumentHelp("Only the outcomes of this topic (default: any).", valueName: "topic"))
        var topic: String?
        @Option(
            name: .customLong("secret-file"),
            help: ArgumentHelp(
                "An absolute path to the file holding the HMAC secret, readable by the workers' user only (mode 600); the secret never enters the database.",
                valueName: "path"
            )
        )
        var secretFile: String

        var eventList: [String] {
            self.events.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }

        func validate() throws {
            let unknown = Set(self.eventList).subtracting(QueueOperations.webhookEvents).sorted()
            guard unknown.isEmpty, !self.eventList.isEmpty else {
                throw ValidationError(
                    "--events \(self.events): use one or more of delivered, dead, superseded, token_invalid\(unknown.isEmpty ? "" : " (not \(unknown.joined(separator: ", ")))")"
                )
            }
            guard self.url.hasPrefix("https://") || self.url.hasPrefix("http://"), URL(string: self.url)?.host != nil
            else {
                throw ValidationError("\(self.url) is not an http:// or https:// URL with a host")
            }
            guard self.secretFile.hasPrefix("/") else {
                throw ValidationError(
                    "--secret-file \(self.secretFile): give an absolute path (the workers read it, from their own directory)"
                )
            }
        }

        func run() async throws {
            // Checked here when this host can read it (the workers read it when they sign).
            switch SecretFile.read(self.secretFile, policy: .privateKey, maxBytes: 64 * 1024) {
            case .success(let bytes)
            where String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).isEmpty:
                throw CLIError("--secret-file \(self.secretFile) is empty: write the shared secret into it")
            case .success, .failure(.missing):
                break
            case .failure(let failure):
                throw CLIError("--secret-file \(self.secretFile) \(failure.sentence)")
            }
            let (url, events, topic, secretFile) = (self.url, self.eventList, self.topic, self.secretFile)
            let hook = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.addWebhook(url: url, events: events, topic: topic, secretFile: secretFile)
            }
            print(
                "added webhook \(hook.id): \(hook.url) for \(hook.events.joined(separator: ",")), topic \(hook.topic ?? "*")"
            )
            print(
                "note: this version records each matching outcome in push.webhook_deliveries (push-worker webhooks counts them); the workers' sender that POSTs them is not built yet"
            )
        }
    }

    struct RemoveHook: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "remove",
            abstract: "Remove a hook and its outbox (deliveries not yet sent are dropped with it).",
            discussion: "Exits 1 when there is no hook with this id."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The hook's id (see `push-worker webhooks`).") var id: Int64

        func run() async throws {
            let id = self.id
            let removed = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.removeWebhook(id: id)
            }
            guard removed else {
                print("no webhook \(id) (push-worker webhooks lists them)")
                throw ExitCode(1)
            }
            print("removed webhook \(id)")
        }
    }
}

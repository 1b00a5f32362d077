import ArgumentParser
import Foundation
import PushCore
import PushQueue
import PushTransport

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
              push-worker webhooks add https://hooks.example.com/push --events delivered,dead --secret-file /etc/push-worker/webhooks/hook.secret
              push-worker webhooks
              push-worker webhooks remove 3
              push-worker webhooks show 3                  # its failing and dead deliveries, with the receiver's answers
              push-worker webhooks replay 812 813          # dead deliveries again (same Push-Delivery-Id)
              push-worker webhooks replay --hook 3         # every dead delivery of hook 3; enables it again after a 410
            Each POST carries Push-Delivery-Id (the same on every retry, after a crash and on replay: receivers \
            drop duplicates by it), Push-Event and Push-Attempt. A delivery is retried with backoff (5 s doubling \
            to an hour, Retry-After honoured) for 24 hours, then it is dead. A 410 Gone disables the hook.
            """,
        subcommands: [ListHooks.self, AddHook.self, RemoveHook.self, ShowHook.self, ReplayDeliveries.self],
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
                printJSON(
                    hooks.map { hook in
                        var shown = hook
                        shown.url = WebhookPolicy.displayURL(hook.url)
                        return shown
                    }
                )
                return
            }
            if hooks.isEmpty { print("no webhooks") }
            for hook in hooks {
                print(
                    "\(hook.id)  \(WebhookPolicy.displayURL(hook.url))  events \(hook.events.joined(separator: ","))  topic \(hook.topic ?? "*")  waiting \(hook.waiting) (failing \(hook.failing))  dead \(hook.dead)\(hook.disabledReason.map { "  DISABLED: \($0)" } ?? "")"
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
        @OptionGroup var secrets: WebhookSecretsOption

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
            // What the workers will POST to: refused here when they would refuse it at every delivery.
            do {
                _ = try WebhookHTTPClient.Target(url: self.url)
            } catch {
                throw ValidationError("\(self.url): \(error.description)")
            }
            guard self.secretFile.hasPrefix("/") else {
                throw ValidationError(
                    "--secret-file \(self.secretFile): give an absolute path (the workers read it, from their own directory)"
                )
            }
            let directory = self.secrets.directory
            guard WebhookPolicy.secretFileIsInside(self.secretFile, directory: directory) else {
                throw ValidationError(
                    "--secret-file \(self.secretFile) is not inside the workers' secrets directory \(directory): put it there (install -m 600 -o WORKER_USER /dev/stdin \(directory)/NAME.secret), or name the directory the workers use with --webhooks-secrets-dir (and start them with the same)"
                )
            }
        }

        func run() async throws {
            // Checked here when this host can read it (the workers read it when they sign).
            // The workers read at most 4 KiB of it.
            let directory = self.secrets.directory
            switch SecretFile.read(self.secretFile, policy: .privateKey, maxBytes: 4_096, inside: directory) {
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
                "added webhook \(hook.id): \(WebhookPolicy.displayURL(hook.url)) for \(hook.events.joined(separator: ",")), topic \(hook.topic ?? "*")"
            )
            if let host = URL(string: hook.url)?.host, ["localhost", "127.0.0.1", "::1", "[::1]"].contains(host) {
                print(
                    "note: \(host) is a loopback address; the workers refuse to POST to loopback and private addresses unless they run with --webhooks-allow-private"
                )
            }
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

    struct ShowHook: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "show",
            abstract: "One hook's deliveries that failed at least once (still retrying, or dead), newest first."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The hook's id (see `push-worker webhooks`).") var id: Int64
        @Option(help: "At most this many deliveries.") var limit: Int = 20
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let (id, limit) = (self.id, self.limit)
            let (hooks, failing) = try await self.database.withQueue { queue, _, _ in
                (
                    try await queue.operations.webhooks(),
                    try await queue.operations.failingWebhookDeliveries(hook: id, limit: limit)
                )
            }
            guard let hook = hooks.first(where: { $0.id == id }) else {
                print("no webhook \(id) (push-worker webhooks lists them)")
                throw ExitCode(1)
            }
            if self.json {
                printJSON(failing)
                return
            }
            print(
                "\(hook.id)  \(WebhookPolicy.displayURL(hook.url))  waiting \(hook.waiting) (failing \(hook.failing))  dead \(hook.dead)\(hook.disabledReason.map { "  DISABLED: \($0)" } ?? "")"
            )
            if failing.isEmpty { print("no failing deliveries") }
            for delivery in failing {
                let next = delivery.nextTry.map { "next try \(ISO8601DateFormatter().string(from: $0))" } ?? "dead"
                print(
                    "  delivery \(delivery.id)  \(delivery.event) of job \(delivery.jobID)  \(delivery.state)  tries \(delivery.attempts)  \(next)"
                )
                print("    last answer: \(delivery.lastStatus.map(String.init) ?? "none")  \(delivery.lastError ?? "")")
            }
        }
    }

    struct ReplayDeliveries: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "replay",
            abstract: "Send dead deliveries again: pending now, with a fresh 24 hours, the same delivery id and body.",
            discussion: """
                By id (`push-worker webhooks show HOOK` lists them), or every dead delivery of one hook with \
                --hook; --hook also enables a hook that a 410 Gone disabled. Exits 1 when an id named is not a \
                dead delivery.
                """
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Dead deliveries' ids.") var ids: [Int64] = []
        @Option(help: ArgumentHelp("Every dead delivery of this hook (and enable it).", valueName: "id")) var hook:
            Int64?
        @Flag(help: "Print the result as JSON.") var json = false

        func validate() throws {
            guard !self.ids.isEmpty || self.hook != nil else {
                throw ValidationError("name dead deliveries' ids, or --hook ID for every dead delivery of a hook")
            }
        }

        func run() async throws {
            let (ids, hook) = (self.ids, self.hook)
            let result = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.replayWebhookDeliveries(ids: ids, hook: hook)
            }
            if self.json {
                printJSON(result)
            } else {
                if let enabled = result.enabledHook { print("enabled webhook \(enabled) again") }
                for hook in result.disabledHooks {
                    print(
                        "webhook \(hook) is disabled: its replayed deliveries wait until `push-worker webhooks replay --hook \(hook)` enables it"
                    )
                }
                print(
                    "replayed \(result.replayed.count) deliveries\(result.replayed.isEmpty ? "" : ": \(result.replayed.map(String.init).joined(separator: " "))")"
                )
                if !result.notDead.isEmpty {
                    print("not dead, left alone: \(result.notDead.map(String.init).joined(separator: " "))")
                }
            }
            if !result.notDead.isEmpty { throw ExitCode(1) }
        }
    }
}

import ArgumentParser
import Foundation
import PushCore
import PushQueue

/// `--credential` and `--topic` naming the scope of a pause or a rate limit; either may be left out (any).
struct ScopeOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Only jobs of this credential (default: every credential).", valueName: "name"))
    var credential: String?
    @Option(help: ArgumentHelp("Only jobs of this topic, the bare bundle id (default: every topic).", valueName: "id"))
    var topic: String?

    func validate() throws {
        for (flag, value) in [("--credential", self.credential), ("--topic", self.topic)] {
            if let value, value.trimmingCharacters(in: .whitespaces).isEmpty {
                throw ValidationError("\(flag) is empty: name one, or leave the flag out to mean any")
            }
        }
    }

    var description: String { "credential=\(self.credential ?? "*") topic=\(self.topic ?? "*")" }
}

struct PauseCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pause",
        abstract: "Stop every worker claiming the jobs of a credential and/or topic (fleet-wide, in push.pauses).",
        discussion: """
            Matching jobs stay pending with no attempt counted; sends already in flight finish. Every worker \
            stops claiming them at its next claim, without a restart. Pausing the same scope again replaces \
            the reason. Lift it with `push-worker resume` with the same flags; `push-worker pauses` lists them.
              push-worker pause --topic com.example.app --reason "wrong campaign text, fixing"
              push-worker pause --credential brand-b --reason "key rotation"
            """
    )

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var scope: ScopeOptions
    @Option(help: ArgumentHelp("Why: shown by `pauses`, `stats` and /metrics.", valueName: "text")) var reason: String

    func validate() throws {
        guard !self.reason.trimmingCharacters(in: .whitespaces).isEmpty else {
            throw ValidationError("--reason is empty: say why, so whoever is on call knows when to resume")
        }
        if self.scope.credential == nil && self.scope.topic == nil {
            print("note: no --credential or --topic: this pauses every job")
        }
    }

    func run() async throws {
        let (scope, reason) = (self.scope, self.reason)
        let pause = try await self.database.withQueue { queue, _, _ in
            try await queue.operations.pause(credential: scope.credential, topic: scope.topic, reason: reason)
        }
        print("paused \(pause.scope): \(pause.reason)")
    }
}

struct ResumeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resume",
        abstract: "Lift a pause made with the same --credential and --topic; workers claim its jobs at once.",
        discussion: "Exits 1 when no pause has exactly that scope (see `push-worker pauses`)."
    )

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var scope: ScopeOptions

    func run() async throws {
        let scope = self.scope
        let found = try await self.database.withQueue { queue, _, _ in
            try await queue.operations.resume(credential: scope.credential, topic: scope.topic)
        }
        guard found else {
            printError("no pause with \(scope.description): `push-worker pauses` lists them with their scopes")
            throw ExitCode(1)
        }
        print("resumed \(scope.description)")
    }
}

struct PausesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pauses",
        abstract: "List the fleet-wide pauses: scope, reason, who and since when, and the pending jobs each holds."
    )

    @OptionGroup var database: DatabaseOptions
    @Flag(help: "Print the result as JSON.") var json = false

    func run() async throws {
        let pauses = try await self.database.withQueue { queue, _, _ in try await queue.pauses(countingJobs: true) }
        if self.json {
            printJSON(pauses)
            return
        }
        if pauses.isEmpty { print("no pauses") }
        for pause in pauses {
            let age = HumanText.duration(processClock.wallNow.timeIntervalSince(pause.createdAt))
            print(
                "\(pause.scope)   \(pause.pendingJobs ?? 0) pending   for \(age) by \(pause.createdBy): \(pause.reason)"
            )
        }
    }
}

struct LimitsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "limits",
        abstract: "Fleet-wide rate limits (push.rate_limits): list them, or set and clear one.",
        discussion: """
            A limit is a send schedule shared by every worker: each matching job gets a send time one \
            interval (1 / --per-second) after the previous one, so the requests APNs sees are spaced evenly; \
            a claim takes at most --burst jobs ahead of their send times. The most specific limit that \
            matches a job (credential and topic, then credential, then topic, then any) applies to it.
              push-worker limits set --topic com.example.app --per-second 50 --burst 10
              push-worker limits clear --topic com.example.app
              push-worker limits
            """,
        subcommands: [ListLimits.self, SetLimit.self, ClearLimit.self],
        defaultSubcommand: ListLimits.self
    )

    struct ListLimits: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "list", abstract: "List the rate limits.")
        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print the result as JSON.") var json = false

        func run() async throws {
            let limits = try await self.database.withQueue { queue, _, _ in try await queue.operations.rateLimits() }
            if self.json {
                printJSON(limits)
                return
            }
            if limits.isEmpty { print("no rate limits") }
            for limit in limits {
                print(
                    "\(limit.scope)   \(formatRate(limit.perSecond))/s, burst \(limit.burst)   \(limit.available) claimable now"
                )
            }
        }
    }

    struct SetLimit: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "set",
            abstract: "Set (or replace) the rate limit of a credential and/or topic."
        )
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var scope: ScopeOptions
        @Option(name: .customLong("per-second"), help: "The average rate, jobs per second (> 0, e.g. 50 or 0.5).")
        var perSecond: Double
        @Option(help: "The most claimed at once (≥ 1; default: one second's worth, at least 1).") var burst: Int?

        func validate() throws {
            guard self.perSecond >= 0.000001, self.perSecond.isFinite else {
                throw ValidationError(
                    "--per-second must be a number of at least 0.000001 (one job every 11.6 days); 0.5 is one job every 2 s, 0.0000116 one a day"
                )
            }
            if let burst = self.burst, burst < 1 {
                throw ValidationError("--burst must be at least 1")
            }
        }

        func run() async throws {
            let (scope, rate) = (self.scope, self.perSecond)
            let burst = self.burst ?? max(1, Int(rate.rounded(.up)))
            let limit = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.setRateLimit(
                    credential: scope.credential,
                    topic: scope.topic,
                    perSecond: rate,
                    burst: burst
                )
            }
            print("limited \(limit.scope) to \(formatRate(limit.perSecond))/s, burst \(limit.burst)")
        }
    }

    struct ClearLimit: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "clear",
            abstract: "Remove the rate limit with exactly this --credential and --topic.",
            discussion: "Exits 1 when no limit has exactly that scope (see `push-worker limits`)."
        )
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var scope: ScopeOptions

        func run() async throws {
            let scope = self.scope
            let found = try await self.database.withQueue { queue, _, _ in
                try await queue.operations.clearRateLimit(credential: scope.credential, topic: scope.topic)
            }
            guard found else {
                printError("no rate limit with \(scope.description): `push-worker limits` lists them")
                throw ExitCode(1)
            }
            print("cleared the rate limit of \(scope.description)")
        }
    }
}

/// 50, 0.5, 12.25: a rate without trailing zeros.
func formatRate(_ value: Double) -> String {
    value == value.rounded() ? String(Int(value)) : String(format: "%g", value)
}

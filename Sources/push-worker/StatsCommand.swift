import ArgumentParser
import Foundation
import PushCore
import PushQueue

struct StatsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "Counts by state, oldest pending age, dead letters by trap, and the last minute's throughput."
    )

    @OptionGroup var database: DatabaseOptions
    @Flag(help: "Print the result as JSON.") var json = false

    func run() async throws {
        let json = self.json
        try await self.database.withQueue { queue, _, _ in
            let stats = try await queue.operations.stats()
            let pauses = try await queue.pauses(countingJobs: true)
            let limits = try await queue.operations.rateLimits()
            let channels = try await queue.operations.activityChannelCounts()
            if json {
                printJSON(StatsJSON(stats: stats, pauses: pauses, rateLimits: limits))
                return
            }
            let states = stats.byState
            print(
                "jobs          pending \(states["pending"] ?? 0) (due now \(stats.pendingDue))   running \(states["running"] ?? 0)   delivered \(states["delivered"] ?? 0)   superseded \(states["superseded"] ?? 0)   cancelled \(states["cancelled"] ?? 0)"
            )
            // Both platforms in use: each one's share.
            if stats.byPlatform.count > 1 {
                for (platform, counts) in stats.byPlatform.sorted(by: { $0.key < $1.key }) {
                    print(
                        "  \(platform.padding(toLength: 11, withPad: " ", startingAt: 0)) pending \(counts["pending"] ?? 0)   running \(counts["running"] ?? 0)   delivered \(counts["delivered"] ?? 0)"
                    )
                }
            }
            print("oldest due    \(stats.pendingDue == 0 ? "-" : HumanText.duration(stats.oldestPendingAgeSeconds))")
            print("last minute   delivered \(stats.deliveredLastMinute)   dead-lettered \(stats.deadLastMinute)")
            print("dead letters  \(stats.deadLetters)")
            for (trap, count) in stats.deadByTrap.sorted(by: { ($0.value, $1.key) > ($1.value, $0.key) }) {
                print("  \(trap.padding(toLength: 6, withPad: " ", startingAt: 0)) \(count)")
            }
            print("invalid tokens \(stats.invalidTokens)")
            print("paused        \(pauses.isEmpty ? "nothing" : "")")
            for pause in pauses {
                print(
                    "  \(pause.scope)   \(pause.pendingJobs ?? 0) pending   since \(pause.createdAt.formatted(.iso8601)): \(pause.reason)"
                )
            }
            print("rate limits   \(limits.isEmpty ? "none" : "")")
            for limit in limits {
                print(
                    "  \(limit.scope)   \(formatRate(limit.perSecond))/s, burst \(limit.burst), \(limit.available) claimable now"
                )
            }
            // Apple allows an app 10,000 broadcast channels per environment; ended activities' are deleted after
            // their dismissal.
            if !channels.isEmpty {
                let counts = channels.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value) of 10,000" }
                print("activity channels  \(counts.joined(separator: "   "))")
            }
        }
    }
}

/// `stats --json`: the queue's counts with the fleet's pauses and rate limits.
struct StatsJSON: Encodable {
    var stats: QueueStats
    var pauses: [Pause]
    var rateLimits: [RateLimit]

    func encode(to encoder: any Encoder) throws {
        try self.stats.encode(to: encoder)
        var container = encoder.container(keyedBy: Keys.self)
        try container.encode(self.pauses, forKey: .pauses)
        try container.encode(self.rateLimits, forKey: .rateLimits)
    }

    enum Keys: String, CodingKey { case pauses, rateLimits }
}

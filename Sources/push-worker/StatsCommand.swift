import ArgumentParser
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
            let stats = try await queue.stats()
            if json {
                printJSON(stats)
                return
            }
            let states = stats.byState
            print(
                "jobs          pending \(states["pending"] ?? 0) (due now \(stats.pendingDue))   running \(states["running"] ?? 0)   delivered \(states["delivered"] ?? 0)"
            )
            print("oldest due    \(stats.pendingDue == 0 ? "-" : formatSeconds(stats.oldestPendingAgeSeconds))")
            print("last minute   delivered \(stats.deliveredLastMinute)   dead-lettered \(stats.deadLastMinute)")
            print("dead letters  \(stats.deadLetters)")
            for (trap, count) in stats.deadByTrap.sorted(by: { ($0.value, $1.key) > ($1.value, $0.key) }) {
                print("  \(trap.padding(toLength: 6, withPad: " ", startingAt: 0)) \(count)")
            }
            print("invalid tokens \(stats.invalidTokens)")
        }
    }
}

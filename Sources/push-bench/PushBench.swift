import ArgumentParser
import Foundation
import PostgresNIO

/// Benchmarks, run on demand (never from `swift test`); each prints figures and ratios.
@main
struct PushBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push-bench",
        abstract: "PushWorker benchmarks. Build with -c release.",
        subcommands: [
            QueueBenchmark.self, ClaimBenchmark.self, ControlsBenchmark.self, TransportBenchmark.self,
            EndToEndBenchmark.self, ConsoleBenchmark.self, FleetBenchmark.self, TenantBenchmark.self,
            OutageBenchmark.self, RecipientBenchmark.self,
        ]
    )

    /// As ArgumentParser's, but a Postgres error shows what the server said (PSQLError's description hides it:
    /// the benchmarks run on throwaway clusters with made-up data, so there is nothing to leak).
    static func main() async {
        do {
            var command = try parseAsRoot()
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch let error as PSQLError {
            FileHandle.standardError.write(Data(("Error: " + String(reflecting: error) + "\n").utf8))
            Foundation.exit(1)
        } catch {
            exit(withError: error)
        }
    }
}

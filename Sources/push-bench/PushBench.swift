import ArgumentParser

/// Benchmarks, run on demand (never from `swift test`); each prints figures and ratios.
@main
struct PushBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push-bench",
        abstract: "PushWorker benchmarks. Build with -c release.",
        subcommands: [
            QueueBenchmark.self, ClaimBenchmark.self, ControlsBenchmark.self, TransportBenchmark.self,
            EndToEndBenchmark.self,
        ]
    )
}

import ArgumentParser
import Foundation
import PushWorker

struct HealthcheckCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "healthcheck",
        abstract: "Ask a running worker whether it is alive (/healthz) or ready (/readyz); exit 0 if so, 1 if not.",
        discussion: """
            For container health checks where the image has no curl, e.g. a Dockerfile's \
            HEALTHCHECK CMD ["push-worker", "healthcheck"]. Alive means the process serves HTTP; ready \
            means it reached Postgres recently and is not draining.
            """
    )

    @Option(help: "The worker's metrics and health address.") var host: String = "127.0.0.1"
    @Option(help: "The worker's --metrics-port.") var port: Int = 9464
    @Flag(help: "Check readiness (/readyz) rather than liveness (/healthz).") var ready = false
    @Option(help: ArgumentHelp("How long to wait for an answer.", valueName: "duration")) var timeout: HumanDuration =
        HumanDuration(argument: "3s")!

    func run() async throws {
        let path = self.ready ? "/readyz" : "/healthz"
        do {
            let (status, body) = try await HealthProbe.get(
                host: self.host,
                port: self.port,
                path: path,
                timeout: self.timeout.duration
            )
            let answer = body.trimmingCharacters(in: .whitespacesAndNewlines)
            if status == 200 {
                print("\(path): \(answer)")
                return
            }
            printError("\(path) answered \(status): \(answer)")
        } catch {
            printError("\(path): \(error)")
        }
        throw ExitCode(1)
    }
}

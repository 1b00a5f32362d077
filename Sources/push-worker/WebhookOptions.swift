import APNsTransport
import ArgumentParser
import NIOPosix
import PushWorker

/// `push-worker run`'s webhook settings (CONTRACT.md 1c).
struct WebhookOptions: ParsableArguments {
    @Flag(
        name: .customLong("webhooks-allow-private"),
        help: ArgumentHelp(
            "POST webhook deliveries to loopback and private addresses too (10/8, 172.16/12, 192.168/16, 127/8, link-local, fc00::/7). Off by default, so that a row in push.webhooks cannot make the worker call into its own network."
        )
    ) var allowPrivate = false
    @Option(
        name: .customLong("webhooks-ca-file"),
        help: ArgumentHelp(
            "A PEM file of extra certificate authorities to trust for https:// receivers (the system's stay trusted).",
            valueName: "pem"
        )
    ) var caFile: String?
    @Option(
        name: .customLong("webhooks-timeout"),
        help: ArgumentHelp(
            "One POST's deadline: connect, TLS, request and answer together. A receiver slower than this is tried again later.",
            valueName: "duration"
        )
    ) var timeout: HumanDuration = HumanDuration(argument: "10s")!
    @Option(
        name: .customLong("webhooks-per-hook"),
        help: "POSTs in flight per hook across the fleet: a slow receiver holds at most this many."
    ) var perHook: Int = 4
    @Option(
        name: .customLong("webhooks-concurrency"),
        help:
            "POSTs in flight on this worker, all hooks together (each holds a connection until its answer or deadline)."
    ) var concurrency: Int = 32

    func validate() throws {
        guard self.perHook >= 1 else { throw ValidationError("--webhooks-per-hook must be at least 1") }
        guard (1...1_024).contains(self.concurrency) else {
            throw ValidationError("--webhooks-concurrency must be between 1 and 1024")
        }
        guard self.timeout.duration >= .seconds(1), self.timeout.duration <= .seconds(120) else {
            throw ValidationError("--webhooks-timeout must be between 1s and 2m")
        }
    }

    var settings: WebhookSettings {
        var settings = WebhookSettings()
        settings.allowPrivate = self.allowPrivate
        settings.caFile = self.caFile
        settings.timeout = self.timeout.duration
        settings.perHook = self.perHook
        settings.concurrency = self.concurrency
        return settings
    }

    /// The client the sender POSTs with; through `proxy` (`--https-proxy`, `HTTPS_PROXY`) when one is set.
    func client(proxy: HTTPSProxy?) throws -> WebhookHTTPClient {
        do {
            return try WebhookHTTPClient(
                group: MultiThreadedEventLoopGroup.singleton,
                allowPrivate: self.allowPrivate,
                caFile: self.caFile,
                timeout: self.timeout.duration,
                proxy: proxy
            )
        } catch let failure as WebhookHTTPClient.Failure {
            throw ValidationError(failure.description)
        }
    }
}

import ArgumentParser
import Foundation
import NIOPosix
import PushCore
import PushTransport
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
    @OptionGroup var secrets: WebhookSecretsOption

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
        settings.secretsDirectory = self.secrets.directory
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
                proxy: proxy,
                clock: processClock
            )
        } catch let failure as WebhookHTTPClient.Failure {
            throw ValidationError(failure.description)
        }
    }
}

/// `--webhooks-secrets-dir`: the only directory hooks' secret files are read from, for `run` and for
/// `webhooks add` alike (the same option, the same environment variable, the same default).
struct WebhookSecretsOption: ParsableArguments {
    @Option(
        name: .customLong("webhooks-secrets-dir"),
        help: ArgumentHelp(
            "The directory hooks' secret files must be in (default \(WebhookPolicy.defaultSecretsDirectory), or PUSH_WEBHOOKS_SECRETS_DIR); give the workers and webhooks add the same. A row of push.webhooks naming a file elsewhere is never opened: the database cannot point the workers at other files.",
            valueName: "dir"
        )
    ) var option: String?

    /// `--webhooks-secrets-dir`, else `PUSH_WEBHOOKS_SECRETS_DIR`, else the default.
    var directory: String {
        self.option ?? ProcessInfo.processInfo.environment["PUSH_WEBHOOKS_SECRETS_DIR"]
            ?? WebhookPolicy.defaultSecretsDirectory
    }

    /// Refuses a directory that is not an absolute path without `.` or `..`.
    func validate() throws {
        guard WebhookPolicy.secretFileIsInside(self.directory + "/x", directory: self.directory) else {
            throw ValidationError(
                "--webhooks-secrets-dir \(self.directory): give an absolute path without . or .. (PUSH_WEBHOOKS_SECRETS_DIR likewise)"
            )
        }
    }
}

import Foundation
import Logging
import Metrics
import PushCore
import PushQueue
import PushTransport
import Synchronization

/// How the worker POSTs webhook deliveries (CONTRACT.md 1c).
public struct WebhookSettings: Sendable {
    /// Reach loopback and private addresses (`--webhooks-allow-private`).
    public var allowPrivate = false
    /// Extra roots to trust for `https://` receivers (`--webhooks-ca-file`).
    public var caFile: String?
    /// Connect, TLS, request and answer of one POST together (`--webhooks-timeout`).
    public var timeout: Duration = .seconds(10)
    /// POSTs in flight per hook, across the fleet: a slow receiver holds at most this many.
    public var perHook = 4
    /// POSTs in flight on this worker, all hooks together.
    public var concurrency = 32
    /// How long a delivery is retried before it is dead.
    public var retryWindow: Duration = WebhookPolicy.retryWindow
    /// How often an idle sender looks for due deliveries.
    public var pollInterval: Duration = .milliseconds(500)
    /// How long the claim and the record statements are waited for (the worker's statement deadline).
    public var statementDeadline: Duration = .seconds(30)
    /// The only directory hooks' secret files are read from (`--webhooks-secrets-dir`): a row of
    /// `push.webhooks` naming a file elsewhere is never opened.
    public var secretsDirectory = WebhookPolicy.defaultSecretsDirectory

    public init() {}

    /// How long a claim holds a delivery: past the POST's deadline, so a live worker never loses it, short
    /// enough that a killed worker's deliveries are sent again soon.
    var lease: Duration { self.timeout * 2 + .seconds(5) }

    /// The claim's and the record's deadline: the configured one, held so that a POST (at most `timeout`),
    /// the claim that may delay its record and the record itself all fit in the lease. A try recorded after
    /// its lease lapsed would be sent again by another worker.
    var boundedStatementDeadline: Duration {
        min(self.statementDeadline, (self.lease - self.timeout) / 2)
    }
}

/// Claims due deliveries, POSTs them signed, records each try. Runs beside the job claim loop on its own
/// task group: a slow or hanging receiver costs a POST slot until its deadline, never a job send.
final class WebhookSender: Sendable {
    let queue: JobQueue
    let client: WebhookHTTPClient
    let settings: WebhookSettings
    let workerID: String
    let logger: Logger
    let clock: any PushClock
    private let state = Mutex(State())
    private let wake = WakeSignal()
    let metrics: WorkerMetrics

    private struct State {
        var inFlight = 0
        var tries: [WebhookTry] = []
        var stopping = false
    }

    init(
        queue: JobQueue,
        client: WebhookHTTPClient,
        settings: WebhookSettings,
        workerID: String,
        logger: Logger,
        metrics: WorkerMetrics,
        clock: any PushClock
    ) {
        self.metrics = metrics
        self.queue = queue
        self.client = client
        self.settings = settings
        self.workerID = workerID
        self.logger = logger
        self.clock = clock
    }

    /// Stops claiming; ``run()`` returns once the POSTs in flight are answered (or time out) and recorded.
    func stop() {
        self.state.withLock { $0.stopping = true }
        self.wake.signal()
    }

    func run() async {
        do {
            let back = try await self.queue.reclaimWebhookDeliveries(ofPreviousLife: self.workerID)
            if back > 0 {
                self.logger.warning(
                    "took back the webhook deliveries an earlier process of this worker id left in flight; they are sent again with the same Push-Delivery-Id",
                    metadata: ["push.deliveries": "\(back)"]
                )
            }
        } catch {
            self.logger.warning(
                "could not take back earlier webhook deliveries; they come back when their lease lapses",
                metadata: ["push.error": "\(QueueError.summary(of: error))"]
            )
        }
        await self.reportHooksOutsideTheSecretsDirectory()
        await withDiscardingTaskGroup { posts in
            while true {
                await self.flush()
                let (stopping, room) = self.state.withLock { ($0.stopping, self.settings.concurrency - $0.inFlight) }
                if stopping { break }
                var claimed: [WebhookDelivery] = []
                if room > 0 {
                    do {
                        let (queue, workerID, settings) = (self.queue, self.workerID, self.settings)
                        claimed = try await withDeadline(settings.boundedStatementDeadline, "the webhook claim") {
                            try await queue.claimWebhookDeliveries(
                                workerID: workerID,
                                perHook: settings.perHook,
                                limit: room,
                                lease: settings.lease,
                                statementTimeout: settings.boundedStatementDeadline
                            )
                        }
                    } catch {
                        self.logger.warning(
                            "could not claim webhook deliveries; will retry",
                            metadata: ["push.error": "\(QueueError.summary(of: error))"]
                        )
                    }
                }
                self.state.withLock { $0.inFlight += claimed.count }
                for delivery in claimed {
                    posts.addTask { await self.post(delivery) }
                }
                // A full claim: look again at once (after the tries so far are written); else wait for a POST
                // to finish or the poll interval.
                if claimed.count < room || room == 0 {
                    _ = await self.wake.wait(timeout: self.settings.pollInterval, clock: self.clock)
                }
            }
            // Stopping: the POSTs in flight finish (each within its deadline) and their tries are written.
            while self.state.withLock({ $0.inFlight }) > 0 {
                _ = await self.wake.wait(timeout: .milliseconds(100), clock: self.clock)
            }
        }
        // The last tries, a few times over while Postgres is briefly away; what is still unwritten after that
        // is sent again (same Push-Delivery-Id) when its lease lapses.
        for _ in 0..<5 {
            await self.flush()
            if self.state.withLock({ $0.tries.isEmpty }) { break }
            _ = await self.wake.wait(timeout: .seconds(1), clock: self.clock)
        }
    }

    /// Writes the tries answered since the last flush, in one statement; kept for the next flush on failure.
    private func flush() async {
        let tries = self.state.withLock { state -> [WebhookTry] in
            defer { state.tries.removeAll() }
            return state.tries
        }
        guard !tries.isEmpty else { return }
        do {
            let (queue, workerID, settings) = (self.queue, self.workerID, self.settings)
            let result = try await withDeadline(settings.boundedStatementDeadline, "the webhook record") {
                try await queue.recordWebhookTries(tries, workerID: workerID, retryWindow: settings.retryWindow)
            }
            for attempt in tries { self.metrics.webhookTries[attempt.kind]?.increment() }
            if result.dead > 0 {
                self.metrics.webhookDead.increment(by: result.dead)
                self.logger.error(
                    "webhook deliveries failed for 24 hours and are dead; `push-worker webhooks show ID` lists them, `webhooks replay` sends them again",
                    metadata: ["push.deliveries": "\(result.dead)"]
                )
            }
            for hook in result.disabledHooks {
                self.logger.error(
                    "a webhook's receiver answered 410 Gone: the hook is disabled; `push-worker webhooks replay --hook \(hook)` enables it again",
                    metadata: ["push.webhook": "\(hook)"]
                )
            }
        } catch {
            self.logger.warning(
                "could not record webhook tries; will retry (a lapsed lease sends them again, same delivery id)",
                metadata: ["push.error": "\(QueueError.summary(of: error))"]
            )
            self.state.withLock { $0.tries.append(contentsOf: tries) }
        }
    }

    /// One POST, its verdict queued for the next flush.
    private func post(_ delivery: WebhookDelivery) async {
        let attempt = await self.attempt(delivery)
        self.state.withLock { state in
            state.tries.append(attempt)
            state.inFlight -= 1
        }
        if attempt.kind != .delivered {
            self.logger.info(
                "webhook delivery not accepted",
                metadata: [
                    "push.webhook": "\(delivery.webhookID)", "push.delivery": "\(delivery.id)",
                    "push.attempt": "\(delivery.attempt)", "push.error": "\(attempt.error ?? "-")",
                ]
            )
        }
        self.wake.signal()
    }

    /// One log line per hook whose secret file the worker will not open (an upgrade from before the secrets
    /// directory, or a row written by hand), with the fix, so nobody learns of it from failing deliveries.
    private func reportHooksOutsideTheSecretsDirectory() async {
        let directory = self.settings.secretsDirectory
        guard let hooks = try? await self.queue.operations.webhooks() else { return }
        for hook in hooks where !WebhookPolicy.secretFileIsInside(hook.secretFile, directory: directory) {
            self.logger.error(
                "webhook \(hook.id)'s secret file \(HumanText.escaped(hook.secretFile, for: .logLine)) is outside the webhook secrets directory \(directory): its deliveries are not signed or sent. Move the file into \(directory) and point the hook at it (UPDATE push.webhooks SET secret_file = '\(directory)/NAME' WHERE id = \(hook.id)), or start the workers with --webhooks-secrets-dir naming a directory that holds only hook secrets",
                metadata: ["push.webhook": "\(hook.id)"]
            )
        }
    }

    private func attempt(_ delivery: WebhookDelivery) async -> WebhookTry {
        func retry(_ status: Int?, _ error: String, after: Duration? = nil) -> WebhookTry {
            WebhookTry(
                id: delivery.id,
                attempt: delivery.attempt,
                kind: .retry,
                status: status,
                error: error,
                retryAfter: WebhookPolicy.retryWait(
                    attempt: delivery.attempt,
                    age: delivery.age,
                    retryAfter: after,
                    jitter: Double.random(in: 0..<1)
                )
            )
        }
        // Any row of push.webhooks can name any path: the delivery's error says the same whatever is wrong (no
        // existence or mode oracle for files the worker can see); the worker's own log says what.
        let unusable =
            "the secret file \(delivery.secretFile) cannot be used: it must be a regular, non-empty file of at most 4 KB, owned by the worker's user and readable by it alone (chmod 600); the worker's log says which of these fails"
        let directory = self.settings.secretsDirectory
        guard WebhookPolicy.secretFileIsInside(delivery.secretFile, directory: directory) else {
            return retry(
                nil,
                "the secret file \(delivery.secretFile) is outside the webhook secrets directory \(directory), so the worker does not read it: move the file into \(directory) and point the hook at it (UPDATE push.webhooks SET secret_file = …), or start the workers with --webhooks-secrets-dir naming a directory that holds only hook secrets"
            )
        }
        let secret: Data
        switch SecretFile.read(delivery.secretFile, policy: .privateKey, maxBytes: 4_096, inside: directory) {
        case .success(let bytes): secret = Data(bytes)
        case .failure(let failure):
            self.logger.warning(
                "webhook secret file \(HumanText.escaped(delivery.secretFile, for: .logLine)) \(failure.sentence)",
                metadata: ["push.webhook": "\(delivery.webhookID)"]
            )
            return retry(nil, unusable)
        }
        let body = Array(delivery.body.utf8)
        let timestamp = Int64(self.clock.wallNow.timeIntervalSince1970)
        guard let signature = WebhookSignature.value(body: body, timestamp: timestamp, secretFileContent: secret) else {
            self.logger.warning(
                "webhook secret file \(HumanText.escaped(delivery.secretFile, for: .logLine)) is empty",
                metadata: ["push.webhook": "\(delivery.webhookID)"]
            )
            return retry(nil, unusable)
        }
        let headers = [
            (WebhookSignature.header, signature),
            ("Push-Delivery-Id", "\(delivery.id)"),
            ("Push-Event", delivery.event),
            ("Push-Attempt", "\(delivery.attempt)"),
            ("User-Agent", "push-worker"),
        ]
        do {
            let answer = try await self.client.post(url: delivery.url, headers: headers, body: body)
            switch WebhookPolicy.verdict(
                status: answer.status,
                attempt: delivery.attempt,
                age: delivery.age,
                retryAfter: nil,
                jitter: 0
            ) {
            case .delivered:
                return WebhookTry(
                    id: delivery.id,
                    attempt: delivery.attempt,
                    kind: .delivered,
                    status: answer.status,
                    error: nil
                )
            case .gone:
                return WebhookTry(
                    id: delivery.id,
                    attempt: delivery.attempt,
                    kind: .gone,
                    status: 410,
                    error: "the receiver answered 410 Gone: the hook is disabled"
                )
            case .retry:
                let what: String
                if (300..<400).contains(answer.status) {
                    what =
                        "the receiver answered \(answer.status), a redirect\(answer.location.map { " to \(WebhookSender.redact($0))" } ?? ""): redirects are not followed; point the hook at the final URL"
                } else {
                    let excerpt = answer.bodyPrefix.trimmingCharacters(in: .whitespaces)
                    what = "the receiver answered \(answer.status)\(excerpt.isEmpty ? "" : ": \(excerpt.prefix(200))")"
                }
                return retry(answer.status, what, after: RetryAfter.parse(answer.retryAfter, now: self.clock.wallNow))
            }
        } catch {
            return retry(nil, error.description)
        }
    }

    /// A URL without its query (a receiver's token may be there).
    static func redact(_ url: String) -> String {
        String(url.split(separator: "?", maxSplits: 1).first ?? "")
    }
}

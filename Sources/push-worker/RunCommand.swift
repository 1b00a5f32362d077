import APNsSimulator
import ArgumentParser
import Foundation
import Logging
import Metrics
import PostgresNIO
import Prometheus
import PushCore
import PushQueue
import PushTransport
import PushWorker
import ServiceLifecycle
import Synchronization
import UnixSignals

struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "The daemon: claim jobs, send them to APNs, record the outcomes; until SIGTERM/SIGINT, then drain.",
        discussion: """
            With no database configured it starts the embedded Postgres, and with no APNs key configured it then \
            sends to the built-in APNs simulator and says so. Against a real database (DATABASE_URL) a missing \
            key is an error, unless --simulator asks for the built-in simulator on purpose: jobs "delivered" \
            there never reach a device and cannot be replayed. It applies the push schema migrations first. A first \
            SIGTERM/SIGINT stops claiming, lets in-flight sends finish (--shutdown-grace) and flushes outcomes; \
            a second exits at once (the reaper returns unfinished jobs, same apns-id).
            """
    )

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var apns: APNsOptions
    @OptionGroup(title: "Webhooks") var webhooks: WebhookOptions
    @OptionGroup(title: "Traces") var traces: TraceOptions

    @Flag(
        name: .customLong("no-session-settings"),
        help:
            "Do not send enable_seqscan=off, jit=off and plan_cache_mode=force_generic_plan when connecting (PgBouncer refuses unknown startup parameters), and use no named prepared statements (transaction pooling loses them); set the first two on the worker's role instead: ALTER ROLE push_worker SET enable_seqscan = off; ALTER ROLE push_worker SET jit = off."
    ) var noSessionSettings = false

    @Flag(
        help:
            "Send to the built-in APNs simulator even though DATABASE_URL names a real database (staging, load tests). Without a key and without this flag, only the embedded database gets the simulator."
    ) var simulator = false

    @Option(name: .customLong("worker-id"), help: "This worker's name in locked_by (default: host-pid).") var workerID:
        String?
    @Option(help: "Sends in flight at most.") var concurrency: Int = 500
    @Option(name: .customLong("batch-size"), help: "Jobs per claim at most.") var batchSize: Int = 250
    @Option(
        help: ArgumentHelp(
            "Claim lease (e.g. 60s), extended every 2 s heartbeat while the worker holds the job. A job comes back when its worker's heartbeat is 6 s stale and Postgres holds no session of it (it died), whatever the lease; see --frozen-worker-wait.",
            valueName: "duration"
        )
    ) var lease: HumanDuration = HumanDuration(argument: "60s")!
    @Option(name: .customLong("poll-interval-ms"), help: "Polling fallback when no NOTIFY arrives.") var pollIntervalMs:
        Int = 1000
    @Option(help: ArgumentHelp("Delete delivered jobs this long after delivery (e.g. 7d).", valueName: "duration"))
    var retention: HumanDuration = HumanDuration(argument: "7d")!
    @Option(
        name: .customLong("apns-id-memory"),
        help: ArgumentHelp(
            "How long an apns_id stays spent after its job was enqueued, once no job or dead letter holds it (push.apns_ids): an INSERT reusing it is skipped, as ON CONFLICT would. Longer than any producer retries an enqueue.",
            valueName: "duration"
        )
    ) var apnsIDMemory: HumanDuration = HumanDuration(argument: "30d")!
    @Option(name: .customLong("max-retries"), help: "Retries after the first attempt (priority 10: at most 2).")
    var maxRetries: Int = 3
    @Option(name: .customLong("base-delay-ms"), help: "First retry backoff (priority 10: doubled).") var baseDelayMs:
        Int = 100
    @Option(name: .customLong("max-delay-ms"), help: "Backoff cap before jitter (priority 10: doubled).")
    var maxDelayMs: Int = 5000
    @Flag(name: .customLong("no-jitter"), help: "Turn off backoff jitter.") var noJitter = false
    @Option(help: "HTTP/2 connections per (environment, credential).") var connections: Int = 2
    @Option(name: .customLong("request-timeout-ms"), help: "Deadline of one APNs request.") var requestTimeoutMs: Int =
        10_000
    @Option(
        name: .customLong("metrics-port"),
        help: "Port of /metrics (Prometheus), /healthz and /readyz; 0 picks a free one."
    ) var metricsPort: Int = 9464
    @Option(
        name: .customLong("metrics-host"),
        help:
            "Address the metrics and health endpoints listen on. The default answers this machine only; containers pass 0.0.0.0 so probes and Prometheus reach it."
    )
    var metricsHost: String = "127.0.0.1"
    @Flag(name: .customLong("no-metrics"), help: "Do not serve /metrics, /healthz and /readyz.") var noMetrics = false
    @Option(
        help: ArgumentHelp(
            "apply: migrate the schema at start (under a lock). check: refuse to start unless a deploy step ran push-worker migrate.",
            valueName: "apply|check"
        )
    )
    var migrations: MigrationMode = .apply
    @Option(
        name: .customLong("shutdown-grace"),
        help: ArgumentHelp("How long in-flight sends may finish after SIGTERM.", valueName: "duration")
    ) var shutdownGrace: HumanDuration = HumanDuration(argument: "20s")!

    @Option(
        name: .customLong("frozen-worker-wait"),
        help: ArgumentHelp(
            "How long a worker whose heartbeat stopped but whose Postgres sessions are still open (frozen: SIGSTOP, a VM pause, a throttled container; or cut off) keeps its jobs before another worker sends them again. It may still read APNs' answers to what it sent: sending earlier would deliver twice. A worker that died closes its sessions and is recovered within seconds. Behind PgBouncer (--no-session-settings) sessions cannot be told apart and a stale heartbeat alone counts.",
            valueName: "duration"
        )
    ) var frozenWorkerWait: HumanDuration = HumanDuration(argument: "2m")!
    @Option(
        name: .customLong("credential-wait"),
        help: ArgumentHelp(
            "How long a job whose credential no running worker has a key for waits before it is dead-lettered (MS028).",
            valueName: "duration"
        )
    ) var credentialWait: HumanDuration = HumanDuration(argument: "10m")!
    @Option(
        name: .customLong("credential-pause"),
        help: ArgumentHelp(
            "How long a credential APNs refused (InvalidProviderToken, Forbidden, …) is paused before its jobs are tried again; doubles while it keeps being refused, up to 10m.",
            valueName: "duration"
        )
    ) var credentialPause: HumanDuration = HumanDuration(argument: "30s")!
    @Option(
        name: .customLong("transport-budget"),
        help:
            "Unknown outcomes (connection lost mid-request, stream reset, deadline) a job may have before it is dead-lettered; they never use the job's attempts."
    ) var transportBudget: Int = 10

    func validate() throws {
        guard self.transportBudget >= 0 else { throw ValidationError("--transport-budget must be 0 or more") }
        guard self.concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1") }
        guard self.batchSize >= 1 else { throw ValidationError("--batch-size must be at least 1") }
        guard self.connections >= 1 else { throw ValidationError("--connections must be at least 1") }
        guard self.lease.seconds * 1000 > self.requestTimeoutMs else {
            throw ValidationError(
                "--lease (\(self.lease.seconds)s) must be longer than --request-timeout-ms (\(self.requestTimeoutMs) ms), or live sends would be reclaimed"
            )
        }
    }

    func run() async throws {
        let logger = try self.database.makeLoggerDefaultingTo(.info)
        // Decide key or simulator before touching any database. Without a key, the built-in simulator
        // serves only the embedded database, or whoever asks for it: never silently a real database's jobs.
        let useKey = try self.apns.hasKey && !self.simulator
        guard try useKey || self.simulator || self.database.isEmbedded else {
            throw CLIError(
                "no APNs key configured and DATABASE_URL names a real database: its jobs would be marked delivered by the built-in simulator and never reach a device. Set APNS_KEY_PATH, APNS_KEY_ID and APNS_TEAM_ID (or --config with credentials), or pass --simulator to send to the simulator on purpose."
            )
        }
        let (configured, startedCluster) = try self.database.resolveStartingCluster(logger: logger)
        defer { startedCluster?.stop() }
        // A multi-host URL: the first host that suits target_session_attrs (a read-only standby is skipped). A
        // restart in the middle of a failover (the old primary gone, the standby not yet promoted) waits for it.
        let url = try await DatabaseProbe(configured, logger: logger, clock: processClock).primary(
            patience: configured.hosts.count > 1 ? Self.primarySearch : .zero
        )
        if configured.hosts.count > 1 {
            logger.notice("database host chosen", metadata: ["push.database": "\(url.host):\(url.port)"])
        }
        try await DatabaseProbe(url, logger: logger, clock: processClock).connects()
        if useKey {
            try await self.serve(url: url, hosts: configured, logger: logger) { store in
                (
                    try self.makeClient(logger: logger, simulator: nil, tokenStore: store),
                    try self.apns.makeFCMClient(logger: logger, base: self.fcmConfiguration, tokenStore: store)
                )
            }
            return
        }
        // The built-in simulator, in this process, with a throwaway key.
        let stateDirectory = URL(fileURLWithPath: self.database.dataDirectory).deletingLastPathComponent()
            .appendingPathComponent("simulator").standardizedFileURL.path
        let credentials = try SimulatorCredentials.generate(in: stateDirectory)
        // Android too: a throwaway service account whose token endpoint is the simulator's.
        let account = try SimulatorFCMAccount.make()
        var simulatorConfiguration = APNsSimulator.Configuration(
            keys: [credentials.keyID: credentials.trustedKey],
            recordRequests: false
        )
        simulatorConfiguration.fcmAccounts = account.trusted
        let simulator = try APNsSimulator(configuration: simulatorConfiguration, logger: logger)
        let caPath = try simulator.writeCACertificate(to: (stateDirectory as NSString).appendingPathComponent("ca.pem"))
        try await simulator.run { simulator in
            printError(
                "no APNs key configured (APNS_KEY_PATH, APNS_KEY_ID, APNS_TEAM_ID): sending to the built-in APNs simulator at \(simulator.endpointURL), which answers FCM too (Android jobs, credential default); nothing reaches Apple or Google"
            )
            let key = try SigningKey.load(
                teamID: credentials.teamID,
                keyID: credentials.keyID,
                path: credentials.keyPath
            )
            let accountPath = try account.write(in: stateDirectory, host: "localhost", port: simulator.port)
            try await self.serve(url: url, hosts: configured, logger: logger) { _ in
                // The throwaway keys are new each run: a token shared from an earlier run would not verify.
                var fcm = self.fcmConfiguration
                fcm.endpointOverride = PushEndpoint(host: "localhost", port: simulator.port)
                fcm.caFile = caPath
                return (
                    try self.makeClient(
                        logger: logger,
                        simulator: (APNsEndpoint(host: "localhost", port: simulator.port), caPath, key),
                        tokenStore: nil
                    ),
                    try FCMClient(
                        configuration: fcm,
                        accounts: ["default": try ServiceAccount.load(path: accountPath)],
                        logger: logger
                    )
                )
            }
        }
    }

    /// `url` is the host chosen; `hosts` the URL as configured (every host), to notice a standby promoted.
    func serve(
        url: DatabaseURL,
        hosts: DatabaseURL,
        logger: Logger,
        makeClient: (any ProviderTokenStore) throws -> (APNsClient, FCMClient?)
    ) async throws {
        let workerID = self.workerID ?? "\(ProcessInfo.processInfo.hostName)-\(getpid())"
        let parameters =
            self.noSessionSettings
            ? []
            : JobQueue.workerSessionSettings(
                statementTimeout: WorkerConfiguration.statementDeadline(lease: self.lease.duration)
            )
                + [("application_name", JobQueue.applicationName(of: workerID))]
        // application_name: the reaper tells a frozen worker (sessions open) from a dead one (none).
        if !parameters.isEmpty {
            try await DatabaseProbe(url, logger: logger, clock: processClock).acceptsSessionSettings(parameters)
        }
        // The pool warns once if a query is queued before its run() is scheduled (harmless); query
        // failures are logged by the worker with the database's own message, so keep the pool's
        // background logger at error unless debugging.
        var poolLogger = logger
        if poolLogger.logLevel > .debug { poolLogger.logLevel = max(poolLogger.logLevel, .error) }
        let noSessionSettings = self.noSessionSettings
        // The pool and the LISTEN connection to one host; built again for the host a failover moves to.
        let connect: @Sendable (DatabaseURL) throws -> (PostgresClient, PostgresConnection.Configuration) = {
            [poolLogger] url in
            var postgres = url.clientConfiguration
            postgres.options.maximumConnections = 8
            postgres.options.additionalStartupParameters = parameters
            var listener = try url.connectionConfiguration()
            if !noSessionSettings {
                listener.options.additionalStartupParameters = [
                    ("application_name", JobQueue.applicationName(of: workerID))
                ]
            }
            return (PostgresClient(configuration: postgres, backgroundLogger: poolLogger), listener)
        }
        let (firstClient, firstListener) = try connect(url)
        let primary = PrimaryClient(firstClient, listener: firstListener, host: "\(url.host):\(url.port)")
        let client = firstClient
        var configuration = WorkerConfiguration(
            workerID: workerID,
            concurrency: self.concurrency,
            batchSize: self.batchSize,
            lease: self.lease.duration,
            pollInterval: .milliseconds(self.pollIntervalMs),
            retention: self.retention.duration,
            retry: .init(
                maxRetries: self.maxRetries,
                baseDelay: .milliseconds(self.baseDelayMs),
                maxDelay: .milliseconds(self.maxDelayMs),
                jitter: !self.noJitter
            ),
            shutdownGrace: self.shutdownGrace.duration
        )
        configuration.credentialWait = self.credentialWait.duration
        self.watchPrimary(&configuration, primary: primary, hosts: hosts, connect: connect, logger: logger)
        // A second live process under this worker id would take the first one's jobs back: refuse to start
        // (EX_CONFIG), naming the fix.
        configuration.onWorkerIDInUse = { sentence in
            logger.critical("\(sentence); exiting with status 78")
            Foundation.exit(78)
        }
        configuration.frozenAfter = self.frozenWorkerWait.duration
        configuration.sessionTracked = !self.noSessionSettings && workerID.allSatisfy(\.isASCII)
        configuration.apnsIDMemory = self.apnsIDMemory.duration
        configuration.credentialPause = self.credentialPause.duration
        configuration.transportBudget = self.transportBudget
        configuration.webhooks = self.webhooks.settings
        configuration.webhooks.statementDeadline = configuration.statementDeadline
        let listener = JobNotificationListener(primary: primary, logger: logger, clock: processClock)
        let notifier = ServiceManagerNotifier()
        // Bootstrap metrics before anything creates a metric handler (handlers made earlier stay no-ops).
        let registry: PrometheusCollectorRegistry? = self.noMetrics ? nil : PrometheusCollectorRegistry()
        if let registry {
            var factory = PrometheusMetricsFactory(registry: registry)
            factory.durationHistogramBuckets[WorkerMetrics.claimDurationLabel] = WorkerMetrics.claimDurationBuckets
            MetricsSystem.bootstrap(factory)
        }
        // One provider token per key for the whole fleet, shared through Postgres.
        let (apnsClient, fcmClient) = try makeClient(ProviderTokenTable(primary: primary, logger: logger))
        configuration.credentials = (apnsClient.credentialNames + (fcmClient?.credentialNames ?? [])).sorted()
        let traceBackend = try self.traces.backend(serviceName: "push-worker", logger: logger)
        let service = PushWorkerService(
            configuration: configuration,
            queue: JobQueue(
                primary: primary,
                logger: logger,
                clock: processClock,
                preparedStatements: !self.noSessionSettings
            ),
            client: apnsClient,
            fcm: fcmClient,
            webhooks: try self.webhooks.client(proxy: try self.apns.proxy()),
            tracing: traceBackend?.tracing,
            listener: listener,
            clock: processClock,
            logger: logger
        )
        let migrations = self.migrations
        let daemon = WorkerDaemon(
            service: service,
            apnsClient: apnsClient,
            fcmClient: fcmClient,
            notifier: notifier,
            logger: logger,
            workerID: workerID,
            banner: "push-worker \(workerID) running against \(url) (Ctrl-C to stop)"
        ) {
            notifier.notify("STATUS=checking the push schema")
            switch migrations {
            case .apply: try await Migrator(client: client, logger: logger, clock: processClock).migrate()
            case .check: try await Migrator(client: client, logger: logger, clock: processClock).requireCurrent()
            }
            // What the server promises for committed jobs and outcomes if it fails over.
            let durability = try await JobQueue(client: client, logger: logger, clock: processClock).durability()
            logger.notice("durability: \(durability)")
        }
        // Every long-lived part is a service in one group: SIGTERM/SIGINT drains them in reverse order
        // (the worker first, Postgres last), bounded by one duration; a second signal exits at once.
        // Shut down last to first: the worker drains first, the health endpoint keeps answering through
        // the drain, Postgres closes after the last outcome is written, the watchdog pings to the end and
        // a second signal is heard until the very end.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: WatchdogService(notifier: notifier), serviceName: "watchdog"),
            .init(service: PrimaryClientService(primary: primary), serviceName: "postgres"),
        ]
        // The span exporter stops after the worker: the last attempts' spans are flushed.
        if let traceBackend {
            services.append(
                .init(service: traceBackend.service, failureTerminationBehavior: .ignore, serviceName: "otlp")
            )
        }
        if let registry {
            let health = HealthServer(
                host: self.metricsHost,
                port: self.metricsPort,
                isReady: { service.isReady },
                metrics: {
                    service.publishReadiness()
                    return registry.emitToBuffer()
                },
                logger: logger
            )
            let host = self.metricsHost
            services.append(
                .init(
                    service: health.service { port in
                        writeLine("metrics and health on http://\(host):\(port) (/metrics, /healthz, /readyz)")
                    },
                    failureTerminationBehavior: .ignore,
                    serviceName: "health"
                )
            )
        }
        services.append(
            .init(service: daemon, successTerminationBehavior: .gracefullyShutdownGroup, serviceName: "worker")
        )
        var groupLogger = logger
        if groupLogger.logLevel < .notice { groupLogger.logLevel = .notice }
        // The group traps no signal itself: one listener owns SIGTERM/SIGINT (two dispatch sources for
        // one signal undo each other's disposition), starts the drain on the first, exits on the second.
        var groupConfiguration = ServiceGroupConfiguration(services: services, logger: groupLogger)
        // The single drain bound: the worker's grace for sends, then as long again for the last outcomes.
        groupConfiguration.maximumGracefulShutdownDuration = self.shutdownGrace.duration * 2 + .seconds(10)
        let group = ServiceGroup(configuration: groupConfiguration)
        let signals = SignalHandling(logger: logger, notifier: notifier)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { await signals.run { await group.triggerGracefulShutdown() } }
            defer { tasks.cancelAll() }
            try await group.run()
        }
    }
}

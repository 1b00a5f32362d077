// swift-tools-version: 6.1
import PackageDescription

/// One settings list for every target (STYLE.md rule 11). In CI (`CI=true`, as `.ci/run` runs) a warning in
/// this package's code fails the build; dependencies keep their own warnings (SwiftPM silences them).
let swiftSettings: [SwiftSetting] =
    [
        .swiftLanguageMode(.v6),
        .enableUpcomingFeature("ExistentialAny"),
        .enableUpcomingFeature("InternalImportsByDefault"),
    ] + (Context.environment["CI"] == "true" ? [.unsafeFlags(["-warnings-as-errors"])] : [])

let package = Package(
    name: "PushWorker",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "push-worker", targets: ["push-worker"]),
        .library(name: "PushCore", targets: ["PushCore"]),
        .library(name: "PushQueue", targets: ["PushQueue"]),
        .library(name: "PushQueueTesting", targets: ["PushQueueTesting"]),
        .library(name: "PushProcess", targets: ["PushProcess"]),
        .library(name: "PushEmbeddedPostgres", targets: ["PushEmbeddedPostgres"]),
        .library(name: "PushTransport", targets: ["PushTransport"]),
        .library(name: "APNsSimulator", targets: ["APNsSimulator"]),
        .library(name: "PushWorker", targets: ["PushWorker"]),
        .library(name: "PushConsole", targets: ["PushConsole"]),
    ],
    dependencies: [
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/swift-mustache.git", from: "2.1.1"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        // OTLP over HTTP only (no gRPC stack): traces go out when `run --otlp-endpoint` is set.
        .package(url: "https://github.com/swift-otel/swift-otel.git", from: "1.6.0", traits: ["OTLPHTTP"]),
    ],
    targets: [
        .target(
            name: "PushCore",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushQueue",
            dependencies: [
                "PushCore",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            resources: [
                .embedInCode("Statements/claim.sql"),
                .embedInCode("Statements/write_outcomes.sql"),
                .embedInCode("Statements/pending_credentials.sql"),
                .embedInCode("Statements/job_columns.sql"),
                .embedInCode("Statements/outcome_input_rows.sql"),
                .embedInCode("Statements/dead_letter_columns.sql"),
                .embedInCode("Statements/dead_conflict.sql"),
                .embedInCode("Statements/webhook_delivery_body.sql"),
                .embedInCode("Statements/back_to_pending.sql"),
                .embedInCode("Statements/workers.sql"),
                .embedInCode("Statements/session.sql"),
                .embedInCode("Statements/devices.sql"),
                .embedInCode("Statements/dead_letter_filter.sql"),
                .embedInCode("Statements/dead_letter_replay_candidate.sql"),
                .embedInCode("Statements/dead_letter_replay_rank.sql"),
                .embedInCode("Migrations/0001_schema.sql"),
                .embedInCode("Migrations/0002_provider_tokens.sql"),
                .embedInCode("Migrations/0003_failure_paths.sql"),
                .embedInCode("Migrations/0004_hostile_input.sql"),
                .embedInCode("Migrations/0005_deliver_once.sql"),
                .embedInCode("Migrations/0006_flow_control.sql"),
                .embedInCode("Migrations/0007_cheaper_checks.sql"),
                .embedInCode("Migrations/0008_fleet.sql"),
                .embedInCode("Migrations/0009_operator_truth.sql"),
                .embedInCode("Migrations/0010_fcm.sql"),
                .embedInCode("Migrations/0011_webhooks.sql"),
                .embedInCode("Migrations/0012_traces.sql"),
                .embedInCode("Migrations/0013_many_tenants.sql"),
                .embedInCode("Migrations/0014_neighbours.sql"),
                .embedInCode("Migrations/0015_token_expiry.sql"),
                .embedInCode("Migrations/0016_rate_formula.sql"),
                .embedInCode("Migrations/0017_devices.sql"),
                .embedInCode("Migrations/0018_recipients.sql"),
                .embedInCode("Migrations/0019_activities.sql"),
                .embedInCode("Statements/controls.sql"),
                .embedInCode("Statements/available_now.sql"),
                .embedInCode("Statements/jobs.sql"),
                .embedInCode("Statements/webhooks.sql"),
                .embedInCode("Statements/dead_jobs.sql"),
                .embedInCode("Statements/migrations.sql"),
                .embedInCode("Statements/provider_tokens.sql"),
                .embedInCode("Statements/token_replaceable.sql"),
                .embedInCode("Statements/earliest_pending_run_at.sql"),
                .embedInCode("Statements/shown_history.sql"),
                .embedInCode("Statements/activities.sql"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushProcess",
            dependencies: ["PushCore"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushEmbeddedPostgres",
            dependencies: [
                "PushQueue",
                "PushProcess",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushTransport",
            dependencies: [
                "PushCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "APNsSimulator",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushWorker",
            dependencies: [
                "PushCore",
                "PushQueue",
                "PushTransport",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushConsole",
            dependencies: [
                "PushCore",
                "PushQueue",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Mustache", package: "swift-mustache"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            resources: [
                .embedInCode("Templates/layout.mustache"),
                .embedInCode("Templates/overview.mustache"),
                .embedInCode("Templates/dead.mustache"),
                .embedInCode("Templates/letter.mustache"),
                .embedInCode("Templates/job.mustache"),
                .embedInCode("Templates/activity.mustache"),
                .embedInCode("Templates/replay.mustache"),
                .embedInCode("Templates/purge.mustache"),
                .embedInCode("Templates/login.mustache"),
                .embedInCode("Templates/message.mustache"),
                .embedInCode("Templates/describe.mustache"),
                .embedInCode("Templates/history.mustache"),
                .embedInCode("Templates/console.css"),
                .embedInCode("Templates/favicon.svg"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushClockTesting",
            dependencies: ["PushCore"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PushQueueTesting",
            dependencies: [
                "PushQueue",
                "PushEmbeddedPostgres",
                "PushProcess",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "push-worker",
            dependencies: [
                "PushWorker",
                "PushConsole",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                "PushCore",
                "PushQueue",
                "PushEmbeddedPostgres",
                "PushTransport",
                "APNsSimulator",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "OTel", package: "swift-otel"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "push-bench",
            dependencies: [
                "PushQueue",
                "PushQueueTesting",
                "PushConsole",
                "PushProcess",
                "PushEmbeddedPostgres",
                "PushCore",
                "PushTransport",
                "APNsSimulator",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "PushCoreTests",
            dependencies: ["PushCore"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "PushTransportTests",
            dependencies: [
                "PushCore",
                "PushProcess",
                "PushQueueTesting",
                "PushClockTesting",
                "PushTransport",
                "APNsSimulator",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "EndToEndTests",
            dependencies: [
                "push-worker",
                "PushCore",
                "PushQueue",
                "PushProcess",
                "PushEmbeddedPostgres",
                "PushQueueTesting",
                "APNsSimulator",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "PushWorkerTests",
            dependencies: [
                "PushWorker", "PushCore", "PushQueue", "PushQueueTesting", "PushClockTesting",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "ConsoleTests",
            dependencies: [
                "PushConsole",
                "PushCore",
                "PushQueue",
                "PushQueueTesting",
                "PushProcess",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "PushQueueTests",
            dependencies: [
                "PushCore",
                "PushQueue",
                "PushQueueTesting",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)

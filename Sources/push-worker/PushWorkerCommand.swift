import ArgumentParser

/// `push-worker`: the durable push worker (APNs and FCM) and its operator tools.
@main
struct PushWorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push-worker",
        abstract:
            "A durable push-notification worker for APNs and FCM: jobs in Postgres, sent over HTTP/2, outcomes written back.",
        discussion: """
            Producers enqueue with SQL:
              INSERT INTO push.jobs (topic, device_token, payload)
              VALUES ('com.example.app', '<hex token>', '{"aps":{"alert":"Hello"}}');
              INSERT INTO push.jobs (platform, topic, device_token, payload)
              VALUES ('fcm', 'com.example.app', '<registration token>', '{"notification":{"title":"Hi"}}');

            The database is DATABASE_URL (or --database-url). With neither, every verb uses an embedded \
            Postgres cluster in --data-dir (default .pushworker/postgres), started on first use. \
            Every listing takes --json for scripts.
            """,
        subcommands: [
            RunCommand.self,
            MigrateCommand.self,
            StatsCommand.self,
            JobsCommand.self,
            DeadCommand.self,
            DescribeCommand.self,
            ChannelsCommand.self,
            PauseCommand.self,
            ResumeCommand.self,
            PausesCommand.self,
            LimitsCommand.self,
            WebhooksCommand.self,
            DevicesCommand.self,
            ActivitiesCommand.self,
            ConsoleCommand.self,
            SimulatorCommand.self,
            HealthcheckCommand.self,
            CheckArgumentsCommand.self,
            CheckKeysCommand.self,
            PsqlCommand.self,
        ]
    )
}
